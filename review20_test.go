package drivesync

import (
	"fmt"
	"testing"
)

// Review 20: app rows of ordinary tables, and the commit's handling of
// the app's writes and of refused rows.

// A UNIQUE column declared ON CONFLICT REPLACE (common in schemas ported
// from Android): the engine wrote a received row with a plain
// INSERT ... ON CONFLICT (key) DO UPDATE, whose conflict target covers
// the key only, so the column's own REPLACE algorithm applied and SQLite
// silently deleted the device's other row holding the same value. The
// delete happened inside the quiet window (its capture marks, if any,
// were dropped), nothing was reported in Report.Unwritten, and
// sync_states still showed both records: a lost its row u1, b lost u2,
// for good. Declared IGNORE, the write was dropped unreported; declared
// ROLLBACK, every sync failed. The engine's writes now say OR ABORT: each
// device keeps its own row and reports the other's as unwritten.
//
// Sequence: a inserts u1 (x@example.com), b inserts u2 (x@example.com),
// offline; a syncs, b syncs, all sync.
func TestReview20ReplaceConstraintDeletesRowSilently(t *testing.T) {
	for _, algo := range []string{"REPLACE", "IGNORE", "ROLLBACK"} {
		t.Run(algo, func(t *testing.T) {
			remote := NewMemoryRemote()
			schema := `CREATE TABLE users (id TEXT PRIMARY KEY, email TEXT UNIQUE ON CONFLICT ` + algo + `, name TEXT)`
			a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "users"})
			b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "users"})
			a.exec(`INSERT INTO users VALUES ('u1', 'x@example.com', 'on a')`)
			b.exec(`INSERT INTO users VALUES ('u2', 'x@example.com', 'on b')`)
			var ra, rb Report
			for range 3 {
				ra, rb = a.sync(), b.sync()
			}
			q := `SELECT id, email, name FROM users ORDER BY id`
			if got := a.rows(q); got != "u1 | x@example.com | on a\n" {
				t.Errorf("a holds %q, want its own row u1", got)
			}
			if got := b.rows(q); got != "u2 | x@example.com | on b\n" {
				t.Errorf("b holds %q, want its own row u2", got)
			}
			if got := fmt.Sprint(unwrittenIDs(ra), unwrittenIDs(rb)); got != "[users/'u2'] [users/'u1']" {
				t.Errorf("unwritten: %s, want each device to report the other's row", got)
			}
			states := `SELECT record_id, record_data FROM sync_states ORDER BY record_id`
			if got, want := a.rows(states), b.rows(states); got != want || got == "" {
				t.Errorf("sync_states differ: a %q, b %q", got, want)
			}
		})
	}
}

// A newer app version added `score REAL NOT NULL DEFAULT 0`. A row the
// engine writes on b from a record the older a created takes the
// column's default, which SQLite stores as the REAL 0.0 (the column's
// affinity); readDefaults evaluated the default expression alone, without
// that affinity, and learnt the INTEGER 0. rowRecord then did not
// recognise the row's 0.0 as the default, and b's unrelated edit of
// title sent score = 0.0, stamped after c's score = 5.5: c's write was
// lost on every device, though b never wrote score. The same for every
// default its column's type converts.
//
// Sequence: a (old schema) inserts x; all sync; c sets score and syncs;
// b (which has not seen it) edits title and syncs; all sync.
func TestReview20RealDefaultSentAsEdit(t *testing.T) {
	for _, tc := range []struct{ column, strict, set, want string }{
		{"score REAL NOT NULL DEFAULT 0", "", "5.5", "5.5"},
		{"score REAL NOT NULL DEFAULT 0", " STRICT", "5.5", "5.5"},
		{"score INTEGER NOT NULL DEFAULT '0'", "", "5", "5"},
		{"score INTEGER NOT NULL DEFAULT 1.0", "", "5", "5"},
		{"score TEXT NOT NULL DEFAULT 0", "", "'five'", "five"},
		{"score NUMERIC DEFAULT '1e3'", "", "5", "5"},
	} {
		t.Run(tc.column+tc.strict, func(t *testing.T) {
			remote := NewMemoryRemote()
			older := `CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT)` + tc.strict
			newer := `CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT, ` + tc.column + `)` + tc.strict
			a := rowsDevice(t, "dev-a", remote, older, Table{Name: "t"})
			b := rowsDevice(t, "dev-b", remote, newer, Table{Name: "t"})
			c := rowsDevice(t, "dev-c", remote, newer, Table{Name: "t"})
			a.exec(`INSERT INTO t VALUES ('x', 'one')`)
			syncAll(t, a, b, c)
			c.exec(`UPDATE t SET score = ` + tc.set)
			b.exec(`UPDATE t SET title = 'two'`)
			c.sync()
			b.sync()
			syncAll(t, a, b, c)
			for _, d := range []*device{b, c} {
				if got, want := d.rows(`SELECT id, title, score FROM t`), "x | two | "+tc.want+"\n"; got != want {
					t.Errorf("%s: %q, want %q: b's title and c's score (b never wrote score)", d.name, got, want)
				}
			}
		})
	}
}

