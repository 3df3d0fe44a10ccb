package drivesync

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// Ordinary tables: any primary key, the columns as they are.

const itemsSchema = `CREATE TABLE items (
	uuid  TEXT NOT NULL,
	gen   INTEGER NOT NULL,
	title TEXT,
	score REAL,
	data  BLOB,
	n     INTEGER,
	note,
	PRIMARY KEY (uuid, gen)
);
CREATE TABLE kv (k, v, PRIMARY KEY (k)) WITHOUT ROWID;`

// rowsDevice is a device syncing the given tables of its own schema.
func rowsDevice(t testing.TB, name string, remote Remote, schema string, tables ...Table) *device {
	t.Helper()
	return rowsDeviceOn(t, testDSN, name, remote, schema, tables...)
}

// rowsDeviceOn is rowsDevice with the DSN dsn gives for its file.
func rowsDeviceOn(t testing.TB, dsn func(string) string, name string, remote Remote, schema string, tables ...Table) *device {
	t.Helper()
	d := openDevice(t, dsn, name, remote, []string{schema}, tables)
	for _, tb := range tables {
		d.dumped = append(d.dumped, tb.Name)
	}
	return d
}

// rows dumps a query's rows, each value as quote() writes it with its
// type: exact for every SQLite value (quote writes REALs that read back
// bit for bit).
func (d *device) rows(query string, args ...any) string {
	d.t.Helper()
	rows, err := d.db.Query(query, args...)
	if err != nil {
		d.t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var b strings.Builder
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			d.t.Fatal(err)
		}
		for i, v := range vals {
			if i > 0 {
				b.WriteString(" | ")
			}
			if bs, ok := v.([]byte); ok {
				v = string(bs)
			}
			fmt.Fprint(&b, v)
		}
		b.WriteString("\n")
	}
	if err := rows.Err(); err != nil {
		d.t.Fatal(err)
	}
	return b.String()
}

func typedDump(table string, cols ...string) string {
	sel := make([]string, len(cols))
	for i, c := range cols {
		sel[i] = fmt.Sprintf("typeof(%[1]s) || ':' || quote(%[1]s)", c)
	}
	return fmt.Sprintf("SELECT %s FROM %s ORDER BY %s", strings.Join(sel, ", "), table, strings.Join(cols, ", "))
}

var itemsDump = typedDump("items", "uuid", "gen", "title", "score", "data", "n", "note")
var kvDump = typedDump("kv", "k", "v")

