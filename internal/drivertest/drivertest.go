// Package drivertest runs drivesync's multi-device scenarios with one
// device on a given database/sql SQLite driver and the other on
// modernc.org/sqlite, so that every driver the README lists is shown to
// interoperate with the one the engine's own tests use. It also checks
// that the engine reads the driver's real errors: a locked database, a
// row refused by a constraint.
//
// Drivers that register the same database/sql name (mattn/go-sqlite3 and
// ncruces/go-sqlite3 both take "sqlite3") cannot share a test binary, so
// each runs this suite from a test package of its own.
package drivertest

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the other device of every scenario

	"github.com/drivesync/drivesync"
)

// Driver is the SQLite driver under test.
type Driver struct {
	// Name is the name the driver registers with database/sql.
	Name string
	// DSN returns the data source name that opens the database file at
	// path with the pragmas the README recommends (WAL, synchronous
	// NORMAL, BEGIN IMMEDIATE for the app's transactions), spelled the
	// driver's way, and a busy timeout of busyTimeout (0: none).
	DSN func(path string, busyTimeout time.Duration) string
}

// moderncDSN is the README's DSN for modernc.org/sqlite.
func moderncDSN(path string) string {
	return "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_txlock=immediate"
}

// Run runs every scenario as a subtest.
func Run(t *testing.T, d Driver) {
	tests := []struct {
		name string
		test func(t *testing.T, d Driver)
	}{
		{"SQLiteVersion", testSQLiteVersion},
		{"ErrorCodes", testErrorCodes},
		{"Converge", testConverge},
		{"ConcurrentFieldEdits", testConcurrentFieldEdits},
		{"ConstraintRefusesRow", testConstraintRefusesRow},
		{"BusyDatabaseIsRetried", testBusyDatabaseIsRetried},
		{"WriteDuringSync", testWriteDuringSync},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.test(t, d) })
	}
}

// openDB opens a database that is closed when the test ends.
func openDB(t testing.TB, driverName, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatalf("open %s: %v", driverName, err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatalf("open %s %s: %v", driverName, dsn, err)
	}
	return db
}

// device is one simulated device: a database and its engine.
type device struct {
	t    testing.TB
	name string
	path string
	db   *sql.DB
	eng  *drivesync.Engine
}

// schema is the scenarios' default: a JSONB table with a projection
// column and a table whose content is JSON text.
var schema = []string{
	`CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL, title TEXT)`,
	`CREATE TABLE tags (id TEXT PRIMARY KEY, content TEXT NOT NULL)`,
}

// newDevice opens name's database on the driver under test, or on
// modernc.org/sqlite when d is nil, creates the tables and opens an
// engine on it; edit may change the engine's Config first.
func newDevice(t testing.TB, name string, d *Driver, remote drivesync.Remote, tables []string, edit ...func(*drivesync.Config)) *device {
	t.Helper()
	dev := &device{t: t, name: name, path: filepath.Join(t.TempDir(), name+".db")}
	if d != nil {
		dev.db = openDB(t, d.Name, d.DSN(dev.path, 10*time.Second))
	} else {
		dev.db = openDB(t, "sqlite", moderncDSN(dev.path))
	}
	cfg := drivesync.Config{Remote: remote, DeviceID: name, TempDir: t.TempDir()}
	for _, stmt := range tables {
		dev.exec(stmt)
		table := strings.Fields(stmt)[2] // CREATE TABLE <name> ...
		cfg.Tables = append(cfg.Tables, drivesync.Table{Name: table})
	}
	for _, f := range edit {
		f(&cfg)
	}
	eng, err := drivesync.Open(context.Background(), dev.db, cfg)
	if err != nil {
		t.Fatalf("%s: Open: %v", name, err)
	}
	t.Cleanup(func() { eng.Close() })
	dev.eng = eng
	return dev
}

// pair returns a device on the driver under test and one on modernc,
// sharing a folder remote.
func pair(t *testing.T, d Driver, tables []string, edit ...func(*drivesync.Config)) (onDriver, onModernc *device) {
	t.Helper()
	remote, err := drivesync.NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return newDevice(t, "dev-"+d.Name, &d, remote, tables, edit...), newDevice(t, "dev-modernc", nil, remote, tables)
}

func (dev *device) exec(query string, args ...any) {
	dev.t.Helper()
	if _, err := dev.db.Exec(query, args...); err != nil {
		dev.t.Fatalf("%s: %s: %v", dev.name, query, err)
	}
}

// put writes a note's whole content.
func (dev *device) put(id, content string) {
	dev.t.Helper()
	dev.exec(`INSERT INTO notes (id, content) VALUES (?, jsonb(?)) ON CONFLICT (id) DO UPDATE SET content = excluded.content`, id, content)
}

func (dev *device) sync() drivesync.Report {
	dev.t.Helper()
	r, err := dev.eng.Sync(context.Background())
	if err != nil {
		dev.t.Fatalf("%s: Sync: %v", dev.name, err)
	}
	return r
}

