package drivesync

import "testing"

const miscSchema = `CREATE TABLE IF NOT EXISTS misc (id TEXT PRIMARY KEY, content JSONB NOT NULL)`

// A table unregistered for a while and registered again first receives
// what other devices wrote meanwhile; only the rows the app changed while
// it was unregistered are sent, as their real edits. Before, every row
// was sent as a new edit, and the stale rows undid other devices' edits
// everywhere.
func TestReregisteredTableKeepsOthersEdits(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote, notesSchema, miscSchema)
	b := newDevice(t, "dev-b", remote)
	for _, id := range []string{"r1", "r2", "r3", "r4"} {
		a.put(id, `{"x":1,"y":1}`)
	}
	syncAll(t, a, b)

	a.cfg.Tables = []Table{{Name: "misc"}} // notes no longer synced
	a.open()
	b.exec(`UPDATE notes SET content = jsonb_set(content, '$.x', 2) WHERE id IN ('r1', 'r3')`)
	b.exec(`DELETE FROM notes WHERE id = 'r4'`)
	b.put("r5", `{"x":5}`)
	b.sync()
	a.sync() // into sync_states only: the app's rows stay as they were
	// The app edits its rows with no capture running.
	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.y', 7) WHERE id = 'r1'`)
	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.y', 5) WHERE id = 'r2'`)

	a.cfg.Tables = []Table{{Name: "notes"}, {Name: "misc"}}
	a.open()
	r := a.sync()
	if r.ChangesSent != 2 {
		t.Errorf("a sent %d changes, want its two edits only", r.ChangesSent)
	}
	b.sync()
	want := map[string]string{
		"r1": `{"x":2,"y":7}`, "r2": `{"x":1,"y":5}`, "r3": `{"x":2,"y":1}`, "r4": "", "r5": `{"x":5}`,
	}
	for _, d := range []*device{a, b} {
		for id, w := range want {
			if got := d.get(id); got != w {
				t.Errorf("%s: %s = %q, want %q", d.name, id, got, w)
			}
		}
	}
	assertConverged(t, a, b)
}

// syncedTables names exactly the tables whose capture triggers exist.
func TestSyncedTables(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote(), notesSchema, miscSchema)
	d.cfg.Tables = []Table{{Name: "notes"}, {Name: "misc"}}
	d.open()
	d.exec(`DELETE FROM sync_tables`) // as an older engine left it
	got, err := syncedTables(t.Context(), d.db)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got["notes"] || !got["misc"] {
		t.Fatalf("synced tables %v, want notes and misc", got)
	}
}

// A record the app created and deleted before it ever synced, whose table
// is then unregistered, holds nothing to send: its pending entry must not
// turn, once the table is registered again, into a delete of another
// device's creation of the same id received meanwhile, which the app
// never saw.
func TestReregisteredPendingDeleteKeepsUnseenCreate(t *testing.T) {
	a, b := createdWhileUnregistered(t)
	a.sync()
	b.sync()
	for _, d := range []*device{a, b} {
		if got := d.get("r0"); got != `{"x":2}` {
			t.Errorf("%s: r0 = %q, want b's creation", d.name, got)
		}
	}
	assertConverged(t, a, b)
}

// createdWhileUnregistered: a creates and deletes r0 before it ever
// synced and unregisters notes; b creates r0, which a receives while
// unregistered; a registers notes again (not synced since).
func createdWhileUnregistered(t *testing.T) (a, b *device) {
	remote := NewMemoryRemote()
	a = newDevice(t, "dev-a", remote, notesSchema, miscSchema)
	b = newDevice(t, "dev-b", remote)
	syncAll(t, a, b)
	a.put("r0", `{"x":1}`)
	a.exec(`DELETE FROM notes WHERE id = 'r0'`)

	a.cfg.Tables = []Table{{Name: "misc"}}
	a.open()
	a.sync()
	b.put("r0", `{"x":2}`)
	b.sync()
	a.sync()

	a.cfg.Tables = []Table{{Name: "notes"}, {Name: "misc"}}
	a.open()
	return a, b
}

// TestReregisteredPendingDeleteKeepsUnseenCreate, but the app writes
// something unrelated (a table drivesync does not sync) while each sync
// after re-registering runs. The record planned with no row and no edit
// still has no row: it is written all the same. Before, the dirty path
// compared the absent row with the synced state, took the mismatch for an
// app edit made during the sync, and kept the record pending and
// unwritten, unreported, for as long as every sync was dirty.
func TestReregisteredUnseenCreateWrittenInDirtySync(t *testing.T) {
	a, _ := createdWhileUnregistered(t)
	a.exec(`CREATE TABLE applog (n INTEGER)`)
	hooks(a.eng).step = func(point string) error {
		if point == "planned" {
			a.exec(`INSERT INTO applog (n) VALUES (1)`) // unrelated to notes
		}
		return nil
	}
	for i := 0; i < 3; i++ {
		r := a.sync()
		if got := a.get("r0"); got != `{"x":2}` {
			t.Errorf("dirty sync %d: a: r0 = %q, want b's creation {\"x\":2} (pending %d, unwritten %v)", i+1, got, a.pendingCount(), unwrittenIDs(r))
		}
	}
}

// The app deletes a record it saw, and while the sync that sends the
// delete runs it creates the id again; the
// engine's rewrite of that new row (rebasePending) is refused by a CHECK
// on a projection column, so sync_unwritten records base NULL for a row
// that was written over a delete the device saw. The next sync then takes
// the new row for edits of a row "that did not show the delete" and sends
// a non-replacing patch: the deleted record's fields come back, though the
// doc says a row inserted again over a record the device saw deleted is
// exactly the new row everywhere. A row that showed no row (base NULL)
// over a deleted record is a new record.
func TestRecreatedDuringSyncRefusedStaysNew(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote, checkedNotesSchema)
	b := newDevice(t, "dev-b", remote)
	a.put("r", `{"old":1}`)
	syncAll(t, a, b)

	a.exec(`DELETE FROM notes WHERE id = 'r'`)
	hooks(a.eng).step = func(point string) error {
		if point == "planned" {
			a.put("r", `{"display_order":500,"new":2}`)
		}
		return nil
	}
	a.sync()
	hooks(a.eng).step = nil
	syncAll(t, a, b)
	if got, want := b.get("r"), `{"display_order":500,"new":2}`; got != want {
		t.Errorf("b: r = %s, want exactly a's new row %s (the deleted record's fields came back)", got, want)
	}
}
