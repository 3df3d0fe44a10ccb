package drivesync

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestReapplyIsIdempotent forgets which files were applied and syncs
// again: every file is applied a second time and nothing changes.
func TestReapplyIsIdempotent(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("n1", `{"v":1,"o":{"x":1}}`)
	a.sync()
	b.put("n1", `{"v":2,"o":{"y":1}}`)
	b.put("n2", `{"w":1}`)
	b.sync()
	syncAll(t, a, b)
	a.exec(`DELETE FROM notes WHERE id = 'n2'`)
	syncAll(t, a, b)
	before := a.dump()
	a.exec(`DELETE FROM sync_files`)
	r := a.sync()
	if len(r.Downloaded) < 3 {
		t.Fatalf("re-applied %d files, want all 3", len(r.Downloaded))
	}
	if got := a.dump(); got != before {
		t.Fatalf("re-applying changed the state:\n%s\nwant\n%s", got, before)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
}

// TestLateFileWithinOverlap: a file named with a time before the cursor
// that the remote lists only later is still applied, thanks to the
// overlap and the applied-files set.
func TestLateFileWithinOverlap(t *testing.T) {
	mem := NewMemoryRemote()
	clock := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	mem.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return clock })
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	lag := &laggingRemote{Remote: mem, hidden: map[string][]string{}}
	a, b, c := newDevice(t, "dev-a", lag.as("a")), newDevice(t, "dev-b", lag.as("b")), newDevice(t, "dev-c", lag.as("c"))
	lag.hide("c", "dev-a") // a's files lag for c
	a.put("from-a", `{"v":1}`)
	a.sync()
	advance(time.Minute)
	b.put("from-b", `{"v":1}`)
	b.sync()
	advance(time.Minute)
	if r := c.sync(); len(r.Downloaded) != 1 {
		t.Fatalf("c applied %v, want only b's file", r.Downloaded)
	}
	// a's older file appears now, behind c's cursor but within the overlap.
	lag.hide("c")
	advance(time.Minute)
	if r := c.sync(); len(r.Downloaded) != 1 || !strings.Contains(r.Downloaded[0], "dev-a") {
		t.Fatalf("c applied %v, want a's late file", r.Downloaded)
	}
	if c.get("from-a") == "" {
		t.Fatal("late file not applied")
	}
	// Already-applied files in the window are skipped, not downloaded.
	if r := c.sync(); len(r.Downloaded) != 0 {
		t.Fatalf("re-downloaded %v", r.Downloaded)
	}
}

// TestBusyDatabaseIsRetried: another connection holds the write lock and
// the app's DSN sets no busy timeout; the sync waits for it.
func TestBusyDatabaseIsRetried(t *testing.T) {
	path := filepath.Join(t.TempDir(), "busy.db")
	open := func() *sql.DB {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(0)")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	db, other := open(), open()
	if _, err := db.Exec(notesSchema); err != nil {
		t.Fatal(err)
	}
	eng, err := Open(context.Background(), db, Config{Remote: NewMemoryRemote(), Tables: []Table{{Name: "notes"}}, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	db.Exec(`INSERT INTO notes (id, content) VALUES ('n', jsonb('{"v":1}'))`)
	conn, _ := other.Conn(context.Background())
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { conn.ExecContext(context.Background(), "COMMIT") })
	r, err := eng.Sync(context.Background())
	if err != nil || r.ChangesSent != 1 {
		t.Fatalf("sync under a held lock: %+v, %v", r, err)
	}
	// A lock held past the context's deadline fails the sync, clearly.
	if _, err := db.Exec(`UPDATE notes SET content = jsonb('{"v":2}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), "ROLLBACK")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = eng.Sync(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("got %v, want a deadline error saying the database stayed locked", err)
	}
}

func TestCloseAndConcurrentSyncs(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.put(string(rune('a'+i)), `{"v":1}`)
			_, err := a.eng.Sync(context.Background())
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	a.sync()
	if n := a.pendingCount(); n != 0 {
		t.Fatalf("%d pending after concurrent syncs", n)
	}
	if err := a.eng.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Sync after Close: %v, want ErrClosed", err)
	}
}

// TestIdleSyncMovesCursor: a device with nothing to send or receive still
// moves its cursor, so its listings do not reach ever further back.
func TestIdleSyncMovesCursor(t *testing.T) {
	mem := NewMemoryRemote()
	clock := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	mem.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return clock })
	a := newDevice(t, "dev-a", mem)
	a.put("n", `{"v":1}`)
	a.sync()
	mu.Lock()
	clock = clock.Add(48 * time.Hour)
	mu.Unlock()
	a.sync() // nothing new
	var cursor string
	a.db.QueryRow(`SELECT value FROM sync_meta WHERE key = 'cursor'`).Scan(&cursor)
	if want := clock.Format(time.RFC3339Nano); cursor != want {
		t.Fatalf("cursor %s, want %s", cursor, want)
	}
}

// TestAdoptJSONBTable: records received while a JSONB table was not
// registered appear in it, with projections, once it is.
func TestAdoptJSONBTable(t *testing.T) {
	remote := NewMemoryRemote()
	tagSchema := `CREATE TABLE IF NOT EXISTS tags (id TEXT PRIMARY KEY, content TEXT NOT NULL)`
	a := newDevice(t, "dev-a", remote, notesSchema, tagSchema)
	b := newDevice(t, "dev-b", remote, notesSchema, tagSchema)
	b.cfg.Tables = []Table{{Name: "tags"}} // b does not sync notes yet
	b.open()
	a.put("n1", `{"title":"hello","display_order":7}`)
	a.sync()
	if r := b.sync(); r.Unregistered != 1 {
		t.Fatalf("report %+v, want 1 unregistered change", r)
	}
	b.cfg.Tables = []Table{{Name: "tags"}, {Name: "notes"}}
	b.open()
	var title string
	var order int
	var kind string
	if err := b.db.QueryRow(`SELECT title, display_order, typeof(content) FROM notes WHERE id = 'n1'`).Scan(&title, &order, &kind); err != nil {
		t.Fatal(err)
	}
	if title != "hello" || order != 7 || kind != "blob" {
		t.Fatalf("adopted row: title %q, display_order %d, content %s; want hello, 7, blob (JSONB)", title, order, kind)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
}