// get returns a note's content as JSON text, or "" if there is none.
func (dev *device) get(id string) string {
	dev.t.Helper()
	var s string
	err := dev.db.QueryRow(`SELECT json(content) FROM notes WHERE id = ?`, id).Scan(&s)
	if err == sql.ErrNoRows {
		return ""
	}
	if err != nil {
		dev.t.Fatalf("%s: get %s: %v", dev.name, id, err)
	}
	return s
}

// dump returns the app's tables as text, in a fixed order, with the
// storage class of each content: devices that converged dump the same.
func (dev *device) dump() string {
	dev.t.Helper()
	var b strings.Builder
	for _, q := range []string{
		`SELECT id, typeof(content), json(content), quote(title) FROM notes ORDER BY id`,
		`SELECT id, typeof(content), content FROM tags ORDER BY id`,
	} {
		rows, err := dev.db.Query(q)
		if err != nil {
			dev.t.Fatalf("%s: %v", dev.name, err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				dev.t.Fatalf("%s: %v", dev.name, err)
			}
			for _, v := range vals {
				fmt.Fprintf(&b, "%s\t", v.String)
			}
			b.WriteString("\n")
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			dev.t.Fatalf("%s: %v", dev.name, err)
		}
		b.WriteString("--\n")
	}
	return b.String()
}

// converged syncs both devices until neither receives anything and
// checks that their tables are the same.
func converged(t *testing.T, a, b *device) string {
	t.Helper()
	for range 3 {
		a.sync()
		b.sync()
	}
	da, db := a.dump(), b.dump()
	if da != db {
		t.Fatalf("devices differ:\n%s:\n%s\n%s:\n%s", a.name, da, b.name, db)
	}
	return da
}

