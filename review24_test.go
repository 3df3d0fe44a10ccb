package drivesync

import (
	"context"
	"fmt"
	"testing"
)

// Review 24: writing the rows a table refuses (writeTogether,
// tryTogether, deletesStayInTable, adoptTable).

// inOneTx runs the statements on d in one transaction.
func inOneTx(t *testing.T, d *device, stmts ...string) {
	t.Helper()
	tx, err := d.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range stmts {
		if _, err := tx.Exec(q); err != nil {
			tx.Rollback()
			t.Fatalf("%s: %s: %v", d.name, q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// writeTogether moves a row refused in a try over another UNIQUE than on
// its own to the front of the group. Two rows whose synced states share a
// value of another UNIQUE (here b's index on title) are each refused over
// title once the other is written first: they trade places at every try,
// all 64 tries are spent on them, and the clean swap of i3 and
// i4 in the same group is never written. b reports all four rows at every
// sync and its i3/i4 positions differ from a's for good (i1 and i2 are
// rightly refused: both want title 'same').
//
// Sequence: b adds a UNIQUE index on title; a swaps i1/i2 and i3/i4 and
// gives i1 and i2 the title 'same', in one transaction; all sync.
func TestReview24PingPongBlocksSwap(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE items (id TEXT PRIMARY KEY, pos INTEGER NOT NULL UNIQUE, title TEXT)`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "items"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "items"})
	b.exec(`CREATE UNIQUE INDEX items_title ON items (title)`)
	a.exec(`INSERT INTO items VALUES ('i1', 1, 't1'), ('i2', 2, 't2'), ('i3', 3, 't3'), ('i4', 4, 't4')`)
	syncAll(t, a, b)
	inOneTx(t, a,
		`UPDATE items SET pos = -1 WHERE id = 'i1'`,
		`UPDATE items SET pos = 1, title = 'same' WHERE id = 'i2'`,
		`UPDATE items SET pos = 2, title = 'same' WHERE id = 'i1'`,
		`UPDATE items SET pos = -3 WHERE id = 'i3'`,
		`UPDATE items SET pos = 3 WHERE id = 'i4'`,
		`UPDATE items SET pos = 4 WHERE id = 'i3'`,
	)
	syncAll(t, a, b)
	r := b.sync()
	t.Logf("b unwritten: %v", r.Unwritten)
	if ids := unwrittenIDs(r); fmt.Sprint(ids) != "[items/'i1' items/'i2']" {
		t.Errorf("b: unwritten %v, want i1 and i2 alone", ids)
	}
	q := `SELECT id, pos FROM items WHERE id IN ('i3', 'i4') ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("i3 and i4 diverge for good: b %q, a %q", got, want)
	}
}

// Each try of writeTogether drops one row, and a table gets 64 tries. Rows a UNIQUE refuses for a reason of their own (a value
// held by a row outside the group) still join the group: with 64 of them
// beside a swap, every try is spent removing one, and the swap is never
// written. Review 22's EightRefusalsBlockSwap with 64 rows instead of 8.
//
// Sequence: b adds a UNIQUE index on title; a has j01..j64; a swaps i1
// and i2 and sets the j rows' titles to 'first' (i1's); all sync.
func TestReview24ManyRefusalsBlockSwap(t *testing.T) {
	a, b := swapDevices(t, testDSN, `CREATE UNIQUE INDEX items_title ON items (title)`, "")
	for i := 1; i <= 64; i++ {
		a.exec(fmt.Sprintf(`INSERT INTO items VALUES ('j%02d', %d, 'title %d')`, i, 100+i, i))
	}
	syncAll(t, a, b)
	swap(t, a)
	a.exec(`UPDATE items SET title = 'first' WHERE id LIKE 'j%'`)
	syncAll(t, a, b)
	r := b.sync()
	if ids := unwrittenIDs(r); len(ids) != 64 {
		t.Errorf("b: %d unwritten, want j01..j%d alone", len(ids), 64)
	}
	q := `SELECT id, pos FROM items WHERE id LIKE 'i%' ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("positions diverge for good: b %q, a %q", got, want)
	}
}

// tryTogether deletes the group's rows before writing them again. With
// foreign keys on, a row another table references (a plain REFERENCES,
// NO ACTION, which deletesStayInTable lets through) cannot be deleted:
// the try fails at once, the row leaves the group, and its partner is
// alone. A swap of positions of any row that has a child is never
// written: b reports both rows at every sync and keeps the old order for
// as long as the child exists. The rows' keys never change, so the swap
// breaks no foreign key (PRAGMA defer_foreign_keys in the savepoint, or
// updates instead of delete and insert, would let it through).
//
// Sequence: b (foreign keys on) has a child row of i1 in a table of its
// own; a swaps i1 and i2; all sync.
func TestReview24ReferencedRowsSwapNeverWritten(t *testing.T) {
	a, b := swapDevices(t, fkDSN, `CREATE TABLE notes_of (id TEXT PRIMARY KEY, item TEXT REFERENCES items (id))`,
		`INSERT INTO notes_of VALUES ('c1', 'i1')`)
	swap(t, a)
	syncAll(t, a, b)
	r := b.sync()
	if ids := unwrittenIDs(r); len(ids) != 0 {
		t.Errorf("b: unwritten %v (%v)", ids, r.Unwritten)
	}
	q := `SELECT id, pos FROM items ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("positions diverge for good: b %q, a %q", got, want)
	}
	if got := b.rows(`SELECT id, item FROM notes_of`); got != "c1 | i1\n" {
		t.Errorf("b's child rows: %q", got)
	}
}

// deletesStayInTable looks for app triggers in sqlite_master only. A TEMP
// trigger (sqlite_temp_master) on the engine's connection, here an app
// with one connection (SetMaxOpenConns(1)), is missed: writeTogether
// deletes and writes again the swapped rows, and the app's AFTER DELETE
// trigger logs deletes of rows that were never deleted, which review 20
// (SwapTogetherOnlyWhereSafe) keeps from happening for a trigger in the
// schema.
//
// Sequence: b creates a TEMP trigger logging deletes of items; a swaps
// i1 and i2; all sync.
func TestReview24TempTriggerSeesSwapDeletes(t *testing.T) {
	a, b := swapDevices(t, testDSN, `CREATE TABLE gone (id TEXT)`, "")
	b.db.SetMaxOpenConns(1) // the app's connection, with its TEMP trigger, is the engine's
	b.exec(`CREATE TEMP TRIGGER items_gone AFTER DELETE ON main.items BEGIN INSERT INTO gone VALUES (OLD.id); END`)
	swap(t, a)
	syncAll(t, a, b)
	if got := b.rows(`SELECT id FROM gone ORDER BY id`); got != "" {
		t.Errorf("b's app trigger logged deletes of rows never deleted: %q", got)
	}
}

// writeTogether leaves alone every table that has any app trigger. The
// README tells apps to guard a trigger that writes a synced table (an
// updated_at touch) with WHEN (SELECT is_syncing FROM sync_control) = 0:
// such a trigger never fires for the engine's writes, yet its presence
// keeps every swap of a UNIQUE value on the table unwritten on every
// device but the one that made it, reported at every sync, for good.
//
// Sequence: a and b have the README's guarded touch trigger; a swaps i1
// and i2; all sync.
func TestReview24GuardedTriggerBlocksSwap(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE items (id TEXT PRIMARY KEY, pos INTEGER NOT NULL UNIQUE, title TEXT, updated_at INTEGER NOT NULL DEFAULT 0)`
	touch := `CREATE TRIGGER items_touch AFTER UPDATE OF pos, title ON items WHEN (SELECT is_syncing FROM sync_control) = 0
BEGIN UPDATE items SET updated_at = updated_at + 1 WHERE id = NEW.id; END`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "items"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "items"})
	a.exec(touch)
	b.exec(touch)
	a.exec(`INSERT INTO items (id, pos, title) VALUES ('i1', 1, 'first'), ('i2', 2, 'second')`)
	syncAll(t, a, b)
	swap(t, a)
	syncAll(t, a, b)
	r := b.sync()
	if ids := unwrittenIDs(r); len(ids) != 0 {
		t.Errorf("b: unwritten %v at every sync", ids)
	}
	q := `SELECT id, pos, title, updated_at FROM items ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("rows diverge for good: b %q, a %q", got, want)
	}
}

// adoptTable writes a newly registered document table's synced records
// with one INSERT OR IGNORE ... SELECT, counting on OR IGNORE to skip the
// rows the table refuses. OR IGNORE does not apply to foreign keys (nor
// to an app trigger's RAISE(ABORT)): one record whose parent row is
// missing, with foreign keys on, fails the whole statement, and Open
// fails, at every start, for as long as the record exists. The README
// says such a row is reported in Report.Unwritten; adoptRows (ordinary
// tables) does that, row by row.
//
// Sequence: b (foreign keys on) syncs folders only; b deletes folder f1;
// a adds note n1 in f1; all sync; b's app registers notes and opens.
func TestReview24AdoptDocumentOrphanFailsOpen(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE folders (id TEXT PRIMARY KEY, name TEXT);
CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL, folder TEXT REFERENCES folders (id))`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "folders"}, Table{Name: "notes"})
	b := rowsDeviceOn(t, fkDSN, "dev-b", remote, schema, Table{Name: "folders"})
	a.exec(`INSERT INTO folders VALUES ('f1', 'inbox')`)
	syncAll(t, a, b)
	b.exec(`DELETE FROM folders WHERE id = 'f1'`) // b's app deletes the folder; a has not seen it yet
	a.exec(`INSERT INTO notes (id, content) VALUES ('n1', jsonb('{"folder":"f1","title":"hello"}'))`)
	a.sync()
	b.sync() // n1 waits in sync_states: b does not sync notes yet
	b.eng.Close()
	b.cfg.Tables = []Table{{Name: "folders"}, {Name: "notes"}} // the app's next version syncs notes
	eng, err := Open(context.Background(), b.db, b.cfg)
	if err != nil {
		t.Fatalf("b cannot open once it syncs notes, at every start: %v", err)
	}
	b.eng = eng
	r := b.sync()
	if ids := unwrittenIDs(r); fmt.Sprint(ids) != "[notes/n1]" {
		t.Errorf("b: unwritten %v, want n1 (its folder is gone here)", ids)
	}
}

// Foreign keys are deferred for a swap only where every reference to the
// table names its primary key, which rows written again keep. A child
// that references the UNIQUE column being swapped would point at another
// item after the swap: such a table's swap stays refused, reported, and
// the sync still commits, with no child pointing nowhere.
func TestReview24SwapOfReferencedValueStaysRefused(t *testing.T) {
	a, b := swapDevices(t, fkDSN, `CREATE TABLE marks (id TEXT PRIMARY KEY, at INTEGER REFERENCES items (pos))`,
		`INSERT INTO marks VALUES ('m1', 1)`)
	swap(t, a)
	syncAll(t, a, b)
	r := b.sync()
	if ids := unwrittenIDs(r); fmt.Sprint(ids) != "[items/'i1' items/'i2']" {
		t.Errorf("b: unwritten %v, want the swap refused", ids)
	}
	if got := b.rows(`SELECT count(*) FROM marks WHERE at NOT IN (SELECT pos FROM items)`); got != "0\n" {
		t.Errorf("b: %s marks point nowhere", got)
	}
	if got := b.rows(`SELECT id, pos FROM items ORDER BY id`); got != "i1 | 1\ni2 | 2\ni3 | 3\n" {
		t.Errorf("b's items: %q, want them as they were", got)
	}
}
