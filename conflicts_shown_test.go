package drivesync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/httpremote"
)

// The conflict log holds values this device showed: a value its synced
// state held before the sync that overwrote it, or one its app wrote. A
// value that reached the device and was overwritten within one sync was
// never shown there, and is another device's conflict.

// A device with one synced table, title holding a note's or an item's
// title, for the conflict log's tests of the public API.
type titleDevice struct {
	t    *testing.T
	name string
	db   *sql.DB
	eng  *drivesync.Engine
}

// titleTables are the kinds of table a title lives in: a document
// table's content member and an ordinary table's column.
var titleTables = []struct{ kind, schema, table, put, get string }{
	{"document", `CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL)`, "notes",
		`INSERT INTO notes (id, content) VALUES (?1, jsonb_object('title', ?2)) ON CONFLICT (id) DO UPDATE SET content = jsonb_set(content, '$.title', ?2)`,
		`SELECT content ->> 'title' FROM notes WHERE id = ?1`},
	{"ordinary", `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT, qty INTEGER)`, "items",
		`INSERT INTO items (id, title) VALUES (?1, ?2) ON CONFLICT (id) DO UPDATE SET title = ?2`,
		`SELECT title FROM items WHERE id = ?1`},
}

func openTitleDevice(t *testing.T, name, schema string, table drivesync.Table, cfg drivesync.Config) *titleDevice {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), name+".db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(schema); err != nil {
		t.Fatal(err)
	}
	cfg.Tables, cfg.DeviceID, cfg.TempDir = []drivesync.Table{table}, name, t.TempDir()
	eng, err := drivesync.Open(context.Background(), db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &titleDevice{t: t, name: name, db: db, eng: eng}
}

func (d *titleDevice) exec(query string, args ...any) {
	d.t.Helper()
	if _, err := d.db.Exec(query, args...); err != nil {
		d.t.Fatalf("%s: %v", d.name, err)
	}
}

func (d *titleDevice) sync() drivesync.Report {
	d.t.Helper()
	r, err := d.eng.Sync(context.Background())
	if err != nil {
		d.t.Fatalf("%s: Sync: %v", d.name, err)
	}
	return r
}

func (d *titleDevice) title(get, id string) string {
	d.t.Helper()
	var s string
	if err := d.db.QueryRow(get, id).Scan(&s); err != nil {
		d.t.Fatalf("%s: %v", d.name, err)
	}
	return s
}

// losers returns the losing values the device logged, as JSON.
func (d *titleDevice) losers() []string {
	d.t.Helper()
	cs, err := d.eng.Conflicts(context.Background(), drivesync.ConflictFilter{})
	if err != nil {
		d.t.Fatal(err)
	}
	var out []string
	for _, c := range cs {
		out = append(out, string(c.Loser))
	}
	return out
}

func (d *titleDevice) wantLosers(want ...string) {
	d.t.Helper()
	if got := d.losers(); !slices.Equal(got, want) {
		d.t.Errorf("%s logged the losers %q, want %q", d.name, got, want)
	}
}

// A and B edit one title at once and sync A, B, A. A device that joins
// afterwards and applies every patch file in one sync receives A's value
// and B's over it: it never showed A's value and logs nothing, and
// neither does a device that showed the title from before and catches
// up in one sync (B had seen that one). A, whose value lost, logs it.
func TestConflictLogOnlyValuesShownHere(t *testing.T) {
	for _, tt := range titleTables {
		t.Run(tt.kind, func(t *testing.T) {
			remote := drivesync.NewMemoryRemote()
			open := func(name string) *titleDevice {
				return openTitleDevice(t, name, tt.schema, drivesync.Table{Name: tt.table}, drivesync.Config{Remote: remote})
			}
			a, b, d := open("dev-a"), open("dev-b"), open("dev-d")
			a.exec(tt.put, "i1", "apples")
			a.sync()
			b.sync()
			d.sync() // d shows "apples", which both edits had seen
			a.exec(tt.put, "i1", "apples A")
			b.exec(tt.put, "i1", "apples B")
			a.sync()
			b.sync() // b's write wins
			a.sync()
			a.wantLosers(`"apples A"`)
			b.wantLosers()

			c := open("dev-c")
			if r := c.sync(); len(r.Downloaded) < 3 {
				t.Fatalf("c downloaded %v; the test wants it to apply every patch file", r.Downloaded)
			}
			d.sync()
			for _, x := range []*titleDevice{c, d} {
				if got := x.title(tt.get, "i1"); got != "apples B" {
					t.Fatalf("%s holds %q, want b's title", x.name, got)
				}
				x.wantLosers()
			}
		})
	}
}

