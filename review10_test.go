package drivesync

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// Review 10: ordinary tables, merge rules, append-only tables.

// An append-only key written with different payloads by a and b: c, which
// wrote neither, syncs between a's upload and b's. It keeps a's payload
// (and reports a conflict of its own), while d, which syncs after both,
// holds b's: the rows of two bystanders differ for ever, though the
// README says a device that wrote neither holds the later payload.
func TestReview10AppendOnlyBystanderBetweenUploads(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDevice(t, "dev-a", remote, dotsSchema, dotsTable)
	b := rowsDevice(t, "dev-b", remote, dotsSchema, dotsTable)
	c := rowsDevice(t, "dev-c", remote, dotsSchema, dotsTable)
	d := rowsDevice(t, "dev-d", remote, dotsSchema, dotsTable)
	a.exec(`INSERT INTO dots VALUES ('E', 1, X'0A', 10)`)
	b.exec(`INSERT INTO dots VALUES ('E', 1, X'0B', 11)`)
	a.sync()
	c.sync() // c has a's payload only
	b.sync() // b's create is stamped later: the synced payload is b's
	a.sync()
	c.sync()
	d.sync()
	q := `SELECT hex(pixel_data), crc32_u32 FROM dots`
	if got, want := c.rows(q), d.rows(q); got != want {
		t.Errorf("bystanders differ: c holds %q, d holds %q (c reports conflicts %v)", got, want, conflicts(c.sync()))
	}
	if got := conflicts(c.sync()); len(got) != 0 {
		t.Errorf("c reports conflicts %v though it wrote nothing under the key", got)
	}
}

// A TEXT key that is not valid UTF-8 passes the triggers (only NUL is
// refused), but the record id goes into the patch file as a JSON string,
// where its invalid bytes become U+FFFD: the receiver writes the row
// under another key and holds the record under another id.
func TestReview10InvalidUTF8TextKey(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "t"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "t"})
	a.exec(`INSERT INTO t VALUES (CAST(X'FF61' AS TEXT), 'x')`)
	a.exec(`INSERT INTO t VALUES ('fine', 'y')`)
	r := a.sync()
	if len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0].Err.Error(), "not valid UTF-8") {
		t.Errorf("a: Skipped %v, want the row whose key is not UTF-8, named", r.Skipped)
	}
	b.sync()
	if got := b.rows(`SELECT hex(k), v FROM t`); got != upperHex("fine")+" | y\n" {
		t.Errorf("b: %q, want the other row only: no key arrives changed", got)
	}
	if n := a.pendingCount(); n != 1 {
		t.Errorf("a: %d pending, want the refused row kept pending", n)
	}
}

func upperHex(s string) string { return strings.ToUpper(fmt.Sprintf("%x", s)) }

// A record id whose key part has the wrong type for its column ('0' for
// the INTEGER gen) is not refused: decodeKey takes it, and the column's
// affinity turns '0' into 0 when the row is written or looked up, so the
// record "'u','0'" writes the row of the record "'u',0". A device that
// applies the hostile file after the genuine record shows the hostile
// title, one that applies it before shows the genuine one: rows diverge,
// while sync_states agree.
func TestReview10HostileKeyOfWrongTypeAliasesRow(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE t (uuid TEXT NOT NULL, gen INTEGER NOT NULL, title TEXT, PRIMARY KEY (uuid, gen))`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "t"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "t"})
	writeRaw(t, remote, evilName, true, evilFile(
		`{"table_name":"t","record_id":"'u','0'","patch":{"title":"evil"},"is_deleted":false,"sync_version":50}`))
	a.exec(`INSERT INTO t VALUES ('u', 0, 'good')`)
	a.sync() // its own row first, then the hostile record over it
	b.sync() // the hostile record first, then a's
	syncAll(t, a, b)
	q := typedDump("t", "uuid", "gen", "title")
	if got, want := a.rows(q), b.rows(q); got != want {
		t.Errorf("rows diverge: a %q, b %q", got, want)
	}
	if got := a.rows(q); strings.Contains(got, "evil") {
		t.Errorf("a: %q: a record of another key overwrote the row of 'u',0", got)
	}
}

// INSERT OR REPLACE that collides on a UNIQUE column other than the key
// deletes the other row without firing the delete trigger (SQLite fires
// delete triggers for REPLACE only with recursive_triggers on), so the
// delete of that record is never captured or sent: the other device keeps
// the row for ever.
func TestReview10ReplaceOnUniqueColumnDeleteNotSent(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE users (id TEXT PRIMARY KEY, email TEXT UNIQUE, name TEXT)`
	// The README's DSN turns recursive_triggers on: without it REPLACE
	// deletes the other row without any delete trigger.
	dsn := func(p string) string { return testDSN(p) + "&_pragma=recursive_triggers(1)" }
	a := rowsDeviceOn(t, dsn, "dev-a", remote, schema, Table{Name: "users"})
	b := rowsDeviceOn(t, dsn, "dev-b", remote, schema, Table{Name: "users"})
	a.exec(`INSERT INTO users VALUES ('u1', 'x@example.com', 'old account')`)
	syncAll(t, a, b)
	a.exec(`INSERT OR REPLACE INTO users VALUES ('u2', 'x@example.com', 'new account')`)
	syncAll(t, a, b)
	q := typedDump("users", "id", "email", "name")
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("b %q, a %q: the row REPLACE deleted on a is still on b", got, want)
	}
	assertConverged(t, a, b)
}