func TestOrdinaryValuesRoundTrip(t *testing.T) {
	remote := NewMemoryRemote()
	tables := []Table{{Name: "items"}, {Name: "kv"}}
	a := rowsDevice(t, "dev-a", remote, itemsSchema, tables...)
	b := rowsDevice(t, "dev-b", remote, itemsSchema, tables...)
	a.exec(`INSERT INTO items VALUES
		('u1', 0, 'it''s "quoted" ✓', 0.1, X'00FF10', 9223372036854775807, NULL),
		('u1', 1, '', 1e300, X'', -9223372036854775808, X'CAFE'),
		('u2', 0, NULL, 100.0, NULL, '12abc', 2.5),
		('u3', 7, 'tab	new
line', 9e999, zeroblob(3), 12.0, 'text'),
		('u4', 0, CAST(X'FF61' AS TEXT), -9e999, CAST('blob' AS BLOB), NULL, 1)`)
	a.exec(`INSERT INTO kv VALUES (1, 'integer one'), ('1', 'text one'), (X'01', 'blob one'), ('', NULL)`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	for _, q := range []string{itemsDump, kvDump} {
		got, want := b.rows(q), a.rows(q)
		if got != want {
			t.Errorf("received rows differ:\n%s\nwant\n%s", got, want)
		}
	}
	if n := strings.Count(b.rows(kvDump), "\n"); n != 4 {
		t.Errorf("kv holds %d rows, want 4: the keys 1, '1' and X'01' are different records", n)
	}
	// Values written back by the receiver are the same values: a second
	// round trip changes nothing.
	b.exec(`UPDATE items SET title = 'b' WHERE uuid = 'u2'`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got, want := a.rows(itemsDump), b.rows(itemsDump); got != want {
		t.Errorf("after b's edit:\n%s\nwant\n%s", got, want)
	}
}

func TestOrdinaryColumnsMergeOnTheirOwn(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDevice(t, "dev-a", remote, itemsSchema, Table{Name: "items"})
	b := rowsDevice(t, "dev-b", remote, itemsSchema, Table{Name: "items"})
	a.exec(`INSERT INTO items (uuid, gen, title, score, n) VALUES ('u', 0, 'first', 1.0, 5)`)
	syncAll(t, a, b)
	a.exec(`UPDATE items SET title = 'a title'`)
	b.exec(`UPDATE items SET score = 2.5, n = NULL`)
	a.sync()
	b.sync()
	a.sync()
	assertConverged(t, a, b)
	want := "text:'u' | integer:0 | text:'a title' | real:2.5 | null:NULL | null:NULL | null:NULL\n"
	if got := a.rows(itemsDump); got != want {
		t.Errorf("merged row:\n%s\nwant\n%s", got, want)
	}
	// The same column on both: the device that syncs later wins.
	a.exec(`UPDATE items SET title = 'from a'`)
	b.exec(`UPDATE items SET title = 'from b'`)
	a.sync()
	b.sync()
	a.sync()
	assertConverged(t, a, b)
	if got := a.rows(`SELECT title FROM items`); got != "from b\n" {
		t.Errorf("title = %q, want b's, synced later", got)
	}
}

func TestOrdinaryNullIsAValue(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE t (id TEXT PRIMARY KEY, label TEXT DEFAULT 'unnamed', size INTEGER DEFAULT 3)`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "t"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "t"})
	a.exec(`INSERT INTO t (id, label) VALUES ('x', NULL)`)
	syncAll(t, a, b)
	if got := b.rows(typedDump("t", "id", "label", "size")); got != "text:'x' | null:NULL | integer:3\n" {
		t.Errorf("b: %q: a NULL written is a value, not the default", got)
	}
	b.exec(`UPDATE t SET size = NULL`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := a.rows(typedDump("t", "id", "label", "size")); got != "text:'x' | null:NULL | null:NULL\n" {
		t.Errorf("a: %q", got)
	}
}

func TestOrdinaryDeleteAgainstEdit(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE t (a TEXT, b INTEGER, title TEXT NOT NULL, size INTEGER NOT NULL, PRIMARY KEY (a, b))`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "t"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "t"})
	a.exec(`INSERT INTO t VALUES ('k', 1, 'old', 10)`)
	syncAll(t, a, b)
	a.exec(`DELETE FROM t`)
	b.exec(`UPDATE t SET title = 'renamed'`)
	a.sync()
	b.sync() // b's edit is stamped after a's delete: the record comes back whole
	a.sync()
	assertConverged(t, a, b)
	if got := a.rows(`SELECT a, b, title, size FROM t`); got != "k | 1 | renamed | 10\n" {
		t.Errorf("a: %q, want the whole record back with b's edit", got)
	}
	// A delete and a new row under the same key on one device: exactly
	// the new row.
	a.exec(`DELETE FROM t`)
	a.exec(`INSERT INTO t VALUES ('k', 1, 'new', 1)`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := b.rows(`SELECT a, b, title, size FROM t`); got != "k | 1 | new | 1\n" {
		t.Errorf("b: %q", got)
	}
}

func TestOrdinaryKeyChange(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDevice(t, "dev-a", remote, itemsSchema, Table{Name: "items"})
	b := rowsDevice(t, "dev-b", remote, itemsSchema, Table{Name: "items"})
	a.exec(`INSERT INTO items (uuid, gen, title) VALUES ('u', 0, 't')`)
	syncAll(t, a, b)
	a.exec(`UPDATE items SET gen = 1`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := b.rows(`SELECT uuid, gen, title FROM items`); got != "u | 1 | t\n" {
		t.Errorf("b: %q, want the row under its new key only", got)
	}
}

func TestOrdinaryKeysRefused(t *testing.T) {
	remote := NewMemoryRemote()
	d := rowsDevice(t, "dev-a", remote, `CREATE TABLE t (k, v, PRIMARY KEY (k))`, Table{Name: "t"})
	for _, key := range []string{"NULL", "1.5", "'a' || char(0) || 'b'"} {
		_, err := d.db.Exec(`INSERT INTO t VALUES (` + key + `, 1)`)
		if err == nil || !strings.Contains(err.Error(), "drivesync: table t: key column k") {
			t.Errorf("key %s: err = %v, want the trigger's refusal naming the table and column", key, err)
		}
	}
	d.exec(`INSERT INTO t VALUES ('ok', 1)`)
	for _, key := range []string{"NULL", "2.5", "'a' || char(0) || 'b'"} {
		// Checked by the trigger of a moved key, not the update's own.
		_, err := d.db.Exec(`UPDATE t SET k = ` + key + `, v = 2`)
		if err == nil || !strings.Contains(err.Error(), "drivesync: table t: key column k") {
			t.Errorf("update to key %s: err = %v, want the trigger's refusal naming the table and column", key, err)
		}
	}
	if got := d.rows(`SELECT k, v FROM t`); got != "ok | 1\n" {
		t.Errorf("rows: %q", got)
	}
	d.exec(`UPDATE t SET v = 3`)
	if got := d.rows(`SELECT k, v FROM t`); got != "ok | 3\n" {
		t.Errorf("rows after an update of v: %q", got)
	}
}

// A refused key of several columns names the column at fault, on insert
// and on an update that moves the key.
func TestOrdinaryCompositeKeyRefusalNamesTheColumn(t *testing.T) {
	d := rowsDevice(t, "dev-a", NewMemoryRemote(), `CREATE TABLE t (owner TEXT, n, v, PRIMARY KEY (owner, n))`, Table{Name: "t"})
	for _, tc := range []struct{ stmt, column string }{
		{`INSERT INTO t VALUES ('a', 1.5, 1)`, "n"},
		{`INSERT INTO t VALUES (NULL, 1, 1)`, "owner"},
		{`INSERT INTO t VALUES ('a' || char(0), 1, 1)`, "owner"},
		{`UPDATE t SET n = 2.5`, "n"},
	} {
		if strings.HasPrefix(tc.stmt, "UPDATE") {
			d.exec(`INSERT OR IGNORE INTO t VALUES ('ok', 1, 1)`)
		}
		_, err := d.db.Exec(tc.stmt)
		want := "drivesync: table t: key column " + tc.column + " must hold"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", tc.stmt, err, want)
		}
	}
}

func TestOrdinaryTableShapes(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		schema string
		table  Table
		err    string // "" if Open must take it
	}{
		{`CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`, Table{Name: "t"}, "UniqueIntegerKey"},
		{`CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`, Table{Name: "t", UniqueIntegerKey: true}, ""},
		{`CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT) WITHOUT ROWID`, Table{Name: "t"}, ""},
		{`CREATE TABLE t (id INT PRIMARY KEY, v TEXT)`, Table{Name: "t"}, ""}, // not the rowid
		{`CREATE TABLE t (a INTEGER, b INTEGER, PRIMARY KEY (a, b))`, Table{Name: "t"}, ""},
		{`CREATE TABLE t (v TEXT)`, Table{Name: "t"}, "no PRIMARY KEY"},
		{`CREATE TABLE t (k REAL PRIMARY KEY, v TEXT)`, Table{Name: "t"}, "key column k is REAL"},
		{`CREATE TABLE t (k TEXT PRIMARY KEY, "odd name" TEXT)`, Table{Name: "t"}, `column "odd name"`},
		{`CREATE TABLE t (uuid TEXT PRIMARY KEY, content TEXT)`, Table{Name: "t"}, "rename content"},
		{`CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT, w TEXT GENERATED ALWAYS AS (upper(v)))`, Table{Name: "t"}, ""},
	} {
		db, err := sql.Open("sqlite", testDSN(filepath.Join(t.TempDir(), "x.db")))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(tc.schema); err != nil {
			t.Fatal(err)
		}
		_, err = Open(ctx, db, Config{Remote: NewMemoryRemote(), Tables: []Table{tc.table}})
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: Open: %v", tc.schema, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: Open: %v, want an error saying %q", tc.schema, err, tc.err)
		}
		db.Close()
	}
}

