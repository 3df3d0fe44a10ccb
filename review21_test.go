package drivesync

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Review 21: the change that gives a database file another inode a new
// device id at Open, writes app rows with OR ABORT, and writes refused
// rows together.

// killedAfterUpload leaves a's sync of r ("from a") uploaded but not
// committed, its file in the outbox, stamped (1, a's id), while x's
// concurrent write of r ("from x") is stamped (1, x-dev): x syncs after
// a planned, before a uploaded, so neither saw the other's write.
func killedAfterUpload(t *testing.T, a, x *device) {
	t.Helper()
	a.put("r", `{"v":"from a"}`)
	x.put("r", `{"v":"from x"}`)
	hooks(a.eng).step = func(p string) error {
		switch p {
		case "planned":
			x.sync()
		case "uploaded":
			return errors.New("app killed after the upload")
		}
		return nil
	}
	if _, err := a.eng.Sync(context.Background()); err == nil {
		t.Fatal("a: the sync was to end after its upload")
	}
	hooks(a.eng).step = nil
	var n int
	if err := a.db.QueryRow(`SELECT count(*) FROM sync_outbox`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("a's outbox: %d chunks (%v), want its upload", n, err)
	}
}

// A sync ended after its upload (the app was killed; the upload waits in
// sync_outbox and is published and adopted by the next sync, see
// recoverOne), and the database file then got another inode before the
// next Open: a copy to another machine (copyFileDevice), or the same path
// replaced (a backup put back, a move to another volume, a tool that
// saves by write-and-rename). Open takes a new device id, and the next
// sync adopts the outbox's file with adoptOutbox, which decodes it with
// e.deviceID: the file's writes enter this database's sync_states under
// (1, the NEW id), while the file on the remote is named with the OLD id,
// under which every other device applies them. The file's stamps differ
// between devices for good: sync_states' clock and device_id differ, and
// where another device wrote the same field at the same version the
// tie-break goes one way here and the other way everywhere else. With the
// old id "zz-old", the new one a uuid and x's id "x-dev" between them,
// the devices keep different values of r for ever. (Found as: every sync
// of the copy failed, the outbox's file naming the old id.) Open now keeps
// the old id while the outbox holds an upload, and the sync takes the new
// one once the outbox is adopted (see renewMovedID).
//
// Sequence: a (stored id zz-old, Config.DeviceID empty) and x edit r; a's
// sync plans, x syncs, a uploads and is killed; the file gets a new inode
// (copy / replaced in place) and is opened; all sync to quiescence.
func TestReview21NewFileAdoptsOutboxUnderNewID(t *testing.T) {
	for _, how := range []string{"copied", "replaced in place"} {
		t.Run(how, func(t *testing.T) {
			remote := NewMemoryRemote()
			a := newDevice(t, "zz-old", remote)
			a.cfg.DeviceID = "" // the id the database stored: zz-old
			a.open()
			x := newDevice(t, "x-dev", remote)
			killedAfterUpload(t, a, x)

			devs := []*device{a, x}
			moved := a
			switch how {
			case "copied":
				cfg := a.cfg
				cfg.TempDir = t.TempDir()
				moved = copyFileDevice(t, a, "copy", cfg)
				devs = append(devs, moved)
			case "replaced in place":
				a.exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
				if err := a.db.Close(); err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(a.path)
				if err != nil {
					t.Fatal(err)
				}
				tmp := filepath.Join(filepath.Dir(a.path), "restore.tmp")
				if err := os.WriteFile(tmp, b, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, a.path); err != nil {
					t.Fatal(err)
				}
				a.reopen()
			}
			if id := moved.eng.DeviceID(); id != "zz-old" {
				t.Fatalf("%s: opened as %s: the outbox's upload carries zz-old, and is adopted under it first", how, id)
			}
			var errs []error
			for range 3 {
				if _, err := moved.eng.Sync(context.Background()); err != nil {
					errs = append(errs, err)
				}
			}
			if len(errs) == 3 {
				t.Fatalf("the %s database is stuck: every sync fails (the outbox is never adopted, nothing is sent or received): %v", how, errs[2])
			}
			if id := moved.eng.DeviceID(); id == "zz-old" {
				t.Errorf("%s: still syncs as zz-old once its outbox is adopted", how)
			}
			for range 3 {
				syncAll(t, devs...)
			}
			t.Logf("new id %s", moved.eng.DeviceID())
			if got, want := moved.get("r"), x.get("r"); got != want {
				t.Errorf("r diverged for good: the %s database holds %s, x holds %s", how, got, want)
			}
			q := `SELECT clock, device_id FROM sync_states WHERE record_id = 'r'`
			var mc, md, xc, xd string
			if err := moved.db.QueryRow(q).Scan(&mc, &md); err != nil {
				t.Fatal(err)
			}
			if err := x.db.QueryRow(q).Scan(&xc, &xd); err != nil {
				t.Fatal(err)
			}
			if mc != xc || md != xd {
				t.Errorf("sync_states of r differ: %s database %s %s, x %s %s", how, mc, md, xc, xd)
			}
		})
	}
}