// testSQLiteVersion: the engine stores JSONB, which SQLite has since
// 3.45.0; the driver's bundled SQLite must have it.
func testSQLiteVersion(t *testing.T, d Driver) {
	db := openDB(t, d.Name, d.DSN(filepath.Join(t.TempDir(), "v.db"), 0))
	var version string
	if err := db.QueryRow(`SELECT sqlite_version()`).Scan(&version); err != nil {
		t.Fatalf("%s: %v", d.Name, err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil || major < 3 || major == 3 && minor < 45 {
		t.Fatalf("%s bundles SQLite %s; drivesync needs 3.45.0 or later (JSONB)", d.Name, version)
	}
	var text, kind string
	err := db.QueryRow(`SELECT json(jsonb_set(jsonb('{"a":1}'), '$.b', json('[2]'))), typeof(jsonb('{}'))`).Scan(&text, &kind)
	if err != nil || text != `{"a":1,"b":[2]}` || kind != "blob" {
		t.Fatalf("%s (SQLite %s): JSONB round trip gave %q, %q, %v; want {\"a\":1,\"b\":[2]}, blob", d.Name, version, text, kind, err)
	}
	t.Logf("%s bundles SQLite %s", d.Name, version)
}

// testConverge: creates, edits and deletes in both directions, in a JSONB
// table and a JSON text table, leave both devices with the same rows.
func testConverge(t *testing.T, d Driver) {
	a, b := pair(t, d, schema)
	a.put("n1", `{"title":"from a","body":"x"}`)
	a.exec(`INSERT INTO tags (id, content) VALUES ('t1', '{"name":"red"}')`)
	b.put("n2", `{"title":"from b","n":9007199254740993}`)
	b.exec(`INSERT INTO tags (id, content) VALUES ('t2', '{"name":"blue"}')`)
	converged(t, a, b)
	if got := b.get("n1"); got != `{"body":"x","title":"from a"}` {
		t.Fatalf("modernc got n1 = %s", got)
	}
	if got := a.get("n2"); got != `{"n":9007199254740993,"title":"from b"}` {
		t.Fatalf("%s got n2 = %s", d.Name, got)
	}

	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.body', 'y') WHERE id = 'n2'`)
	a.exec(`DELETE FROM tags WHERE id = 't2'`)
	b.exec(`DELETE FROM notes WHERE id = 'n1'`)
	b.exec(`UPDATE tags SET content = '{"name":"green"}' WHERE id = 't1'`)
	dump := converged(t, a, b)
	want := "n2\tblob\t{\"body\":\"y\",\"n\":9007199254740993,\"title\":\"from b\"}\t'from b'\t\n--\nt1\ttext\t{\"name\":\"green\"}\t\n--\n"
	if dump != want {
		t.Fatalf("after edits and deletes both devices hold\n%s\nwant\n%s", dump, want)
	}
}

// testConcurrentFieldEdits: two devices edit different fields of one
// record between syncs; both edits survive on both.
func testConcurrentFieldEdits(t *testing.T, d Driver) {
	a, b := pair(t, d, schema)
	a.put("n1", `{"title":"t","body":"b"}`)
	converged(t, a, b)
	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.title', 'title by ` + d.Name + `') WHERE id = 'n1'`)
	b.exec(`UPDATE notes SET content = jsonb_set(content, '$.body', 'body by modernc') WHERE id = 'n1'`)
	converged(t, a, b)
	want := `{"body":"body by modernc","title":"title by ` + d.Name + `"}`
	if got := a.get("n1"); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// testConstraintRefusesRow: a received record that the app's own
// constraints refuse (UNIQUE and NOT NULL on projection columns) is
// reported, the sync succeeds, and later records still arrive.
func testConstraintRefusesRow(t *testing.T, d Driver) {
	tables := []string{`CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL, slug TEXT NOT NULL UNIQUE)`}
	a, b := pair(t, d, tables)
	b.exec(`INSERT INTO notes (id, content, slug) VALUES ('n1', jsonb('{"slug":"same"}'), 'same')`)
	// The app fills slug itself; content has no slug, so the row the
	// engine writes elsewhere has none and NOT NULL refuses it.
	b.exec(`INSERT INTO notes (id, content, slug) VALUES ('n3', jsonb('{"text":"no slug"}'), 'own')`)
	b.sync()
	a.exec(`INSERT INTO notes (id, content, slug) VALUES ('n2', jsonb('{"slug":"same"}'), 'same')`)
	r, err := a.eng.Sync(context.Background())
	if err != nil {
		t.Errorf("sync with a refused row failed: %v", err)
	}
	var refused []string
	for _, u := range r.Unwritten {
		refused = append(refused, u.Table+"/"+u.Record)
	}
	if strings.Join(refused, ",") != "notes/n1,notes/n3" || r.Uploaded == "" {
		t.Errorf("report: unwritten %v, uploaded %q; want notes/n1 and notes/n3 unwritten and a's upload done", refused, r.Uploaded)
	}
	// The device keeps receiving.
	b.exec(`INSERT INTO notes (id, content, slug) VALUES ('n4', jsonb('{"slug":"other"}'), 'other')`)
	b.sync()
	for i := range 2 {
		if _, err := a.eng.Sync(context.Background()); err != nil {
			t.Errorf("sync %d after a refused row: %v", i+1, err)
		}
	}
	if got := a.get("n4"); got != `{"slug":"other"}` {
		t.Fatalf("after a refused row, n4 = %q: the device no longer receives", got)
	}
}

// testBusyDatabaseIsRetried: another connection holds the write lock
// when Sync starts and the DSN sets no busy timeout, so SQLite fails at
// once with SQLITE_BUSY; the engine must recognise the driver's error
// and wait.
func testBusyDatabaseIsRetried(t *testing.T, d Driver) {
	remote := drivesync.NewMemoryRemote()
	path := filepath.Join(t.TempDir(), "busy.db")
	db := openDB(t, d.Name, d.DSN(path, 0))
	if _, err := db.Exec(schema[0]); err != nil {
		t.Fatal(err)
	}
	eng, err := drivesync.Open(context.Background(), db, drivesync.Config{Remote: remote, Tables: []drivesync.Table{{Name: "notes"}}, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	if _, err := db.Exec(`INSERT INTO notes (id, content) VALUES ('n1', jsonb('{"v":1}'))`); err != nil {
		t.Fatal(err)
	}
	other := openDB(t, d.Name, d.DSN(path, 0))
	conn, err := other.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	release := time.AfterFunc(300*time.Millisecond, func() { conn.ExecContext(context.Background(), "COMMIT") })
	defer release.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	r, err := eng.Sync(ctx)
	if err != nil || r.ChangesSent != 1 {
		t.Fatalf("sync while another connection held the write lock: sent %d, %v", r.ChangesSent, err)
	}
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Fatalf("sync finished after %v, before the lock was released", waited)
	}
}

// testWriteDuringSync: the app writes a record while a sync is between
// planning and its final transaction; the write is kept locally and sent
// by the next sync.
func testWriteDuringSync(t *testing.T, d Driver) {
	var a *device
	wrote := false
	a, b := pair(t, d, schema, func(cfg *drivesync.Config) {
		cfg.Progress = func(p drivesync.Progress) {
			if p.Step == "upload" && p.Done == 0 && !wrote {
				wrote = true
				a.exec(`UPDATE notes SET content = jsonb_set(content, '$.late', 'kept') WHERE id = 'n1'`)
			}
		}
	})
	a.put("n1", `{"title":"t"}`)
	b.put("n2", `{"title":"u"}`)
	b.sync()
	a.sync()
	if !wrote {
		t.Fatal("the app's write did not run during the sync")
	}
	if got := a.get("n1"); got != `{"late":"kept","title":"t"}` {
		t.Fatalf("after the sync the app's row is %s, want its write kept", got)
	}
	if got := a.get("n2"); got != `{"title":"u"}` {
		t.Fatalf("n2 = %q, want it received in the same sync", got)
	}
	converged(t, a, b)
	if got := b.get("n1"); got != `{"late":"kept","title":"t"}` {
		t.Fatalf("modernc has n1 = %s, want the write made during the sync", got)
	}
}