// A table registered with rows of its own sends them; one whose rows
// cannot be keyed is refused at Open, naming what to fix.
func TestOrdinaryTableRegisteredWithRows(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE t (k, v, PRIMARY KEY (k)); INSERT INTO t VALUES ('a', 1), (2, X'00')`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "t"})
	b := rowsDevice(t, "dev-b", remote, `CREATE TABLE t (k, v, PRIMARY KEY (k)); INSERT INTO t VALUES ('c', 3)`, Table{Name: "t"})
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := b.rows(typedDump("t", "k", "v")); got != "integer:2 | blob:X'00'\ntext:'a' | integer:1\ntext:'c' | integer:3\n" {
		t.Errorf("b: %q", got)
	}

	db, err := sql.Open("sqlite", testDSN(filepath.Join(t.TempDir(), "bad.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE t (k, v, PRIMARY KEY (k)); INSERT INTO t VALUES (1.5, 1), (NULL, 2)`); err != nil {
		t.Fatal(err)
	}
	_, err = Open(context.Background(), db, Config{Remote: remote, Tables: []Table{{Name: "t"}}})
	if err == nil || !strings.Contains(err.Error(), "2 rows have a key that is NULL, REAL") {
		t.Errorf("Open = %v, want the rows whose keys cannot sync counted and named", err)
	}
}