// A real schema keeps updated_at with a trigger of its own. The engine's
// writes of received rows fire it too (only the capture triggers are
// silenced), with the capture triggers quiet, so each receiver's row gets
// a value of its own that is never sent nor corrected: after every device
// synced the same files, the rows differ (here a random stamp, as a
// sub-second clock would be).
func TestReview10AppTriggerRowsDiverge(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT, stamp TEXT);
CREATE TRIGGER t_touch AFTER UPDATE OF title ON t WHEN (SELECT is_syncing FROM sync_control) = 0 BEGIN
	UPDATE t SET stamp = hex(randomblob(8)) WHERE id = NEW.id;
END;`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "t"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "t"})
	c := rowsDevice(t, "dev-c", remote, schema, Table{Name: "t"})
	a.exec(`INSERT INTO t VALUES ('x', 'one', NULL)`)
	syncAll(t, a, b, c)
	a.exec(`UPDATE t SET title = 'two' WHERE id = 'x'`)
	syncAll(t, a, b, c)
	q := typedDump("t", "id", "title", "stamp")
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("b %q, a %q", got, want)
	}
	if got, want := c.rows(q), b.rows(q); got != want {
		t.Errorf("c %q, b %q", got, want)
	}
}

// A device upgrades (ALTER TABLE ADD COLUMN) while a row of it is pending
// (the user edited it offline on the old version). writeNewColumns skips
// pending rows, so the row keeps the column's default; the state holds
// the value another device wrote, so the next sync diffs the default
// against it and sends it as an edit: the other device's value is lost
// everywhere.
func TestReview10UpgradeWithPendingRowSendsDefault(t *testing.T) {
	remote := NewMemoryRemote()
	older := `CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT)`
	newer := `CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT, color TEXT NOT NULL DEFAULT 'red')`
	a := rowsDevice(t, "dev-a", remote, older, Table{Name: "t"})
	b := rowsDevice(t, "dev-b", remote, newer, Table{Name: "t"})
	a.exec(`INSERT INTO t VALUES ('x', 'one')`)
	syncAll(t, a, b)
	b.exec(`UPDATE t SET color = 'blue'`)
	syncAll(t, a, b)
	a.exec(`UPDATE t SET title = 'two'`) // offline edit, then the upgrade
	a.exec(`ALTER TABLE t ADD COLUMN color TEXT NOT NULL DEFAULT 'red'`)
	a.open()
	syncAll(t, a, b)
	for _, d := range []*device{a, b} {
		if got := d.rows(`SELECT id, title, color FROM t`); got != "x | two | blue\n" {
			t.Errorf("%s: %q, want a's title and b's color", d.name, got)
		}
	}
}

// The same loss through re-registration: a syncs t on an older version,
// receives b's value of the newer column, then runs a version that does
// not sync t, then one that syncs it again and has the column. The
// re-registration compares the row (the column's default) with the synced
// state (b's value), marks it edited, and the default goes out over b's
// value.
func TestReview10ReregisterWithAddedColumn(t *testing.T) {
	remote := NewMemoryRemote()
	older := `CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT); CREATE TABLE other (id TEXT PRIMARY KEY, v TEXT)`
	newer := `CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT, color TEXT NOT NULL DEFAULT 'red'); CREATE TABLE other (id TEXT PRIMARY KEY, v TEXT)`
	a := rowsDevice(t, "dev-a", remote, older, Table{Name: "t"}, Table{Name: "other"})
	b := rowsDevice(t, "dev-b", remote, newer, Table{Name: "t"}, Table{Name: "other"})
	a.exec(`INSERT INTO t VALUES ('x', 'one')`)
	syncAll(t, a, b)
	b.exec(`UPDATE t SET color = 'blue'`)
	syncAll(t, a, b)
	a.cfg.Tables = []Table{{Name: "other"}} // a version that does not sync t
	a.open()
	a.exec(`ALTER TABLE t ADD COLUMN color TEXT NOT NULL DEFAULT 'red'`)
	a.cfg.Tables = []Table{{Name: "t"}, {Name: "other"}}
	a.open()
	syncAll(t, a, b)
	for _, d := range []*device{a, b} {
		if got := d.rows(`SELECT id, title, color FROM t`); got != "x | one | blue\n" {
			t.Errorf("%s: %q, want b's color", d.name, got)
		}
	}
}

// An append-only table gains a column in a newer app version. The older
// device a received b's rows (their records hold the new column) and
// upgrades: writeNewColumns writes the column's values through
// keepImmutable, which compares the whole row with the added values
// alone, finds them different and records a conflict. a's row never gets
// the value, and a reports a conflict at every sync for a row nobody
// wrote twice.
func TestReview10AppendOnlyColumnAddedIsAConflict(t *testing.T) {
	remote := NewMemoryRemote()
	older := `CREATE TABLE dots (uuid TEXT NOT NULL, gen INTEGER NOT NULL, pixel_data BLOB NOT NULL, PRIMARY KEY (uuid, gen))`
	newer := `CREATE TABLE dots (uuid TEXT NOT NULL, gen INTEGER NOT NULL, pixel_data BLOB NOT NULL, note TEXT, PRIMARY KEY (uuid, gen))`
	a := rowsDevice(t, "dev-a", remote, older, dotsTable)
	b := rowsDevice(t, "dev-b", remote, newer, dotsTable)
	b.exec(`INSERT INTO dots VALUES ('A', 0, X'01', 'hello')`)
	syncAll(t, a, b)
	a.exec(`ALTER TABLE dots ADD COLUMN note TEXT`)
	a.open()
	r := a.sync()
	if got := conflicts(r); len(got) != 0 {
		t.Errorf("a after its upgrade: conflicts %v", got)
	}
	if got := a.rows(`SELECT uuid, gen, hex(pixel_data), note FROM dots`); got != "A | 0 | 01 | hello\n" {
		t.Errorf("a: %q, want the note b wrote", got)
	}
}

// Two devices append the same payload under one key, large enough that
// it goes out in parts (over the store's MaxRecordSize). receivedImmutable
// compares the device's whole row with each part alone, so the same
// payload is reported as a conflict on both, for ever.
func TestReview10AppendOnlySamePayloadInPartsIsAConflict(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE dots (uuid TEXT NOT NULL, gen INTEGER NOT NULL, p1 BLOB NOT NULL, p2 BLOB NOT NULL, PRIMARY KEY (uuid, gen))`
	a := rowsDevice(t, "dev-a", remote, schema, dotsTable)
	a.cfg.Limits = Limits{MaxRecordSize: 1024}
	a.open()
	a.sync() // creates the store with its limits
	b := rowsDevice(t, "dev-b", remote, schema, dotsTable)
	for _, d := range []*device{a, b} {
		d.exec(`INSERT INTO dots VALUES ('A', 0, zeroblob(600), zeroblob(600))`)
	}
	a.sync()
	b.sync()
	for _, d := range []*device{a, b} {
		if got := conflicts(d.sync()); len(got) != 0 {
			t.Errorf("%s: conflicts %v for the same payload", d.name, got)
		}
	}
}