// A row the table refused keeps, in sync_unwritten.base, what it showed:
// a row read on the older app version, without the column the newer one
// adds. b upgrades (color TEXT NOT NULL DEFAULT 'red'); writeColumns
// skips the kept row, which takes the default. When the app then edits
// the row, planRecord's refused branch diffs the raw row against that
// base (editsSince) without rowRecord: the default 'red' of the new
// column counts as b's edit and is sent over a's 'blue', on every device.
//
// Sequence: a (newer) inserts x with color blue; all sync; b (older)
// inserts w with slug 'b'; a sets x.slug = 'b' and syncs; b syncs (x's
// update refused: UNIQUE slug); b adds the column and reopens; b edits
// x.title; all sync.
func TestReview20RefusedBaseUpgradeSendsDefault(t *testing.T) {
	remote := NewMemoryRemote()
	older := `CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT, slug TEXT UNIQUE)`
	newer := `CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT, slug TEXT UNIQUE, color TEXT NOT NULL DEFAULT 'red')`
	a := rowsDevice(t, "dev-a", remote, newer, Table{Name: "t"})
	b := rowsDevice(t, "dev-b", remote, older, Table{Name: "t"})
	a.exec(`INSERT INTO t VALUES ('x', 'one', 'a', 'blue')`)
	syncAll(t, a, b)
	b.exec(`INSERT INTO t VALUES ('w', 'other', 'b')`)
	a.exec(`UPDATE t SET slug = 'b' WHERE id = 'x'`)
	a.sync()
	if r := b.sync(); len(r.Unwritten) != 1 {
		t.Fatalf("b: unwritten %v, want x refused", unwrittenIDs(r))
	}
	b.exec(`ALTER TABLE t ADD COLUMN color TEXT NOT NULL DEFAULT 'red'`)
	b.open()
	b.exec(`UPDATE t SET title = 'two' WHERE id = 'x'`)
	syncAll(t, a, b)
	if got := a.rows(`SELECT id, title, slug, color FROM t WHERE id = 'x'`); got != "x | two | b | blue\n" {
		t.Errorf("a: %q, want b's title over a's row, color still blue (b never wrote color)", got)
	}
}