// A record another device wrote whose id is not a key of this table, or
// whose value no column can hold, is reported unwritten; the sync goes on.
func TestOrdinaryRecordThisTableCannotHold(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDevice(t, "dev-a", remote, `CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)`, Table{Name: "t"})
	b := rowsDevice(t, "dev-b", remote, `CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)`, Table{Name: "t"})
	writeRaw(t, remote, evilName, true, evilFile(
		`{"table_name":"t","record_id":"not a key","patch":{"v":"x"},"is_deleted":false,"sync_version":50}`,
		`{"table_name":"t","record_id":"'bad value'","patch":{"v":{"nested":true}},"is_deleted":false,"sync_version":50}`,
		`{"table_name":"t","record_id":"'good'","patch":{"v":"fine"},"is_deleted":false,"sync_version":50}`))
	r := b.sync()
	if len(r.Unwritten) != 2 {
		t.Errorf("Unwritten = %v, want the two records no row can hold", r.Unwritten)
	}
	if got := b.rows(`SELECT k, v FROM t`); got != "good | fine\n" {
		t.Errorf("b: %q", got)
	}
	a.sync()
	if got := a.rows(`SELECT k, v FROM t`); got != "good | fine\n" {
		t.Errorf("a: %q", got)
	}
}

// Two app versions side by side: the newer one added a column. The older
// keeps the column's values in its synced state and never undoes them;
// once it upgrades, its rows show them. A column dropped is ignored.
func TestOrdinaryColumnAddedByNewerApp(t *testing.T) {
	remote := NewMemoryRemote()
	older := `CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT)`
	newer := `CREATE TABLE t (id TEXT PRIMARY KEY, title TEXT, color TEXT NOT NULL DEFAULT 'red')`
	a := rowsDevice(t, "dev-a", remote, older, Table{Name: "t"})
	b := rowsDevice(t, "dev-b", remote, newer, Table{Name: "t"})
	c := rowsDevice(t, "dev-c", remote, newer, Table{Name: "t"})
	states := `SELECT record_id, record_data FROM sync_states ORDER BY record_id`
	a.exec(`INSERT INTO t VALUES ('x', 'one')`)
	syncAll(t, a, b, c)
	if got := b.rows(`SELECT id, title, color FROM t`); got != "x | one | red\n" {
		t.Fatalf("b: %q, want the new column's default", got)
	}
	// c sets the new column; b, which had only its default, edits another
	// column meanwhile: the default is not b's edit.
	c.exec(`UPDATE t SET color = 'blue'`)
	b.exec(`UPDATE t SET title = 'two'`)
	c.sync()
	b.sync()
	syncAll(t, a, b, c)
	for _, d := range []*device{b, c} {
		if got := d.rows(`SELECT id, title, color FROM t`); got != "x | two | blue\n" {
			t.Errorf("%s: %q, want b's title and c's color", d.name, got)
		}
	}
	// The older app edits the record: its edit leaves the column it does
	// not have alone.
	a.exec(`UPDATE t SET title = 'three'`)
	syncAll(t, a, b, c)
	for _, d := range []*device{a, b, c} {
		if got, want := d.rows(states), a.rows(states); got != want {
			t.Errorf("%s state %q, want %q", d.name, got, want)
		}
	}
	if got := b.rows(`SELECT id, title, color FROM t`); got != "x | three | blue\n" {
		t.Errorf("b: %q", got)
	}
	// a upgrades: its row shows what the others wrote to the new column.
	a.exec(`ALTER TABLE t ADD COLUMN color TEXT NOT NULL DEFAULT 'red'`)
	a.open()
	if got := a.rows(`SELECT id, title, color FROM t`); got != "x | three | blue\n" {
		t.Errorf("a after its upgrade: %q", got)
	}
	if n := a.pendingCount(); n != 0 {
		t.Errorf("a has %d pending changes after its upgrade: writing the new column is not an edit", n)
	}
	// c drops the column: its edits leave it alone.
	c.exec(`ALTER TABLE t DROP COLUMN color`)
	c.open()
	c.exec(`UPDATE t SET title = 'four'`)
	syncAll(t, a, b, c)
	assertConverged(t, a, b)
	if got := a.rows(`SELECT id, title, color FROM t`); got != "x | four | blue\n" {
		t.Errorf("a: %q, want c's title and the color c no longer has", got)
	}
	if got, want := c.rows(states), a.rows(states); got != want {
		t.Errorf("c state %q, want %q", got, want)
	}
}

