package drivesync_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drivesync/drivesync"
)

// openNotesDB opens the database at path with the README's DSN and
// extra parameters, creating the notes table when it may write.
func openNotesDB(t *testing.T, path, extra string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_txlock=immediate"+extra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Open on a database the app opened read-only says which file, and what to
// do, rather than only SQLite's "attempt to write a readonly database":
// whether the engine never ran on the file or already set it up.
func TestOpenReadOnlyDatabaseNamesFile(t *testing.T) {
	ctx := context.Background()
	remote, err := drivesync.NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := drivesync.Config{Remote: remote, Tables: []drivesync.Table{{Name: "notes"}}}
	path := filepath.Join(t.TempDir(), "notes.db")
	rw := openNotesDB(t, path, "&_pragma=journal_mode(WAL)")
	if _, err := rw.Exec(`CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, setUp := range []bool{false, true} {
		if setUp {
			if _, err := drivesync.Open(ctx, rw, cfg); err != nil {
				t.Fatal(err)
			}
		}
		ro := openNotesDB(t, path, "&mode=ro")
		_, err := drivesync.Open(ctx, ro, cfg)
		if err == nil || !strings.Contains(err.Error(), path+" is read-only") || !strings.Contains(err.Error(), "open it writable") {
			t.Errorf("Open on the read-only database (set up before: %v): got %v, want an error naming %s and saying to open it writable", setUp, err, path)
		}
	}
}

// A Sync whose connection cannot write (the file lost its write
// permission after the app opened it, so that SQLite opens it read-only)
// names the file, uploads nothing, and keeps the change pending for the
// Sync that runs once the file is writable again.
func TestSyncReadOnlyDatabaseNamesFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	remote, err := drivesync.NewFolderRemote(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "notes.db")
	db := openNotesDB(t, path, "&_pragma=journal_mode(WAL)")
	db.SetMaxOpenConns(1) // the one connection the Sync gets
	if _, err := db.Exec(`CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	eng, err := drivesync.Open(ctx, db, drivesync.Config{Remote: remote, Tables: []drivesync.Table{{Name: "notes"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO notes (id, content) VALUES ('n1', jsonb('{"text":"kept"}'))`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`PRAGMA query_only = 1`); err != nil {
		t.Fatal(err)
	}
	_, err = eng.Sync(ctx)
	if err == nil || !strings.Contains(err.Error(), path+" is read-only") {
		t.Fatalf("Sync on a read-only connection: got %v, want an error naming %s", err, path)
	}
	var files []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), "patch_") {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 0 {
		t.Errorf("the failed Sync uploaded %v", files)
	}
	if _, err := db.Exec(`PRAGMA query_only = 0`); err != nil {
		t.Fatal(err)
	}
	if r, err := eng.Sync(ctx); err != nil || r.ChangesSent != 1 {
		t.Errorf("Sync once writable: sent %d, %v; want the pending change sent", r.ChangesSent, err)
	}
}