// Two rows swap the values of a UNIQUE column (a reorder of positions):
// a does it in one transaction through a temporary value, which its
// table accepts. b writes the received records one row at a time: i1's
// pos 2 is refused while i2 still holds 2, and i2's pos 1 while i1 still
// holds 1. retryUnwritten tries them again one at a time, round after
// round, and neither can ever be written: b keeps the old order for good
// (its rows differ from a's and from its own sync_states), and reports
// both records unwritten at every sync, though the synced state is one
// the table accepts.
//
// Sequence: a inserts i1 (pos 1), i2 (pos 2); all sync; a swaps the
// positions in one transaction; all sync, then b syncs again.
func TestReview20UniqueSwapNeverWritten(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE items (id TEXT PRIMARY KEY, pos INTEGER NOT NULL UNIQUE, title TEXT)`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "items"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "items"})
	a.exec(`INSERT INTO items VALUES ('i1', 1, 'first'), ('i2', 2, 'second')`)
	syncAll(t, a, b)
	swap(t, a)
	syncAll(t, a, b)
	r := b.sync()
	if ids := unwrittenIDs(r); len(ids) != 0 {
		t.Errorf("b: unwritten %v at every sync, though the synced rows satisfy the table", ids)
	}
	q := `SELECT id, pos FROM items ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("rows diverge for good: b %q, a %q", got, want)
	}
}

// swapDevices are two devices of items, pos UNIQUE, with extra schema
// on b and after run on b once both synced.
func swapDevices(t *testing.T, dsn func(string) string, extra, after string) (a, b *device) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE items (id TEXT PRIMARY KEY, pos INTEGER NOT NULL UNIQUE, title TEXT)`
	a = rowsDevice(t, "dev-a", remote, schema, Table{Name: "items"})
	b = rowsDeviceOn(t, dsn, "dev-b", remote, schema, Table{Name: "items"})
	if extra != "" {
		b.exec(extra)
	}
	a.exec(`INSERT INTO items VALUES ('i1', 1, 'first'), ('i2', 2, 'second'), ('i3', 3, 'third')`)
	syncAll(t, a, b)
	if after != "" {
		b.exec(after)
	}
	return a, b
}

// swap moves i1 to i2's position and i2 to i1's on a, in one transaction.
func swap(t *testing.T, a *device) {
	tx, err := a.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE items SET pos = -1 WHERE id = 'i1'`,
		`UPDATE items SET pos = 1 WHERE id = 'i2'`,
		`UPDATE items SET pos = 2 WHERE id = 'i1'`,
	} {
		if _, err := tx.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// The swap on a document table, whose UNIQUE projection the two notes
// trade, is written as on an ordinary table.
func TestReview20UniqueSwapDocumentTable(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL, slot INTEGER UNIQUE)`
	a, b := newDevice(t, "dev-a", remote, schema), newDevice(t, "dev-b", remote, schema)
	a.put("n1", `{"slot":1}`)
	a.put("n2", `{"slot":2}`)
	syncAll(t, a, b)
	a.put("n1", `{"slot":-1}`)
	a.put("n2", `{"slot":1}`)
	a.put("n1", `{"slot":2}`)
	syncAll(t, a, b)
	if r := b.sync(); len(r.Unwritten) != 0 {
		t.Errorf("b: unwritten %v", unwrittenIDs(r))
	}
	q := `SELECT id, slot, json(content) FROM notes ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want || got != "n1 | 2 | {\"slot\":2}\nn2 | 1 | {\"slot\":1}\n" {
		t.Errorf("b: %q, a: %q", got, want)
	}
}