// seed003Schema is the dot-art app's schema, foreign keys included.
const seed003Schema = `CREATE TABLE dots (
	uuid TEXT NOT NULL, gen INTEGER NOT NULL,
	pixel_data BLOB NOT NULL, lineage_data BLOB NOT NULL, lineage_count INTEGER NOT NULL,
	crc32_u32 INTEGER NOT NULL, created_at INTEGER NOT NULL,
	PRIMARY KEY (uuid, gen));
CREATE TABLE dot_instances (
	uuid TEXT PRIMARY KEY, current_gen INTEGER NOT NULL, is_owner BOOLEAN NOT NULL,
	title TEXT, acquired_at INTEGER NOT NULL, deleted_at INTEGER,
	FOREIGN KEY (uuid, current_gen) REFERENCES dots(uuid, gen));
CREATE TABLE action_logs (
	id TEXT PRIMARY KEY, dot_uuid TEXT NOT NULL, dot_gen INTEGER NOT NULL,
	action_type TEXT NOT NULL CHECK (action_type IN ('QR_SHOWN', 'QR_SCANNED')),
	timestamp INTEGER NOT NULL,
	FOREIGN KEY (dot_uuid, dot_gen) REFERENCES dots(uuid, gen));`

func fkDSN(path string) string { return testDSN(path) + "&_pragma=foreign_keys(1)" }