// A write stamped below versions the device already holds (its writer
// stamped it before it heard of them, and its upload waited in the
// outbox) is told apart the same way: the device that applies it and a
// concurrent write over it in one sync logs nothing.
func TestConflictLogOnlyValuesShownHereLateWrite(t *testing.T) {
	remote := drivesync.NewMemoryRemote()
	tt := titleTables[1]
	open := func(name string, r drivesync.Remote) *titleDevice {
		return openTitleDevice(t, name, tt.schema, drivesync.Table{Name: tt.table}, drivesync.Config{Remote: r})
	}
	down := false
	a, b, d := open("dev-a", failingPatches{remote, &down}), open("dev-b", remote), open("dev-d", remote)
	a.exec(tt.put, "i1", "apples")
	a.sync()
	b.sync()
	d.sync()
	a.exec(tt.put, "i1", "apples A")
	down = true
	if _, err := a.eng.Sync(context.Background()); err == nil {
		t.Fatal("a published its file with the network down")
	}
	for i := range 10 { // d's versions pass a's
		d.exec(tt.put, fmt.Sprint("other", i), "pears")
	}
	d.sync()
	down = false
	a.sync() // publishes a's file from the outbox
	b.exec(tt.put, "i1", "apples B")
	b.sync()
	a.sync()
	a.wantLosers(`"apples A"`)
	if r := d.sync(); len(r.Downloaded) != 2 {
		t.Fatalf("d downloaded %v, want a's and b's files in one sync", r.Downloaded)
	}
	if got := d.title(tt.get, "i1"); got != "apples B" {
		t.Fatalf("d holds %q, want b's title", got)
	}
	d.wantLosers()
}

// A device that showed a value logs it when a concurrent write overwrites
// it, also when that write arrives in one sync with other devices' files:
// here a sequential edit of another member first, then b's edit, made
// without having seen the value this device showed.
func TestConflictLogShownValueAmongSeveralFiles(t *testing.T) {
	remote := drivesync.NewMemoryRemote()
	open := func(name string) *titleDevice {
		return openTitleDevice(t, name, titleTables[1].schema, drivesync.Table{Name: "items"}, drivesync.Config{Remote: remote})
	}
	a, b, d := open("dev-a"), open("dev-b"), open("dev-d")
	a.exec(`INSERT INTO items (id, title, qty) VALUES ('i1', 'apples', 1)`)
	a.sync()
	b.sync()
	a.exec(`UPDATE items SET title = 'apples A'`)
	a.sync()
	d.sync() // d shows a's title; b has not seen it
	a.exec(`UPDATE items SET qty = 2`)
	a.sync()
	b.exec(`UPDATE items SET title = 'apples B'`)
	b.sync() // after a's files: b's write wins
	if r := d.sync(); len(r.Downloaded) != 2 {
		t.Fatalf("d downloaded %v, want a's and b's files in one sync", r.Downloaded)
	}
	d.wantLosers(`"apples A"`)
	a.sync()
	a.wantLosers(`"apples A"`)
	b.wantLosers()
}

// An append-only row that two devices wrote under one key with other
// payloads is logged on the device whose own row lost (its app wrote
// it). A device that joins afterwards, and one that held no row of the
// key, take the synced row and log nothing: neither ever held a row of
// its own there.
func TestConflictLogAppendOnlyOnlyOwnRows(t *testing.T) {
	remote := drivesync.NewMemoryRemote()
	open := func(name string) *titleDevice {
		return openTitleDevice(t, name, `CREATE TABLE dots (uuid TEXT NOT NULL, gen INTEGER NOT NULL, pixels BLOB NOT NULL, PRIMARY KEY (uuid, gen))`,
			drivesync.Table{Name: "dots", AppendOnly: true}, drivesync.Config{Remote: remote})
	}
	a, b, d := open("dev-a"), open("dev-b"), open("dev-d")
	d.sync()
	a.exec(`INSERT INTO dots VALUES ('E', 1, X'0A')`)
	b.exec(`INSERT INTO dots VALUES ('E', 1, X'0B')`)
	a.sync()
	b.sync()
	a.sync()
	c := open("dev-c")
	for _, x := range []*titleDevice{c, d} {
		r := x.sync()
		for _, u := range r.Unwritten {
			if errors.Is(u.Err, drivesync.ErrImmutableConflict) {
				t.Errorf("%s reports %v", x.name, u.Err)
			}
		}
		if got := x.title(`SELECT hex(pixels) FROM dots WHERE uuid = ?1`, "E"); got != "0B" {
			t.Errorf("%s holds %s, want the synced row 0B", x.name, got)
		}
		x.wantLosers()
	}
	a.wantLosers(`{"pixels":["blob","Cg=="]}`)
	b.wantLosers()
}

