package drivesync

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
)

// Review 11: sync_placed, receivedImmutable, writeNewColumns, keyTypes,
// Open's refusals, the key check in the mark.

const dotsFKSchema = `CREATE TABLE pics (uuid TEXT PRIMARY KEY);
CREATE TABLE dots (
	uuid TEXT NOT NULL REFERENCES pics (uuid), gen INTEGER NOT NULL, pixel_data BLOB NOT NULL, crc32_u32 INTEGER NOT NULL,
	PRIMARY KEY (uuid, gen))`

// c receives a's dot before its parent (pics is the app's own, unsynced):
// the write is refused, but keepImmutable has already recorded the key in
// sync_placed, which no rollback undoes. c's app then creates the parent
// and writes its own dot under that key (a different payload): the row is
// taken for one the engine placed, and the next sync overwrites it with
// a's payload, reporting no conflict. c's own payload is gone.
func TestReview11RefusedPlacementMarksAppRowPlaced(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDeviceOn(t, fkDSN, "dev-a", remote, dotsFKSchema, dotsTable)
	c := rowsDeviceOn(t, fkDSN, "dev-c", remote, dotsFKSchema, dotsTable)
	a.exec(`INSERT INTO pics VALUES ('K')`)
	a.exec(`INSERT INTO dots VALUES ('K', 0, X'AA', 1)`)
	a.sync()
	if r := c.sync(); len(r.Unwritten) != 1 {
		t.Fatalf("c: Unwritten %v, want the dot refused for its missing parent", r.Unwritten)
	}
	if got := c.rows(`SELECT count(*) FROM sync_placed`); got != "0\n" {
		t.Errorf("c: sync_placed holds %q rows for a row the engine never placed", got)
	}
	c.exec(`INSERT INTO pics VALUES ('K')`)
	c.exec(`INSERT INTO dots VALUES ('K', 0, X'CC', 3)`)
	r := c.sync()
	if got := c.rows(`SELECT hex(pixel_data), crc32_u32 FROM dots`); got != "CC | 3\n" {
		t.Errorf("c: row %q, want the app's own payload CC | 3 kept (an append-only row the app wrote never changes)", got)
	}
	if got := conflicts(r); len(got) != 1 {
		t.Errorf("c: conflicts %v, want the key reported (c's payload differs from the synced one)", got)
	}
}

// INSERT OR REPLACE over a row the engine placed: REPLACE deletes without
// the delete trigger, so the row written is the app's, as over a row of
// the app's (TestAppendOnlyRefusesChanges: kept and reported). But
// sync_placed still names the key, and the next sync overwrites the
// app's payload with the synced one, reporting nothing.
func TestReview11ReplaceOverPlacedRowLost(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDevice(t, "dev-a", remote, dotsSchema, dotsTable)
	b := rowsDevice(t, "dev-b", remote, dotsSchema, dotsTable)
	c := rowsDevice(t, "dev-c", remote, dotsSchema, dotsTable)
	a.exec(`INSERT INTO dots VALUES ('K', 0, X'AA', 1)`)
	a.sync()
	c.sync() // placed
	c.exec(`INSERT OR REPLACE INTO dots VALUES ('K', 0, X'CC', 3)`)
	r := c.sync()
	if got := conflicts(r); len(got) != 1 {
		t.Errorf("c: conflicts %v after REPLACE: want its payload CC (unlike the synced AA) reported, as over a row of its own", got)
	}
	// b, which had not seen a's, writes the key too: its payload arrives
	// at c, which takes its row for the engine's.
	b.exec(`INSERT INTO dots VALUES ('K', 0, X'BB', 2)`)
	b.sync()
	r = c.sync()
	if got := c.rows(`SELECT hex(pixel_data), crc32_u32 FROM dots`); got != "CC | 3\n" {
		t.Errorf("c: row %q (conflicts %v), want the app's REPLACEd payload CC | 3: a row the app wrote never changes", got, conflicts(r))
	}
}

