package drivesync

import (
	"strings"
	"testing"
)

func TestTwoDevicesBasic(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	b := newDevice(t, "dev-b", remote)
	a.put("n1", `{"title":"hello","display_order":3,"deleted_at":null}`)
	r := a.sync()
	if r.Uploaded == "" || r.ChangesSent != 1 {
		t.Fatalf("a: report %+v, want one change uploaded", r)
	}
	var steps []string
	b.eng.cfg.Progress = func(p Progress) {
		if p.Done == p.Total {
			steps = append(steps, p.Step)
		}
	}
	r = b.sync()
	if got, want := strings.Join(steps, ","), "list,download,apply"; got != want {
		t.Errorf("progress steps %s, want %s", got, want)
	}
	if len(r.Downloaded) != 1 || r.ChangesReceived != 1 {
		t.Fatalf("b: report %+v, want one file applied", r)
	}
	if got, want := b.get("n1"), `{"display_order":3,"title":"hello"}`; got != want {
		t.Fatalf("b sees %s, want %s", got, want)
	}
	var title string
	var order int
	if err := b.db.QueryRow(`SELECT title, display_order FROM notes WHERE id = 'n1'`).Scan(&title, &order); err != nil || title != "hello" || order != 3 {
		t.Fatalf("projection columns: %q %d %v", title, order, err)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
}

// TestTitleDescDevices is a worked example over three
// devices: Device 1 changes title, Device 2 changes desc and syncs first;
// diffing against the pre-download state keeps both edits.
func TestTitleDescDevices(t *testing.T) {
	remote := NewMemoryRemote()
	d1, d2, d3 := newDevice(t, "dev-1", remote), newDevice(t, "dev-2", remote), newDevice(t, "dev-3", remote)
	d1.put("r", `{"title":"A","desc":"A"}`)
	syncAll(t, d1, d2, d3)
	d1.put("r", `{"title":"B","desc":"A"}`)
	d2.put("r", `{"title":"A","desc":"B"}`)
	d2.sync()
	d1.sync()
	syncAll(t, d1, d2, d3)
	assertConverged(t, d1, d2, d3)
	if got, want := d3.get("r"), `{"desc":"B","title":"B"}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// TestNameDisplayOrder is the rename-versus-reorder example: A renames, B
// reorders (a projection column) and syncs first; A syncs later. Both
// changes survive on every device, and the column follows content.
func TestNameDisplayOrder(t *testing.T) {
	remote := NewMemoryRemote()
	a, b, c := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote), newDevice(t, "dev-c", remote)
	a.put("g", `{"parent_group_id":null,"name":"value","display_order":1,"group_type":"folder","updated_at":"2024-06-01T11:00:00Z","deleted_at":null}`)
	syncAll(t, a, b, c)
	a.put("g", `{"parent_group_id":null,"name":"valueA1","display_order":1,"group_type":"folder","updated_at":"2024-06-01T12:00:00Z","deleted_at":null}`)
	b.put("g", `{"parent_group_id":null,"name":"value","display_order":2,"group_type":"folder","updated_at":"2024-06-01T12:10:00Z","deleted_at":null}`)
	b.sync()
	a.sync()
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
	// A synced last, so its updated_at (an ordinary field both changed) wins.
	if got, want := c.get("g"), `{"display_order":2,"group_type":"folder","name":"valueA1","updated_at":"2024-06-01T12:00:00Z"}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	var order int
	c.db.QueryRow(`SELECT display_order FROM notes WHERE id = 'g'`).Scan(&order)
	if order != 2 {
		t.Fatalf("display_order column = %d, want 2", order)
	}
}

// TestDivergenceScenario: A and C both saw version 5 of R;
// A changes R.x at 7 (after another change at 6), C changes R.y at 6,
// neither sees the other before uploading. B applies A then C.
// Per-record versions would leave the devices disagreeing forever.
func TestDivergenceScenario(t *testing.T) {
	lag := &laggingRemote{Remote: NewMemoryRemote(), hidden: map[string][]string{}}
	a, b, c := newDevice(t, "dev-a", lag.as("a")), newDevice(t, "dev-b", lag.as("b")), newDevice(t, "dev-c", lag.as("c"))
	a.put("r", `{"x":0,"y":0}`)
	syncAll(t, a, b, c)
	lag.hide("a", "dev-c")
	lag.hide("c", "dev-a")
	lag.hide("b", "dev-c") // B sees A's file first
	a.put("q", `{"other":1}`)
	a.put("r", `{"x":1,"y":0}`)
	c.put("r", `{"x":0,"y":1}`)
	a.sync()
	c.sync()
	b.sync()
	lag.hide("a")
	lag.hide("b")
	lag.hide("c")
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
	if got, want := b.get("r"), `{"x":1,"y":1}`; got != want {
		t.Fatalf("got %s, want both edits %s", got, want)
	}
}

func TestDeletesAndRecreation(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("n1", `{"title":"one","deleted_at":null}`)
	a.put("n2", `{"title":"two"}`)
	syncAll(t, a, b)

	// A soft delete is an ordinary content change.
	b.put("n1", `{"title":"one","deleted_at":"2026-11-22T10:00:00Z"}`)
	// A physical delete removes the row everywhere.
	a.exec(`DELETE FROM notes WHERE id = 'n2'`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := a.get("n1"); got != `{"deleted_at":"2026-11-22T10:00:00Z","title":"one"}` {
		t.Fatalf("soft delete: got %s", got)
	}
	if got := b.get("n2"); got != "" {
		t.Fatalf("physical delete: b still has %s", got)
	}
	var deleted bool
	b.db.QueryRow(`SELECT is_deleted FROM sync_states WHERE record_id = 'n2'`).Scan(&deleted)
	if !deleted {
		t.Fatal("sync_states does not mark n2 deleted")
	}

	// Re-creating the id after the delete brings it back everywhere.
	b.put("n2", `{"title":"two again"}`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := a.get("n2"); got != `{"title":"two again"}` {
		t.Fatalf("re-created: got %s", got)
	}

	// Delete on one device, edit on the other at the same time: the edit
	// is newer (synced later), so the whole record comes back with the
	// edit on top, never a part of it.
	a.exec(`DELETE FROM notes WHERE id = 'n1'`)
	b.exec(`UPDATE notes SET content = jsonb_set(content, '$.title', 'edited') WHERE id = 'n1'`)
	a.sync()
	b.sync()
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := a.get("n1"); got != `{"deleted_at":"2026-11-22T10:00:00Z","title":"edited"}` {
		t.Fatalf("edit after delete: got %q, want the whole record with the edit", got)
	}

	// Insert then delete between syncs sends nothing.
	a.put("tmp", `{"x":1}`)
	a.exec(`DELETE FROM notes WHERE id = 'tmp'`)
	if r := a.sync(); r.Uploaded != "" {
		t.Fatalf("insert+delete uploaded %s", r.Uploaded)
	}
	if a.pendingCount() != 0 {
		t.Fatal("pending row left for an insert+delete")
	}
}

func TestExactNumbers(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	const content = `{"big":9007199254740993,"huge":123456789012345678901234567890,"neg":-9223372036854775808,"dec":0.1000000000000000055511151231257827,"exp":1e400}`
	a.put("n", content)
	syncAll(t, a, b)
	want := `{"big":9007199254740993,"dec":0.1000000000000000055511151231257827,"exp":1e400,"huge":123456789012345678901234567890,"neg":-9223372036854775808}`
	var synced string
	b.db.QueryRow(`SELECT record_data FROM sync_states WHERE record_id = 'n'`).Scan(&synced)
	if synced != want {
		t.Fatalf("sync_states: got %s, want %s", synced, want)
	}
	// 2^53+1 and 2^53 differ only beyond float64 precision: the change
	// must still be seen and sent.
	b.put("n", `{"big":9007199254740992,"huge":123456789012345678901234567890,"neg":-9223372036854775808,"dec":0.1000000000000000055511151231257827,"exp":1e400}`)
	if r := b.sync(); r.ChangesSent != 1 {
		t.Fatalf("a change beyond float64 precision was not sent: %+v", r)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	var big string
	a.db.QueryRow(`SELECT json_extract(record_data, '$.big') FROM sync_states WHERE record_id = 'n'`).Scan(&big)
	if big != "9007199254740992" {
		t.Fatalf("a: big = %s", big)
	}
}

func TestNullIsAbsent(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("n", `{"a":1,"b":null,"c":{"d":null,"e":[null]}}`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got, want := a.get("n"), `{"a":1,"c":{"e":[null]}}`; got != want {
		t.Fatalf("got %s, want null members dropped (kept inside arrays) %s", got, want)
	}
	// Setting a member to null removes it everywhere.
	b.put("n", `{"a":null,"c":{"e":[null]}}`)
	syncAll(t, a, b)
	if got := a.get("n"); got != `{"c":{"e":[null]}}` {
		t.Fatalf("got %s", got)
	}
}

func TestNestedDictionariesMerge(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("n", `{"tags":{}}`)
	syncAll(t, a, b)
	a.put("n", `{"tags":{"u1":{"name":"red"}}}`)
	b.put("n", `{"tags":{"u2":{"name":"blue"}}}`)
	a.sync()
	b.sync()
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got, want := a.get("n"), `{"tags":{"u1":{"name":"red"},"u2":{"name":"blue"}}}`; got != want {
		t.Fatalf("got %s, want both tags %s", got, want)
	}
}

// TestCaptureUnderConflictPolicies: the app's statements may carry any
// conflict policy; capture must neither fail nor miss a change.
func TestCaptureUnderConflictPolicies(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	for _, q := range []string{
		`INSERT INTO notes (id, content) VALUES ('a', jsonb('{"v":1}'))`,
		`UPDATE notes SET content = jsonb('{"v":2}')`,
		`INSERT OR REPLACE INTO notes (id, content) VALUES ('a', jsonb('{"v":3}'))`,
		`INSERT INTO notes (id, content) VALUES ('a', jsonb('{"v":4}')) ON CONFLICT (id) DO UPDATE SET content = excluded.content`,
		`INSERT OR ROLLBACK INTO notes (id, content) VALUES ('b', jsonb('{"v":1}'))`,
		`UPDATE OR ROLLBACK notes SET content = jsonb('{"v":5}') WHERE id = 'a'`,
		`UPDATE OR FAIL notes SET content = jsonb('{"v":6}') WHERE id = 'b'`,
		`REPLACE INTO notes (id, content) VALUES ('c', jsonb('{"v":1}'))`,
		`INSERT OR ABORT INTO notes (id, content) VALUES ('d', jsonb('{"v":1}'))`,
		`DELETE FROM notes WHERE id = 'd'`,
		`UPDATE notes SET id = 'e' WHERE id = 'c'`,
	} {
		a.exec(q)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	for id, want := range map[string]string{"a": `{"v":5}`, "b": `{"v":6}`, "c": "", "d": "", "e": `{"v":1}`} {
		if got := b.get(id); got != want {
			t.Errorf("%s = %q, want %q", id, got, want)
		}
	}
}
