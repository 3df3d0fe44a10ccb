package drivesync

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

const r14cRefusal = "notes.content must be a JSON object"

// --- capture triggers (ee5d0ee, 536632b) ---

// A content column that compares with COLLATE NOCASE: the update trigger's
// "content changed" test (OLD.content IS NOT NEW.content) uses the column's
// collation, so '{"a":null}' -> '{"a":NULL}' counts as unchanged and the
// invalid JSON is stored. The old BEFORE UPDATE OF content trigger refused it.
func TestR14cNoCaseContentUpdateRefused(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote(), `CREATE TABLE notes (id TEXT PRIMARY KEY, content TEXT NOT NULL COLLATE NOCASE)`)
	d.exec(`INSERT INTO notes (id, content) VALUES ('n', '{"a":true}')`)
	d.sync()
	_, err := d.db.Exec(`UPDATE notes SET content = '{"a":TRUE}' WHERE id = 'n'`)
	if err == nil || !strings.Contains(err.Error(), r14cRefusal) {
		var stored string
		var valid bool
		d.db.QueryRow(`SELECT content, json_valid(content, 6) FROM notes WHERE id = 'n'`).Scan(&stored, &valid)
		t.Errorf("UPDATE to invalid JSON under COLLATE NOCASE: got %v; stored %q (json_valid=%v)", err, stored, valid)
	}
	if r, err := d.eng.Sync(context.Background()); err != nil || len(r.Skipped) != 0 || d.pendingCount() != 0 {
		t.Errorf("sync after: skipped %v, err %v, still pending %d", r.Skipped, err, d.pendingCount())
	}
}

// Statements over an existing row whose invalid content never reaches an
// AFTER trigger: the old BEFORE INSERT trigger refused them, now they
// succeed silently (the content is dropped, the title of the UPSERT taken).
func TestR14cConflictingInvalidInsertRefused(t *testing.T) {
	for i, q := range []string{
		`INSERT OR IGNORE INTO notes (id, content) VALUES ('ok', ?)`,
		`INSERT INTO notes (id, content) VALUES ('ok', ?) ON CONFLICT DO NOTHING`,
		`INSERT INTO notes (id, content, title) VALUES ('ok', ?, 't2') ON CONFLICT (id) DO UPDATE SET title = excluded.title`,
	} {
		t.Run(string(rune('a'+i)), func(t *testing.T) {
			d := newDevice(t, "dev-a", NewMemoryRemote())
			d.put("ok", `{"v":1}`)
			_, err := d.db.Exec(q, `[1,2]`)
			if err == nil || !strings.Contains(err.Error(), r14cRefusal) {
				var title any
				d.db.QueryRow(`SELECT title FROM notes WHERE id='ok'`).Scan(&title)
				t.Errorf("%s with [1,2]: got %v (content %s, title %v), want the refusal the old BEFORE INSERT trigger gave", q, err, d.get("ok"), title)
			}
		})
	}
}

// A row holding non-object content from before registration: setting the
// same invalid value again was refused, is now accepted and marked.
func TestR14cSameInvalidContentUpdateRefused(t *testing.T) {
	for i, q := range []string{
		`UPDATE notes SET content = '[1]' WHERE id = 'legacy'`,
		`UPDATE notes SET content = content WHERE id = 'legacy'`,
	} {
		t.Run(string(rune('a'+i)), func(t *testing.T) {
			d := newDevice(t, "dev-a", NewMemoryRemote(), notesSchema, `INSERT INTO notes (id, content) VALUES ('legacy', '[1]')`)
			d.db.Exec(`DELETE FROM sync_pending_changes; DELETE FROM sync_pending_log`)
			_, err := d.db.Exec(q)
			if err == nil || !strings.Contains(err.Error(), r14cRefusal) {
				t.Errorf("%s: got %v, pending %d; want the refusal", q, err, d.pendingCount())
			}
		})
	}
}

// NOT NULL DEFAULT with OR REPLACE: a NULL content was refused; now the
// NOT NULL conflict resolution swaps in the default before the AFTER
// trigger looks, and the statement succeeds.
func TestR14cNullContentOrReplaceRefused(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote(), `CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL DEFAULT '{}')`)
	d.put("n", `{"v":1}`)
	for _, q := range []string{
		`INSERT OR REPLACE INTO notes (id, content) VALUES ('x', NULL)`,
		`UPDATE OR REPLACE notes SET content = NULL WHERE id = 'n'`,
	} {
		_, err := d.db.Exec(q)
		if err == nil || !strings.Contains(err.Error(), r14cRefusal) {
			t.Errorf("%s: got %v (x=%q n=%q), want the refusal", q, err, d.get("x"), d.get("n"))
		}
	}
}

// Sanity: inside an app transaction and a savepoint, a refused statement is
// backed out alone; the earlier writes and their marks stay.
func TestR14cRefusedInTxKeepsEarlierWrites(t *testing.T) {
	for _, rec := range []string{"ON", "OFF"} {
		t.Run(rec, func(t *testing.T) { r14cRefusedInTx(t, rec) })
	}
}