// A TEXT key 'inf' (or 'NaN', '0x1p3', one with a leading no-break
// space) in an INTEGER or NUMERIC column stays TEXT (SQLite's affinity
// converts only what it reads as a number), and the trigger accepts it.
// But decodeKey's affinity check reads it with strconv.ParseFloat, which
// accepts it, and refuses the id: the plan takes the row for "no key of
// the table", sends nothing, clears its mark, and reports nothing. b
// never gets the row.
func TestReview11NumberLikeTextKeyNeverSent(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE t (k TEXT NOT NULL, at DATETIME NOT NULL, v TEXT, PRIMARY KEY (k, at))`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "t"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "t"})
	for _, at := range []string{"infinity", "NaN", "0x1p3", "\u00a012", "2026-01-01"} {
		a.exec(`INSERT INTO t VALUES ('x', ?, 'v')`, at)
	}
	if got := a.rows(`SELECT DISTINCT typeof(at) FROM t`); got != "text\n" {
		t.Fatalf("a: key types %q, want text only", got)
	}
	r := a.sync()
	b.sync()
	want := a.rows(typedDump("t", "k", "at", "v"))
	if got := b.rows(typedDump("t", "k", "at", "v")); got != want {
		t.Errorf("b holds\n%s\nwant a's rows\n%s(a's report: Skipped %v, pending left %d)", got, want, r.Skipped, a.pendingCount())
	}
}

// A deferred foreign key in a table the engine does not sync, whose
// parent is a synced table: a delete another device made of the parent
// row would pass its statement and fail the sync's commit, at every sync.
// Open refuses the synced table, naming the table that declares the key.
// (An immediate foreign key refuses the delete, which is then reported in
// Report.Unwritten.)
func TestReview11DeferredChildOfSyncedTableStuck(t *testing.T) {
	schema := `CREATE TABLE items (k TEXT PRIMARY KEY, v TEXT);
CREATE TABLE local_refs (r TEXT REFERENCES items (k) DEFERRABLE INITIALLY DEFERRED)`
	db, err := sql.Open("sqlite", fkDSN(filepath.Join(t.TempDir(), "b.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(schema); err != nil {
		t.Fatal(err)
	}
	_, err = Open(context.Background(), db, Config{Remote: NewMemoryRemote(), Tables: []Table{{Name: "items"}}})
	if err == nil || !strings.Contains(err.Error(), "table local_refs declares a foreign key DEFERRABLE INITIALLY DEFERRED") {
		t.Errorf("Open = %v, want the deferred key of local_refs, which refers to items, refused", err)
	}
}

// Open's deferred-key check searches the table's SQL text: the words in a
// comment or a CHECK's string refuse a valid schema.
func TestReview11DeferredWordsInCommentRefused(t *testing.T) {
	for _, schema := range []string{
		"CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT -- never INITIALLY DEFERRED: the engine checks rows as it writes\n)",
		`CREATE TABLE t (k TEXT PRIMARY KEY, mode TEXT CHECK (mode IN ('immediate', 'initially deferred')))`,
	} {
		db, err := sql.Open("sqlite", testDSN(filepath.Join(t.TempDir(), "a.db")))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(schema); err != nil {
			t.Fatal(err)
		}
		_, err = Open(context.Background(), db, Config{Remote: NewMemoryRemote(), Tables: []Table{{Name: "t"}}, DeviceID: "dev-a", TempDir: t.TempDir()})
		if err != nil && strings.Contains(err.Error(), "DEFERRED") {
			t.Errorf("Open refused a schema with no deferred foreign key: %v", err)
		}
	}
}

// An app version that registers dots without AppendOnly deletes a row.
// c, which wrote nothing under the key (its row placed by the engine),
// keeps the row and reports a conflict of its own; d, a new device, holds
// no row (it bootstraps from a snapshot a wrote after the delete): two
// bystanders differ for ever, though a placed row is to follow the synced
// record. (A new device that reads a's two patch files instead keeps the
// row and reports the conflict too.)
func TestReview11PlacedRowKeptOverDeleteBystandersDiffer(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDevice(t, "dev-a", remote, dotsSchema, Table{Name: "dots"}) // an app version without AppendOnly
	c := rowsDevice(t, "dev-c", remote, dotsSchema, dotsTable)
	a.exec(`INSERT INTO dots VALUES ('K', 0, X'AA', 1)`)
	a.sync()
	c.sync() // placed
	a.exec(`DELETE FROM dots`)
	a.sync()
	r := c.sync()
	if _, err := a.eng.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	d := rowsDevice(t, "dev-d", remote, dotsSchema, dotsTable)
	d.sync()
	q := `SELECT hex(pixel_data), crc32_u32 FROM dots`
	if got, want := c.rows(q), d.rows(q); got != want || len(conflicts(r)) != 0 {
		t.Errorf("bystanders differ: c holds %q (conflicts %v), d holds %q", got, conflicts(r), want)
	}
}

// b runs an app version whose items lacks note, then one that does not
// sync items, then one that adds note (constant default) and syncs items
// again. While items was unregistered, a changed note; the record's row
// is in sync_unwritten, kept with what it showed (a's earlier note among
// the record's members). writeNewColumns skips every row in
// sync_unwritten, so the row keeps the default; markEditedRows then finds
// it unlike what it showed and marks it pending, and the next sync sends
// the default as b's edit over a's note, on every device.
func TestReview11NewColumnDefaultSentAfterReregistration(t *testing.T) {
	remote := NewMemoryRemote()
	newSchema := `CREATE TABLE items (k TEXT PRIMARY KEY, v TEXT, note TEXT DEFAULT 'none'); CREATE TABLE other (k TEXT PRIMARY KEY, v TEXT)`
	oldSchema := `CREATE TABLE items (k TEXT PRIMARY KEY, v TEXT); CREATE TABLE other (k TEXT PRIMARY KEY, v TEXT)`
	a := rowsDevice(t, "dev-a", remote, newSchema, Table{Name: "items"}, Table{Name: "other"})
	b := rowsDevice(t, "dev-b", remote, oldSchema, Table{Name: "items"}, Table{Name: "other"})
	a.exec(`INSERT INTO items VALUES ('K', '1', 'w')`)
	a.sync()
	b.sync()
	// b: an app version that does not sync items.
	b.cfg.Tables = []Table{{Name: "other"}}
	b.open()
	a.exec(`UPDATE items SET note = 'x'`)
	a.sync()
	b.sync()
	// b: an app version that adds note and syncs items again.
	b.exec(`ALTER TABLE items ADD COLUMN note TEXT DEFAULT 'none'`)
	b.cfg.Tables = []Table{{Name: "items"}, {Name: "other"}}
	b.dumped = []string{"items", "other"}
	b.open()
	syncAll(t, a, b)
	want := "text:'K' | text:'1' | text:'x'\n"
	for _, d := range []*device{a, b} {
		if got := d.rows(typedDump("items", "k", "v", "note")); got != want {
			t.Errorf("%s: %q, want a's note %q (b never wrote it)", d.name, got, want)
		}
	}
}