// A document table's projection declared NOT NULL ON CONFLICT REPLACE
// with a default (the SQLite idiom for "NULL means the default"): the app
// writes a note whose content lacks the projected key, and its row takes
// the default. Before the change the engine's upsert on another device
// wrote json_extract(content, '$.title'), NULL, and the column's REPLACE
// algorithm stored the default just the same. The engine now says INSERT
// OR ABORT (buildSQL), which overrides that algorithm: the NOT NULL
// refuses the row, which is reported unwritten at every sync and never
// written, since the record never changes to carry a title. b never gets
// the note (a write that worked before the change), and a and b hold
// different rows for good. OR ABORT is now said only on tables whose
// declared algorithms would drop or hide a row (see overridesConflicts).
//
// Sequence: a puts n1 {"body":"hello"} (no title); a syncs; b syncs.
//
// Review 22 found the same with an IGNORE elsewhere in the table, where
// the engine must say OR ABORT: it now fills the projection's default
// itself (fillDefaults).
func TestReview21NotNullReplaceProjectionRefused(t *testing.T) {
	for name, schema := range map[string]string{
		"alone": `CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL, title TEXT NOT NULL ON CONFLICT REPLACE DEFAULT '')`,
		"beside an IGNORE": `CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL,
	title TEXT NOT NULL ON CONFLICT REPLACE DEFAULT '',
	slug TEXT UNIQUE ON CONFLICT IGNORE)`,
	} {
		t.Run(name, func(t *testing.T) {
			remote := NewMemoryRemote()
			a := newDevice(t, "dev-a", remote, schema)
			b := newDevice(t, "dev-b", remote, schema)
			a.put("n1", `{"body":"hello"}`)
			syncAll(t, a, b)
			r := b.sync()
			if ids := unwrittenIDs(r); len(ids) != 0 {
				t.Errorf("b: unwritten %v at every sync (%v)", ids, r.Unwritten)
			}
			if got, want := b.get("n1"), a.get("n1"); got != want {
				t.Errorf("b holds n1 = %q, a %q: the note never reaches b", got, want)
			}
		})
	}
}

