package drivesync

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// testDSN is the DSN the README recommends.
func testDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
}

const notesSchema = `CREATE TABLE IF NOT EXISTS notes (
	id TEXT PRIMARY KEY,
	content JSONB NOT NULL,
	title TEXT,
	display_order INTEGER
)`

// device is one simulated device: its own database and engine.
type device struct {
	t      testing.TB
	name   string
	path   string
	db     *sql.DB
	eng    *Engine
	remote Remote
	cfg    Config
	// dumped are the tables dump shows; nil: notes.
	dumped []string
}

func newDevice(t testing.TB, name string, remote Remote, schema ...string) *device {
	t.Helper()
	if len(schema) == 0 {
		schema = []string{notesSchema}
	}
	return openDevice(t, testDSN, name, remote, schema, []Table{{Name: "notes"}})
}

// openDevice makes a device on a database opened with dsn, creates its
// schema and opens an engine syncing tables.
func openDevice(t testing.TB, dsn func(string) string, name string, remote Remote, schema []string, tables []Table) *device {
	t.Helper()
	d := &device{t: t, name: name, path: filepath.Join(t.TempDir(), name+".db"), remote: remote}
	db, err := sql.Open("sqlite", dsn(d.path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	d.db = db
	for _, s := range schema {
		d.exec(s)
	}
	d.cfg = Config{Remote: remote, Tables: tables, DeviceID: name, TempDir: t.TempDir()}
	d.open()
	return d
}

func (d *device) open() {
	d.t.Helper()
	eng, err := Open(context.Background(), d.db, d.cfg)
	if err != nil {
		d.t.Fatalf("%s: Open: %v", d.name, err)
	}
	d.eng = eng
}

// reopen opens d's database file again (a file the test replaced under
// its path) and the engine on it.
func (d *device) reopen() {
	d.t.Helper()
	db, err := sql.Open("sqlite", testDSN(d.path))
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { db.Close() })
	d.db = db
	d.open()
}

func (d *device) exec(query string, args ...any) {
	d.t.Helper()
	if _, err := d.db.Exec(query, args...); err != nil {
		d.t.Fatalf("%s: %s: %v", d.name, query, err)
	}
}

func (d *device) put(id, content string) {
	d.t.Helper()
	d.exec(`INSERT INTO notes (id, content) VALUES (?, jsonb(?)) ON CONFLICT (id) DO UPDATE SET content = excluded.content`, id, content)
}

func (d *device) sync() Report {
	d.t.Helper()
	r, err := d.eng.Sync(context.Background())
	if err != nil {
		d.t.Fatalf("%s: Sync: %v", d.name, err)
	}
	return r
}

// get returns the note's content as JSON text, or "" if there is none.
func (d *device) get(id string) string {
	d.t.Helper()
	var s string
	err := d.db.QueryRow(`SELECT json(content) FROM notes WHERE id = ?`, id).Scan(&s)
	if err == sql.ErrNoRows {
		return ""
	}
	if err != nil {
		d.t.Fatal(err)
	}
	return s
}

// dump returns every synced table and sync_states in a fixed order: two
// devices that converged dump the same bytes.
func (d *device) dump() string {
	d.t.Helper()
	var b strings.Builder
	queries := []string{`SELECT table_name, record_id, record_data, clock, sync_version, device_id, is_deleted FROM sync_states ORDER BY table_name, record_id`}
	if d.dumped == nil {
		queries = append(queries, `SELECT id, hex(content), quote(title), quote(display_order) FROM notes ORDER BY id`)
	}
	for _, t := range d.dumped {
		var cols []string
		if err := func() error {
			rows, err := d.db.Query(`SELECT name FROM pragma_table_info(?) ORDER BY cid`, t)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var c string
				if err := rows.Scan(&c); err != nil {
					return err
				}
				cols = append(cols, c)
			}
			return rows.Err()
		}(); err != nil {
			d.t.Fatal(err)
		}
		queries = append(queries, typedDump(t, cols...))
	}
	for _, q := range queries {
		rows, err := d.db.Query(q)
		if err != nil {
			d.t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				d.t.Fatal(err)
			}
			fmt.Fprintln(&b, vals...)
		}
		rows.Close()
		b.WriteString("--\n")
	}
	return b.String()
}

func (d *device) pendingCount() int {
	d.t.Helper()
	var n int
	if err := d.db.QueryRow(`SELECT count(*) FROM ` + pendingUnion).Scan(&n); err != nil {
		d.t.Fatal(err)
	}
	return n
}

