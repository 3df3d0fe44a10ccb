package drivesync

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Content that is not a JSON object is refused when the app writes it,
// with an error that says so, instead of being found at sync time and
// left pending for ever.
func TestNonObjectContentRefusedAtWrite(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	d.put("ok", `{"v":1}`)
	for _, c := range []struct{ sql, arg string }{
		{`INSERT INTO notes (id, content) VALUES ('bad', jsonb(?))`, `[1,2]`},
		{`INSERT INTO notes (id, content) VALUES ('bad', ?)`, `not json`},
		{`INSERT INTO notes (id, content) VALUES ('bad', ?)`, `"a string"`},
		{`UPDATE notes SET content = jsonb(?) WHERE id = 'ok'`, `42`},
		{`UPDATE notes SET content = ? WHERE id = 'ok'`, `{"broken":`},
		// Over an existing row: the statement is backed out whole, the
		// row it replaced included.
		{`INSERT OR REPLACE INTO notes (id, content) VALUES ('ok', jsonb(?))`, `[1]`},
	} {
		_, err := d.db.Exec(c.sql, c.arg)
		if err == nil || !strings.Contains(err.Error(), "notes.content must be a JSON object") {
			t.Errorf("%s with %s: got %v, want an error saying content must be a JSON object", c.sql, c.arg, err)
		}
	}
	if got := d.get("ok"); got != `{"v":1}` {
		t.Errorf("ok = %s", got)
	}
	var n int
	if err := d.db.QueryRow(`SELECT count(*) FROM notes WHERE id = 'bad'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("a refused insert left %d rows (%v)", n, err)
	}
	if r := d.sync(); len(r.Skipped) != 0 || r.ChangesSent != 1 {
		t.Errorf("sync: %+v", r)
	}
}

// With its shared folder not mounted, an app still opens its database and
// works with its own data; Sync says the folder is missing, loses nothing,
// and works once the folder is back.
func TestOfflineFolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "usb-stick")
	remote, err := NewFolderRemote(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := newDevice(t, "dev-a", remote) // Open: no remote needed
	d.put("n1", `{"text":"written offline"}`)
	if d.get("n1") == "" {
		t.Fatal("the app cannot read its own note")
	}
	_, err = d.eng.Sync(context.Background())
	if !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "mounted") {
		t.Fatalf("Sync with the folder missing: got %v, want ErrRemote saying the folder is missing", err)
	}
	if d.pendingCount() != 1 {
		t.Fatal("the note is no longer pending")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if r := d.sync(); r.ChangesSent != 1 {
		t.Fatalf("after mounting: %+v", r)
	}
}

// A row with a NULL id is refused when the app writes it, with an error
// that names the app's table and column (not the engine's pending log),
// and leaves nothing behind: no row and no pending mark.
func TestNullIDRefusedAtWrite(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	d.put("ok", `{"v":1}`)
	d.sync()
	for _, q := range []string{
		`INSERT INTO notes (id, content) VALUES (NULL, jsonb('{"v":2}'))`,
		`INSERT INTO notes (content) VALUES (jsonb('{"v":2}'))`,
		`UPDATE notes SET id = NULL WHERE id = 'ok'`,
	} {
		_, err := d.db.Exec(q)
		if err == nil || !strings.Contains(err.Error(), "notes.id must not be NULL") {
			t.Errorf("%s: got %v, want an error saying notes.id must not be NULL", q, err)
		}
	}
	var rows, marks int
	if err := d.db.QueryRow(`SELECT (SELECT count(*) FROM notes), (SELECT count(*) FROM sync_pending_log) + (SELECT count(*) FROM sync_pending_changes)`).Scan(&rows, &marks); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || marks != 0 || d.get("ok") != `{"v":1}` {
		t.Errorf("after the refused writes: %d rows, %d pending marks, ok = %s; want the one row as it was, nothing pending", rows, marks, d.get("ok"))
	}
}

// Rows with a NULL id that a table held before it was registered stop
// Open with an error naming the table, rather than being left out of
// every sync without a word.
func TestNullIDRefusedAtRegistration(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote(), notesSchema, `CREATE TABLE tags (id TEXT PRIMARY KEY, content TEXT)`)
	d.exec(`INSERT INTO tags (id, content) VALUES (NULL, '{"name":"a"}'), ('t1', '{"name":"b"}')`)
	cfg := d.cfg
	cfg.Tables = append(cfg.Tables, Table{Name: "tags"})
	_, err := Open(context.Background(), d.db, cfg)
	if err == nil || !strings.Contains(err.Error(), "table tags: 1 row(s) have a NULL id") {
		t.Fatalf("Open registering a table with a NULL id: got %v, want an error saying 1 row of tags has a NULL id", err)
	}
	d.exec(`UPDATE tags SET id = 't0' WHERE id IS NULL`)
	d.cfg = cfg
	d.open()
	if n := d.pendingCount(); n != 2 {
		t.Errorf("%d records pending after registering tags, want its 2 rows", n)
	}
}

// A NULL-id row a registered table holds from before (an older engine
// registered the table without a word about it) can be fixed: given an
// id, which then syncs, or deleted, with no error from the engine's
// pending log.
func TestNullIDRowLeftFromBeforeCanBeFixed(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	// The row as an older engine left it: written with no trigger.
	var insert string
	if err := d.db.QueryRow(`SELECT sql FROM sqlite_master WHERE name = 'sync_trg_notes_insert'`).Scan(&insert); err != nil {
		t.Fatal(err)
	}
	d.exec(`DROP TRIGGER sync_trg_notes_insert`)
	d.exec(`INSERT INTO notes (id, content) VALUES (NULL, jsonb('{"v":1}')), (NULL, jsonb('{"v":2}'))`)
	d.exec(insert)
	if _, err := d.db.Exec(`UPDATE notes SET id = 'fixed' WHERE content ->> 'v' = 1`); err != nil {
		t.Errorf("giving the row an id: %v", err)
	}
	if _, err := d.db.Exec(`DELETE FROM notes WHERE id IS NULL`); err != nil {
		t.Errorf("deleting the row: %v", err)
	}
	if r := d.sync(); r.ChangesSent != 1 || d.get("fixed") != `{"v":1}` {
		t.Errorf("sync after the fix: sent %d, fixed = %s; want the row given an id sent", r.ChangesSent, d.get("fixed"))
	}
}