// conflictTestServer is a Server that runs between, once, after the
// first page a pull returns (the store changes while a device pulls),
// and fails pushes while down is set.
type conflictTestServer struct {
	drivesync.Server
	between func()
	down    *bool
}

func (s *conflictTestServer) Push(ctx context.Context, batch *drivesync.PushBatch) (*drivesync.PushResult, error) {
	if s.down != nil && *s.down {
		return nil, errors.New("network down")
	}
	return s.Server.Push(ctx, batch)
}

func (s *conflictTestServer) Pull(ctx context.Context, storeID, cursor string) (*drivesync.PullPage, error) {
	page, err := s.Server.Pull(ctx, storeID, cursor)
	if f := s.between; f != nil && err == nil {
		s.between = nil
		f()
	}
	return page, err
}

// Through a sync server: a record that changes while a device pulls comes
// twice in one sync, first with A's title and then with B's, which had
// not seen A's. The device never showed A's title and logs nothing; A
// logs it.
func TestConflictLogOnlyValuesShownHereThroughServer(t *testing.T) {
	url := startSyncServer(t)
	server := func(pageSize int) drivesync.Server {
		return httpremote.New(url, serverTestToken, httpremote.Options{PageSize: pageSize})
	}
	tt := titleTables[0]
	open := func(name string, srv drivesync.Server) *titleDevice {
		return openTitleDevice(t, name, tt.schema, drivesync.Table{Name: tt.table}, drivesync.Config{Server: srv})
	}
	a, b := open("dev-a", server(0)), open("dev-b", server(0))
	a.exec(tt.put, "i1", "apples")
	a.exec(tt.put, "i2", "pears")
	a.sync()
	b.sync()
	a.exec(tt.put, "i1", "apples A")
	a.sync()
	a.exec(tt.put, "i2", "pears A") // pulled after i1
	a.sync()
	b.exec(tt.put, "i1", "apples B")

	// One record a page: c pulls i1 with a's title, then b syncs, then c
	// pulls i2 and i1 again, with b's title.
	c := open("dev-c", &conflictTestServer{Server: server(1), between: func() { b.sync() }})
	c.sync()
	a.sync()
	for _, x := range []*titleDevice{a, b, c} {
		if got := x.title(tt.get, "i1"); got != "apples B" {
			t.Fatalf("%s holds %q, want b's title", x.name, got)
		}
	}
	a.wantLosers(`"apples A"`)
	b.wantLosers()
	c.wantLosers()
}

// Through a sync server, with a write stamped below versions the device
// holds (its push waited in the outbox): the device that pulls it and
// then, in the same sync, b's write over it logs nothing.
func TestConflictLogOnlyValuesShownHereThroughServerLateWrite(t *testing.T) {
	url := startSyncServer(t)
	server := func(pageSize int) drivesync.Server {
		return httpremote.New(url, serverTestToken, httpremote.Options{PageSize: pageSize})
	}
	tt := titleTables[1]
	open := func(name string, srv drivesync.Server) *titleDevice {
		return openTitleDevice(t, name, tt.schema, drivesync.Table{Name: tt.table}, drivesync.Config{Server: srv})
	}
	down := false
	a, b := open("dev-a", &conflictTestServer{Server: server(0), down: &down}), open("dev-b", server(0))
	dsrv := &conflictTestServer{Server: server(1)}
	d := open("dev-d", dsrv)
	a.exec(tt.put, "i1", "apples")
	a.exec(tt.put, "i2", "pears")
	a.sync()
	b.sync()
	d.sync()
	a.exec(tt.put, "i1", "apples A")
	down = true
	if _, err := a.eng.Sync(context.Background()); err == nil {
		t.Fatal("a pushed with the network down")
	}
	for i := range 10 { // d's versions pass a's
		d.exec(tt.put, fmt.Sprint("other", i), "plums")
	}
	d.sync()
	d.sync() // pulls its own writes back: they are not in the next pull
	down = false
	// a pushes its write from the outbox, then an edit of i2, which
	// pulls list after i1.
	a.sync()
	a.exec(tt.put, "i2", "pears A")
	a.sync()
	b.exec(tt.put, "i1", "apples B")

	// One record a page: d pulls i1 with a's title, then b syncs, then d
	// pulls i2 and i1 again, with b's title.
	dsrv.between = func() { b.sync() }
	d.sync()
	a.sync()
	for _, x := range []*titleDevice{a, b, d} {
		if got := x.title(tt.get, "i1"); got != "apples B" {
			t.Fatalf("%s holds %q, want b's title", x.name, got)
		}
	}
	a.wantLosers(`"apples A"`)
	b.wantLosers()
	d.wantLosers()
}