// Rows are written together only where deleting them touches nothing
// else. A child table whose foreign key cascades the deletes (foreign
// keys on), or an app trigger on the table, keeps the swap unwritten and
// reported, and the children and the trigger's log untouched. A row the
// group cannot take (a value b's own index refuses) rolls the group
// back: both rows stay as they were.
func TestReview20SwapTogetherOnlyWhereSafe(t *testing.T) {
	for _, tc := range []struct {
		name         string
		dsn          func(string) string
		extra, after string
		check        string // a query of b's that must be unchanged
	}{
		{"cascading foreign key", fkDSN, `CREATE TABLE notes_of (id TEXT PRIMARY KEY, item TEXT REFERENCES items (id) ON DELETE CASCADE)`,
			`INSERT INTO notes_of VALUES ('c1', 'i1'), ('c2', 'i2')`, `SELECT id, item FROM notes_of ORDER BY id`},
		{"app trigger", testDSN, `CREATE TABLE gone (id TEXT);
CREATE TRIGGER items_gone AFTER DELETE ON items BEGIN INSERT INTO gone VALUES (OLD.id); END`, "", `SELECT count(*) FROM gone`},
		{"rolled back", testDSN, `CREATE UNIQUE INDEX items_title ON items (title)`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := swapDevices(t, tc.dsn, tc.extra, tc.after)
			var before string
			if tc.check != "" {
				before = b.rows(tc.check)
			}
			swap(t, a)
			if tc.name == "rolled back" {
				a.exec(`UPDATE items SET title = 'third' WHERE id = 'i1'`) // b's index refuses it
			}
			a.sync()
			if ids := unwrittenIDs(b.sync()); len(ids) != 2 {
				t.Errorf("b: unwritten %v, want the swap kept unwritten", ids)
			}
			if got := b.rows(`SELECT id, pos, title FROM items ORDER BY id`); got != "i1 | 1 | first\ni2 | 2 | second\ni3 | 3 | third\n" {
				t.Errorf("b's rows: %q, want them as they were", got)
			}
			if tc.check != "" {
				if got := b.rows(tc.check); got != before {
					t.Errorf("b: %s gives %q, was %q", tc.check, got, before)
				}
			}
		})
	}
}

// An app trigger that raises IGNORE skips the engine's write of a row
// without an error: the row kept what it showed, its synced state moved
// on, and nothing was reported, so the devices differed for good in
// silence. A write that changes no row is now a refusal: reported in
// Report.Unwritten and tried again at every sync, as a row a CHECK
// refuses.
//
// Sequence: a and b hold r, title "open"; b's table ignores updates of a
// locked row; b locks r (its own column, not synced); a changes the
// title and syncs; b syncs.
func TestReview20TriggerIgnoreReported(t *testing.T) {
	for _, shape := range []struct{ name, schema string }{
		{"ordinary", `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT)`},
		{"document", `CREATE TABLE items (id TEXT PRIMARY KEY, content JSONB NOT NULL, title TEXT)`},
	} {
		t.Run(shape.name, func(t *testing.T) {
			remote := NewMemoryRemote()
			a := rowsDevice(t, "dev-a", remote, shape.schema, Table{Name: "items"})
			b := rowsDevice(t, "dev-b", remote, shape.schema, Table{Name: "items"})
			b.exec(`CREATE TABLE locked (id TEXT PRIMARY KEY)`)
			b.exec(`CREATE TRIGGER items_locked BEFORE UPDATE ON items WHEN OLD.id IN (SELECT id FROM locked) BEGIN SELECT RAISE(IGNORE); END`)
			if shape.name == "ordinary" {
				a.exec(`INSERT INTO items VALUES ('r', 'open')`)
			} else {
				a.exec(`INSERT INTO items (id, content, title) VALUES ('r', jsonb('{"title":"open"}'), 'open')`)
			}
			syncAll(t, a, b)
			b.exec(`INSERT INTO locked VALUES ('r')`)
			if shape.name == "ordinary" {
				a.exec(`UPDATE items SET title = 'changed'`)
			} else {
				a.exec(`UPDATE items SET content = jsonb('{"title":"changed"}'), title = 'changed'`)
			}
			a.sync()
			r := b.sync()
			if got := b.rows(`SELECT title FROM items`); got != "open\n" {
				t.Fatalf("setup: b's locked row shows %q", got)
			}
			if ids := unwrittenIDs(r); len(ids) != 1 {
				t.Errorf("b: the row its trigger ignored is not reported (unwritten %v)", ids)
			}
			if ids := unwrittenIDs(b.sync()); len(ids) != 1 {
				t.Errorf("b, next sync: unwritten %v, want the row again", ids)
			}
			b.exec(`DELETE FROM locked`)
			b.sync()
			if got := b.rows(`SELECT title FROM items`); got != "changed\n" {
				t.Errorf("b, unlocked: %q, want the synced title", got)
			}
		})
	}
}