// With foreign keys on, rows arrive in any order: children registered
// (and so sent) before their parents are written once the parents are,
// in the same sync; a child whose parent has not arrived is reported
// unwritten and written when it does.
func TestOrdinaryForeignKeysInAnyOrder(t *testing.T) {
	lag := &laggingRemote{Remote: NewMemoryRemote(), hidden: map[string][]string{}}
	// Children first: each device sends and applies them before the dots.
	tables := []Table{{Name: "action_logs"}, {Name: "dot_instances"}, {Name: "dots"}}
	a := rowsDeviceOn(t, fkDSN, "dev-a", lag.as("dev-a"), seed003Schema, tables...)
	b := rowsDeviceOn(t, fkDSN, "dev-b", lag.as("dev-b"), seed003Schema, tables...)
	c := rowsDeviceOn(t, fkDSN, "dev-c", lag.as("dev-c"), seed003Schema, tables...)
	a.exec(`INSERT INTO dots VALUES ('A', 0, zeroblob(512), X'', 0, 123, 1)`)
	a.exec(`INSERT INTO dot_instances VALUES ('A', 0, 1, 'first', 1, NULL)`)
	a.exec(`INSERT INTO action_logs VALUES ('l1', 'A', 0, 'QR_SHOWN', 2)`)
	a.sync()
	if r := b.sync(); len(r.Unwritten) != 0 {
		t.Fatalf("b: Unwritten %v, want every row written once its parent is", r.Unwritten)
	}
	instance := `SELECT i.uuid, i.current_gen, i.title FROM dot_instances i JOIN dots d ON d.uuid = i.uuid AND d.gen = i.current_gen`
	if got := b.rows(instance); got != "A | 0 | first\n" {
		t.Errorf("b: %q", got)
	}
	if got := b.rows(`SELECT id FROM action_logs`); got != "l1\n" {
		t.Errorf("b logs: %q", got)
	}
	// c writes a new generation; a, which has it, points the instance at
	// it; b sees a's file but not yet c's: the instance waits, reported.
	c.sync()
	c.exec(`INSERT INTO dots VALUES ('A', 1, zeroblob(512), X'', 0, 124, 3)`)
	c.sync()
	a.sync()
	a.exec(`UPDATE dot_instances SET current_gen = 1`)
	a.sync()
	lag.hide("dev-b", "dev-c")
	r := b.sync()
	if len(r.Unwritten) != 1 || r.Unwritten[0].Table != "dot_instances" {
		t.Fatalf("b: Unwritten %v, want the instance whose generation has not arrived", r.Unwritten)
	}
	if got := b.rows(instance); got != "A | 0 | first\n" {
		t.Errorf("b while waiting: %q, want the row as it was", got)
	}
	lag.hide("dev-b")
	if r := b.sync(); len(r.Unwritten) != 0 {
		t.Fatalf("b: Unwritten %v after the parent arrived", r.Unwritten)
	}
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
	if got := b.rows(instance); got != "A | 1 | first\n" {
		t.Errorf("b: %q", got)
	}
}

// numericText must say exactly which TEXT a column of INTEGER or NUMERIC
// affinity keeps as TEXT: a key decodeKey refuses for looking numeric is
// never sent, and one it takes would be the row of another record.
func TestNumericTextMatchesSQLite(t *testing.T) {
	d := rowsDevice(t, "dev-a", NewMemoryRemote(), `CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT); CREATE TABLE probe (i INTEGER, n NUMERIC)`, Table{Name: "t"})
	for _, s := range []string{"1", "-1", "+7", "007", "1.5", ".5", "5.", "1e5", "1E+5", "1e", "e5", " 12 ", "\t3\n", "\u00a012",
		"0x10", "inf", "infinity", "NaN", "1_000", "1,5", "--1", "+-1", "1e400", "123456789012345678901234567890", "", " ", "12abc", "١٢"} {
		for _, col := range []string{"i", "n"} {
			d.exec(`DELETE FROM probe`)
			d.exec(`INSERT INTO probe (`+col+`) VALUES (?)`, s)
			var typ string
			if err := d.db.QueryRow(`SELECT typeof(` + col + `) FROM probe`).Scan(&typ); err != nil {
				t.Fatal(err)
			}
			if (typ != "text") != numericText.MatchString(s) {
				t.Errorf("%q in a column of %s affinity is stored as %s, numericText says numeric: %v", s, col, typ, numericText.MatchString(s))
			}
		}
	}
}