// syncAll syncs the devices round-robin until a full round moves nothing.
func syncAll(t testing.TB, devs ...*device) {
	t.Helper()
	for round := 0; round < 10; round++ {
		moved := false
		for _, d := range devs {
			r := d.sync()
			if r.Uploaded != "" || len(r.Downloaded) > 0 {
				moved = true
			}
		}
		if !moved {
			return
		}
	}
	t.Fatal("devices did not reach quiescence in 10 rounds")
}

// assertSameRecord fails unless every device shows record id alike
// (naming each one's value: two writes under one stamp leave them
// different for good), then checks that they converged.
func assertSameRecord(t testing.TB, id string, devs ...*device) {
	t.Helper()
	var vals []string
	for _, d := range devs {
		vals = append(vals, d.name+" "+d.get(id))
	}
	for _, d := range devs[1:] {
		if d.get(id) != devs[0].get(id) {
			t.Fatalf("%s differs for good: %s", id, strings.Join(vals, ", "))
		}
	}
	assertConverged(t, devs...)
}

func assertConverged(t testing.TB, devs ...*device) {
	t.Helper()
	want := devs[0].dump()
	for _, d := range devs[1:] {
		if got := d.dump(); got != want {
			t.Fatalf("%s differs from %s:\n%s\nvs\n%s", d.name, devs[0].name, got, want)
		}
	}
	for _, d := range devs {
		if n := d.pendingCount(); n != 0 {
			t.Fatalf("%s has %d pending changes after quiescence", d.name, n)
		}
	}
}

// laggingRemote hides files from some listers, like a remote whose
// listings lag: hidden[lister] is the set of name prefixes it cannot see.
type laggingRemote struct {
	Remote
	mu     sync.Mutex
	hidden map[string][]string
}

func (l *laggingRemote) as(lister string) Remote { return &listerView{l, lister} }

type listerView struct {
	l      *laggingRemote
	lister string
}

func (v *listerView) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	files, err := v.l.Remote.List(ctx, since)
	v.l.mu.Lock()
	defer v.l.mu.Unlock()
	return slices.DeleteFunc(files, func(f RemoteFile) bool {
		for _, dev := range v.l.hidden[v.lister] {
			if strings.HasSuffix(f.Name, "_"+dev+".json.gz") {
				return true
			}
		}
		return false
	}), err
}
func (v *listerView) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	return v.l.Remote.Open(ctx, name)
}
func (v *listerView) Create(ctx context.Context, name string, r io.Reader) error {
	return v.l.Remote.Create(ctx, name, r)
}
func (v *listerView) Delete(ctx context.Context, name string) error {
	return v.l.Remote.Delete(ctx, name)
}
func (v *listerView) Now(ctx context.Context) (time.Time, error) { return v.l.Remote.Now(ctx) }

func (l *laggingRemote) hide(lister string, devices ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hidden[lister] = devices
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// store returns the id of the store the device syncs with.
func (d *device) store() string {
	d.t.Helper()
	var id string
	if err := d.db.QueryRow(`SELECT value FROM sync_meta WHERE key = 'store'`).Scan(&id); err != nil {
		d.t.Fatal(err)
	}
	return id
}

// maxVersion returns the largest version the device has seen or reserved.
func (d *device) maxVersion() int64 {
	d.t.Helper()
	var v int64
	if err := d.db.QueryRow(`SELECT CAST(value AS INTEGER) FROM sync_meta WHERE key = 'max_version'`).Scan(&v); err != nil {
		d.t.Fatal(err)
	}
	return v
}

// engineHooks are the test hooks of one Engine (see stepHook).
type engineHooks struct {
	// step runs at each step boundary of a sync; an error it returns
	// fails the sync there.
	step func(point string) error
}

var allHooks sync.Map // *Engine -> *engineHooks

// hooks returns e's test hooks, for a test to set.
func hooks(e *Engine) *engineHooks {
	h, _ := allHooks.LoadOrStore(e, &engineHooks{})
	return h.(*engineHooks)
}

func init() {
	stepHook = func(e *Engine, point string) error {
		h, ok := allHooks.Load(e)
		if !ok {
			return nil
		}
		if fn := h.(*engineHooks).step; fn != nil {
			return fn(point)
		}
		return nil
	}
}

// clockedRemote returns a MemoryRemote on a clock that moves only when a
// test moves it.
func clockedRemote() (*MemoryRemote, *reproClock) {
	mem := NewMemoryRemote()
	clk := &reproClock{t: time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)}
	mem.SetClock(clk.now)
	return mem, clk
}

// storeDevice returns a device that creates the store on remote, with
// limits as the store's.
func storeDevice(t testing.TB, name string, remote Remote, limits Limits) *device {
	d := newDevice(t, name, remote)
	d.cfg.Limits = limits
	d.open()
	d.sync()
	return d
}