// writeTogether returns from the whole function, not just the group,
// when deletesStayInTable says a table's deletes reach past it
// (`if ... !alone { return err }`, err nil). Groups are in table order,
// so refused rows of a table with an app trigger (left unwritten, as
// documented) keep every table sorted after it from being written
// together: the swap of items, a table without triggers or foreign keys,
// is never written on b, whose rows differ from a's and from its own
// sync_states for good, reported unwritten at every sync.
//
// Now a table left alone is skipped, and the next one tried.
//
// Sequence: b has an app trigger on a_tags; a swaps two a_tags positions
// and two items positions, each in one transaction; all sync.
func TestReview21TriggeredTableBlocksOtherTablesSwap(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE a_tags (id TEXT PRIMARY KEY, pos INTEGER NOT NULL UNIQUE);
CREATE TABLE items (id TEXT PRIMARY KEY, pos INTEGER NOT NULL UNIQUE, title TEXT)`
	tables := []Table{{Name: "a_tags"}, {Name: "items"}}
	a := rowsDevice(t, "dev-a", remote, schema, tables...)
	b := rowsDevice(t, "dev-b", remote, schema, tables...)
	b.exec(`CREATE TABLE tag_log (id TEXT);
CREATE TRIGGER a_tags_log AFTER INSERT ON a_tags BEGIN INSERT INTO tag_log VALUES (NEW.id); END`)
	a.exec(`INSERT INTO a_tags VALUES ('t1', 1), ('t2', 2)`)
	a.exec(`INSERT INTO items VALUES ('i1', 1, 'first'), ('i2', 2, 'second')`)
	syncAll(t, a, b)
	tx, err := a.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE a_tags SET pos = -1 WHERE id = 't1'`, `UPDATE a_tags SET pos = 1 WHERE id = 't2'`, `UPDATE a_tags SET pos = 2 WHERE id = 't1'`,
		`UPDATE items SET pos = -1 WHERE id = 'i1'`, `UPDATE items SET pos = 1 WHERE id = 'i2'`, `UPDATE items SET pos = 2 WHERE id = 'i1'`,
	} {
		if _, err := tx.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	syncAll(t, a, b)
	r := b.sync()
	q := `SELECT id, pos FROM items ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("items diverge for good: b %q, a %q (b reports unwritten %v)", got, want, unwrittenIDs(r))
	}
}

// writeTogether writes every refused row of a table as one group, all or
// nothing. A row the table refuses for a reason of its own (here b's
// UNIQUE index on title refuses i3, whose title a set to i1's) rolls the
// whole group back, so the swap of i1 and i2, which the table takes on
// its own, stays unwritten as long as i3 is refused: b's positions
// differ from a's and from its sync_states for good. Now the refused row
// leaves the group, which is tried again without it.
//
// Sequence: b adds a UNIQUE index on title; a swaps i1 and i2 and sets
// i3's title to 'first'; all sync.
func TestReview21UnrelatedRefusalBlocksSwap(t *testing.T) {
	a, b := swapDevices(t, testDSN, `CREATE UNIQUE INDEX items_title ON items (title)`, "")
	swap(t, a)
	a.exec(`UPDATE items SET title = 'first' WHERE id = 'i3'`)
	syncAll(t, a, b)
	r := b.sync()
	if ids := unwrittenIDs(r); len(ids) != 1 {
		t.Errorf("b: unwritten %v, want i3 alone", ids)
	}
	q := `SELECT id, pos FROM items ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("positions diverge for good: b %q, a %q", got, want)
	}
}

// overridesConflicts reads which declared conflict algorithms the engine's
// writes override: those that drop or hide a row, not NOT NULL's REPLACE.
func TestOverridesConflicts(t *testing.T) {
	for def, want := range map[string]bool{
		`CREATE TABLE t (id TEXT PRIMARY KEY, email TEXT UNIQUE)`:                                  false,
		`CREATE TABLE t (id TEXT PRIMARY KEY, email TEXT UNIQUE ON CONFLICT REPLACE)`:              true,
		`CREATE TABLE t (id TEXT PRIMARY KEY, email TEXT UNIQUE ON CONFLICT FAIL)`:                 false,
		`CREATE TABLE t (id TEXT PRIMARY KEY, a, b, UNIQUE (a, b) ON CONFLICT REPLACE)`:            true,
		`CREATE TABLE t (id TEXT PRIMARY KEY ON CONFLICT REPLACE, a)`:                              true,
		`CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT NOT NULL ON CONFLICT REPLACE DEFAULT '')`: false,
		`CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT NOT NULL ON CONFLICT IGNORE)`:             true,
		`CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT NOT NULL ON CONFLICT ROLLBACK)`:           true,
		`CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT DEFAULT 'on conflict replace' UNIQUE)`:    false,
		`CREATE TABLE t (id TEXT PRIMARY KEY, -- unique on conflict replace
title TEXT UNIQUE /* ON CONFLICT IGNORE */)`: false,
		`CREATE TABLE "on conflict replace" (id TEXT PRIMARY KEY, x)`: false,
	} {
		if got := overridesConflicts(def); got != want {
			t.Errorf("overridesConflicts(%q) = %v, want %v", def, got, want)
		}
	}
}