func r14cRefusedInTx(t *testing.T, rec string) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	d.db.SetMaxOpenConns(1)
	d.exec(`PRAGMA recursive_triggers = ` + rec)
	tx, err := d.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	must := func(q string, args ...any) {
		if _, err := tx.Exec(q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	must(`INSERT INTO notes (id, content) VALUES ('a', jsonb('{"v":1}'))`)
	must(`SAVEPOINT s`)
	must(`INSERT INTO notes (id, content) VALUES ('b', jsonb('{"v":1}'))`)
	for _, q := range []string{
		`INSERT OR REPLACE INTO notes (id, content) VALUES ('a', '[1]')`,
		`INSERT INTO notes (id, content) VALUES ('c', '{}'), ('d', '[1]')`,
		`UPDATE OR REPLACE notes SET content = '[1]'`,
		`REPLACE INTO notes (id, content) VALUES ('b', '"s"')`,
		`INSERT INTO notes (id, content) VALUES ('a', '[1]') ON CONFLICT (id) DO UPDATE SET content = excluded.content`,
	} {
		if _, err := tx.Exec(q); err == nil || !strings.Contains(err.Error(), r14cRefusal) {
			t.Errorf("%s: %v", q, err)
		}
	}
	must(`RELEASE s`)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if d.get("a") != `{"v":1}` || d.get("b") != `{"v":1}` || d.get("c") != "" || d.pendingCount() != 2 {
		t.Errorf("a=%s b=%s c=%s pending=%d", d.get("a"), d.get("b"), d.get("c"), d.pendingCount())
	}
}

// --- sync page cache (e228d25) ---

func r14cPoolCache(t *testing.T, d *device) int64 {
	t.Helper()
	var n int64
	if err := d.db.QueryRow(`PRAGMA cache_size`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// cancelAtGrowExec is a context that is cancelled at the moment growCache's
// PRAGMA cache_size = ... has been prepared (SQLite applies that pragma at
// prepare) and the driver checks the context before stepping it: what a
// cancel or deadline landing in that window does.
type cancelAtGrowExec struct {
	context.Context
	once sync.Once
	ch   chan struct{}
}

func (c *cancelAtGrowExec) Done() <-chan struct{} {
	pcs := make([]uintptr, 64)
	n := runtime.Callers(2, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	var grow, exec bool
	for {
		f, more := frames.Next()
		grow = grow || strings.HasSuffix(f.Function, ".growCache")
		exec = exec || strings.HasSuffix(f.Function, "sqlite.(*stmt).exec")
		if !more {
			break
		}
	}
	if grow && exec {
		c.once.Do(func() { close(c.ch) })
	}
	return c.ch
}

func (c *cancelAtGrowExec) Err() error {
	select {
	case <-c.ch:
		return context.Canceled
	default:
		return nil
	}
}

func TestR14cCancelledSyncRestoresCache(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	d.db.SetMaxOpenConns(1)
	d.put("n", `{"v":1}`)
	before := r14cPoolCache(t, d)
	ctx := &cancelAtGrowExec{Context: context.Background(), ch: make(chan struct{})}
	_, err := d.eng.Sync(ctx)
	t.Logf("Sync: %v", err)
	if after := r14cPoolCache(t, d); after != before {
		t.Errorf("after a cancelled Sync the pool's connection has cache_size %d, want %d", after, before)
	}
}

// The same with ordinary timeouts: how often a deadline lands in the window.
func TestR14cTimedOutSyncsRestoreCache(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	d.db.SetMaxOpenConns(1)
	before := r14cPoolCache(t, d)
	leaks := 0
	for i := 0; i < 3000; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%300)*time.Microsecond)
		d.eng.Sync(ctx)
		cancel()
		if r14cPoolCache(t, d) != before {
			leaks++
			d.exec(`PRAGMA cache_size = -2000`)
		}
	}
	if leaks > 0 {
		t.Errorf("%d of 3000 timed-out syncs left the pool's connection with the sync's cache", leaks)
	}
}

// Sanity: failures, panics, cancels after growCache, and the app's own values.
func TestR14cCacheRestoredOtherwise(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	d.db.SetMaxOpenConns(1)
	d.put("n", `{"v":1}`)
	check := func(what string, want int64) {
		t.Helper()
		if got := r14cPoolCache(t, d); got != want {
			t.Errorf("%s: cache_size %d, want %d", what, got, want)
		}
	}
	before := r14cPoolCache(t, d)
	fired := map[string]bool{}
	h := hooks(d.eng) // this engine's hooks, which the package's step hook calls
	defer func() { h.step = nil }()
	h.step = func(p string) error {
		if p == "planned" {
			fired["err"] = true
			return errors.New("boom")
		}
		return nil
	}
	d.eng.Sync(context.Background())
	check("error", before)
	ctx, cancel := context.WithCancel(context.Background())
	h.step = func(p string) error {
		if p == "fetched" {
			fired["cancel"] = true
			cancel()
		}
		return nil
	}
	d.eng.Sync(ctx)
	check("cancel mid-sync", before)
	h.step = func(p string) error {
		if p == "applied" {
			fired["panic"] = true
			panic("boom")
		}
		return nil
	}
	func() {
		defer func() { recover() }()
		d.eng.Sync(context.Background())
	}()
	check("panic", before)
	if len(fired) != 3 {
		t.Fatalf("hooks fired: %v", fired)
	}
	h.step = nil
	d.exec(`PRAGMA cache_size = 500`)
	d.sync()
	check("app's pages", 500)
	d.exec(`PRAGMA cache_size = -100000`)
	d.sync()
	check("app's larger", -100000)
}