// A database in a UTF-16 encoding (PRAGMA encoding, a legitimate SQLite
// choice): typedValue reads TEXT as CAST(x AS BLOB), which gives the
// text's UTF-16 bytes; they are taken for the text itself and sent. The
// receiver stores 'h', NUL, 0xE9, NUL... instead of 'héllo'.
func TestReview10UTF16DatabaseTextCorrupted(t *testing.T) {
	schema := `CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)`
	utf16 := func(p string) string {
		return "file:" + p + "?_pragma=encoding('UTF-16le')&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	}
	db, err := sql.Open("sqlite", utf16(filepath.Join(t.TempDir(), "u.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(schema); err != nil {
		t.Fatal(err)
	}
	_, err = Open(t.Context(), db, Config{Remote: NewMemoryRemote(), Tables: []Table{{Name: "t"}}})
	if err == nil || !strings.Contains(err.Error(), "UTF-16le") {
		t.Errorf("Open = %v, want a UTF-16 database refused, naming its encoding", err)
	}
}

// Foreign keys declared DEFERRABLE INITIALLY DEFERRED (a common way to
// let rows arrive in any order) are checked at COMMIT, not when the
// engine writes the row: a child whose parent another device deleted
// meanwhile is not refused row by row (Report.Unwritten) but fails the
// sync's whole transaction, at every sync, on both devices: they are
// stuck, and b's new row never reaches a.
func TestReview10DeferredForeignKeyStuck(t *testing.T) {
	schema := `CREATE TABLE parents (id TEXT PRIMARY KEY, name TEXT);
CREATE TABLE children (id TEXT PRIMARY KEY,
	parent TEXT NOT NULL REFERENCES parents(id) DEFERRABLE INITIALLY DEFERRED, title TEXT);`
	d := rowsDevice(t, "dev-a", NewMemoryRemote(), `CREATE TABLE other (id TEXT PRIMARY KEY, v TEXT);`+schema, Table{Name: "other"})
	cfg := d.cfg
	cfg.Tables = []Table{{Name: "parents"}, {Name: "children"}}
	if _, err := Open(t.Context(), d.db, cfg); err == nil || !strings.Contains(err.Error(), "table children declares a foreign key DEFERRABLE INITIALLY DEFERRED") {
		t.Errorf("Open = %v, want the deferred foreign key refused, naming the table", err)
	}
}

// A TEXT key with COLLATE NOCASE (case-insensitive tags, emails): 'Red'
// and 'red' are two records (their ids differ) but one row, and the
// engine finds and upserts rows by the column's collation. Two devices
// that create them concurrently each keep their own spelling of the key,
// with the other's values written into it: the rows diverge.
func TestReview10NocaseKeyDiverges(t *testing.T) {
	d := rowsDevice(t, "dev-a", NewMemoryRemote(), `CREATE TABLE other (id TEXT PRIMARY KEY, v TEXT);
CREATE TABLE tags (name TEXT COLLATE NOCASE PRIMARY KEY, color TEXT);
CREATE TABLE pairs (a TEXT, b TEXT COLLATE RTRIM, PRIMARY KEY (a, b)) WITHOUT ROWID`, Table{Name: "other"})
	for _, table := range []string{"tags", "pairs"} {
		cfg := d.cfg
		cfg.Tables = []Table{{Name: table}}
		if _, err := Open(t.Context(), d.db, cfg); err == nil || !strings.Contains(err.Error(), "compares with COLLATE") {
			t.Errorf("%s: Open = %v, want the key's collation refused", table, err)
		}
	}
}

// Trigger names are sync_trg_<table>_<op>: the append-only table dots has
// sync_trg_dots_immutable_update, which is also the capture trigger of a
// table named dots_immutable (op "update"). One definition replaces the
// other: either dots_immutable's updates are never captured (never sent),
// or dots' rows can be updated.
func TestReview10TriggerNameCollision(t *testing.T) {
	remote := NewMemoryRemote()
	schema := dotsSchema + `; CREATE TABLE dots_immutable (id TEXT PRIMARY KEY, v TEXT)`
	a := rowsDevice(t, "dev-a", remote, schema, dotsTable, Table{Name: "dots_immutable"})
	a.exec(`INSERT INTO dots VALUES ('A', 0, X'01', 1)`)
	a.exec(`INSERT INTO dots_immutable VALUES ('x', 'one')`)
	a.sync()
	if _, err := a.db.Exec(`UPDATE dots SET crc32_u32 = 2`); err == nil {
		t.Errorf("an append-only row was updated")
	}
	a.exec(`UPDATE dots_immutable SET v = 'two'`)
	var n int
	a.db.QueryRow(`SELECT count(*) FROM ` + pendingUnion + ` WHERE table_name = 'dots_immutable'`).Scan(&n)
	if n != 1 {
		t.Errorf("%d pending after an update of dots_immutable, want 1: the update was not captured", n)
	}
}
