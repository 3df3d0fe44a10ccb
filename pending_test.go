package drivesync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
)

// logged counts the rows of the capture log.
func (d *device) logged() int {
	d.t.Helper()
	var n int
	if err := d.db.QueryRow(`SELECT count(*) FROM sync_pending_log`).Scan(&n); err != nil {
		d.t.Fatal(err)
	}
	return n
}

// checkTriggers fails unless d's database holds exactly the capture
// triggers its engine installs, as it installs them.
func (d *device) checkTriggers() {
	d.t.Helper()
	want := map[string]string{}
	for _, t := range d.eng.order {
		maps.Copy(want, triggerSQL(t))
	}
	got := map[string]string{}
	rows, err := d.db.Query(`SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'sync\_trg\_%' ESCAPE '\'`)
	if err != nil {
		d.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			d.t.Fatal(err)
		}
		got[name] = def
	}
	if !maps.Equal(got, want) {
		d.t.Fatalf("%s: capture triggers %v, want %v", d.name, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
}

// Each write appends a mark; a record written several times is one
// pending record, and a sync settles them all.
func TestCaptureLog(t *testing.T) {
	a := newDevice(t, "dev-a", NewMemoryRemote())
	a.put("n1", `{"v":1}`)
	a.put("n1", `{"v":2}`)
	a.put("n2", `{"v":1}`)
	a.exec(`DELETE FROM notes WHERE id = 'n2'`)
	a.put("n3", `{"v":1}`)
	// The upsert over n1 marks as it inserts and as it updates.
	if got := a.logged(); got != 6 {
		t.Errorf("%d marks logged for 5 statements, want 6", got)
	}
	if got := a.pendingCount(); got != 3 {
		t.Errorf("%d records pending, want 3", got)
	}
	st, err := a.eng.Status(context.Background())
	if err != nil || st.Pending != 3 {
		t.Errorf("Status.Pending %d (%v), want 3", st.Pending, err)
	}
	if r := a.sync(); r.ChangesSent != 2 {
		t.Errorf("sent %d changes, want 2 (n2, created and deleted, has nothing to send)", r.ChangesSent)
	}
	if a.pendingCount() != 0 || a.logged() != 0 {
		t.Errorf("after the sync: %d pending, %d logged", a.pendingCount(), a.logged())
	}
}

// A sync that writes many rows drops the capture triggers for the length
// of its transaction: they are back, as installed, after it commits and
// after it fails, and the app's writes before, during and after it are
// all sent.
func TestQuietWindowDropsTriggers(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	b := newDevice(t, "dev-b", remote)
	a.eng.quietDropAt, b.eng.quietDropAt = 50, 50
	tx, err := a.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if _, err := tx.Exec(`INSERT INTO notes (id, content) VALUES (?, jsonb(?))`, fmt.Sprintf("r%03d", i), fmt.Sprintf(`{"i":%d,"k":null}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// A write while a sync is under way, outside its transactions.
	hooks(a.eng).step = func(point string) error {
		if point == "uploaded" {
			hooks(a.eng).step = nil
			a.put("during", `{"by":"a"}`)
		}
		return nil
	}
	a.sync()
	a.checkTriggers()
	if got := a.pendingCount(); got != 1 {
		t.Fatalf("dev-a: %d pending after its sync, want 1 (the write made during it)", got)
	}
	// A sync that fails inside its transaction: rolled back, triggers and all.
	hooks(b.eng).step = func(point string) error {
		if point == "applied" {
			return errors.New("injected")
		}
		return nil
	}
	if _, err := b.eng.Sync(context.Background()); err == nil {
		t.Fatal("dev-b: the sync did not fail")
	}
	hooks(b.eng).step = nil
	b.checkTriggers()
	b.put("failed", `{"by":"b"}`)
	if got := b.pendingCount(); got != 1 {
		t.Fatalf("dev-b: %d pending after a write, want 1", got)
	}
	b.sync()
	b.checkTriggers()
	b.put("after", `{"by":"b"}`)
	if got := b.pendingCount(); got != 1 {
		t.Fatalf("dev-b: %d pending after a write, want 1", got)
	}
	syncAll(t, a, b)
	for _, d := range []*device{a, b} {
		d.checkTriggers()
		for _, id := range []string{"r000", "r199", "during", "failed", "after"} {
			if d.get(id) == "" {
				t.Errorf("%s: no record %s", d.name, id)
			}
		}
	}
	if a.dump() != b.dump() {
		t.Error("the devices diverged")
	}
}

// A record whose key no row of the table may hold (TEXT with a NUL
// character, which the capture triggers refuse in the app's writes) is
// refused alike by a device whose sync drops the triggers while it
// writes and by one whose sync keeps them: the devices do not diverge.
func TestQuietWindowKeyRefusedAlike(t *testing.T) {
	remote := NewMemoryRemote()
	const schema = `CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "kv"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "kv"})
	a.eng.quietDropAt = 1
	raw := gzipBytes([]byte(`{"format":1,"device":"` + evilDev + `","changes":[` +
		`{"table_name":"kv","record_id":"'a\u0000b'","patch":{"v":"nul"},"is_deleted":false,"sync_version":50},` +
		`{"table_name":"kv","record_id":"'ok'","patch":{"v":"fine"},"is_deleted":false,"sync_version":51}]}`))
	if err := remote.Create(context.Background(), evilName, bytes.NewReader(raw)); err != nil {
		t.Fatal(err)
	}
	syncAll(t, a, b)
	for _, d := range []*device{a, b} {
		if got, want := d.rows(`SELECT k, v FROM kv ORDER BY k`), "ok | fine\n"; got != want {
			t.Errorf("%s: kv holds %q, want %q", d.name, got, want)
		}
		d.checkTriggers()
	}
	assertConverged(t, a, b)
}
