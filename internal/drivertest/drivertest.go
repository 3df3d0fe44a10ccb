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
	// Remote, if set, returns a new, empty store for a scenario's devices
	// to share, so that the scenarios run over that remote; nil means a
	// folder.
	Remote func(t *testing.T) drivesync.Remote
	// Server, if set, returns a new, empty store on a sync server, and
	// the scenarios run through it. Each call may return another
	// client of the same store only when given the same t.
	Server func(t *testing.T) drivesync.Server
}

// A store is what a scenario's devices sync through: a Remote or a
// Server.
type store struct {
	remote drivesync.Remote
	server func() drivesync.Server
}

func (s store) config(cfg *drivesync.Config) {
	if s.server != nil {
		cfg.Server = s.server()
	} else {
		cfg.Remote = s.remote
	}
}

// remote returns a new store for a scenario: d's, or a folder.
func (d *Driver) remote(t *testing.T) store {
	t.Helper()
	if d.Server != nil {
		return store{server: func() drivesync.Server { return d.Server(t) }}
	}
	if d.Remote != nil {
		return store{remote: d.Remote(t)}
	}
	remote, err := drivesync.NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return store{remote: remote}
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
		{"DSNPragmas", testDSNPragmas},
		{"ErrorCodes", testErrorCodes},
		{"Converge", testConverge},
		{"ConcurrentFieldEdits", testConcurrentFieldEdits},
		{"OrdinaryTable", testOrdinaryTable},
		{"ConstraintRefusesRow", testConstraintRefusesRow},
		{"BusyDatabaseIsRetried", testBusyDatabaseIsRetried},
		{"WriteDuringSync", testWriteDuringSync},
		{"AppWritesWhileSyncing", testAppWritesWhileSyncing},
		{"UploadNotCommitted", testUploadNotCommitted},
		{"SnapshotBootstrap", testSnapshotBootstrap},
		{"CancelledSyncs", testCancelledSyncs},
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
func newDevice(t testing.TB, name string, d *Driver, remote store, tables []string, edit ...func(*drivesync.Config)) *device {
	t.Helper()
	dev := &device{t: t, name: name, path: filepath.Join(t.TempDir(), name+".db")}
	if d != nil {
		dev.db = openDB(t, d.Name, d.DSN(dev.path, 10*time.Second))
	} else {
		dev.db = openDB(t, "sqlite", moderncDSN(dev.path))
	}
	cfg := drivesync.Config{DeviceID: name, TempDir: t.TempDir()}
	remote.config(&cfg)
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
// sharing a remote.
func pair(t *testing.T, d Driver, tables []string, edit ...func(*drivesync.Config)) (onDriver, onModernc *device) {
	t.Helper()
	remote := d.remote(t)
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
