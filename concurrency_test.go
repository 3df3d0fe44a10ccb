package drivesync

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"go.uber.org/goleak"
)

// Writes during sync: the app keeps writing through its own pool while
// the engine syncs, from several goroutines. Run with -race.

const (
	cwPut    = `INSERT INTO notes (id, content) VALUES (?1, jsonb(?2)) ON CONFLICT (id) DO UPDATE SET content = excluded.content`
	cwSet    = `UPDATE notes SET content = jsonb_set(content, ?2, ?3) WHERE id = ?1`
	cwDelete = `DELETE FROM notes WHERE id = ?1`
)

const sharedInit = `{"title":"shared","tags":{"init":true}}`

// cwWriter is one app goroutine. It owns its records and its fields of
// the shared record, and remembers the last value it wrote to each.
type cwWriter struct {
	db      *sql.DB
	name    string
	ids     []string
	rng     *rand.Rand
	records map[string]map[string]any // nil: deleted
	shared  map[string]any            // JSON path ("$.w0") -> value
}

func newWriter(db *sql.DB, name string, seed uint64) *cwWriter {
	w := &cwWriter{db: db, name: name, rng: rand.New(rand.NewPCG(seed, 7)), records: map[string]map[string]any{}, shared: map[string]any{}}
	for j := range 5 {
		w.ids = append(w.ids, fmt.Sprintf("%s-%d", name, j))
	}
	return w
}

// exec runs one write, which must change exactly one row, and then
// records it with done.
func (w *cwWriter) exec(done func(), query string, args ...any) error {
	res, err := w.db.Exec(query, args...)
	if err != nil {
		return fmt.Errorf("%s: %s %v: %w", w.name, query, args, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("%s: %s %v: got %d rows (%v), want 1: the row is not what this writer left", w.name, query, args, n, err)
	}
	done()
	return nil
}

// step makes one random write numbered k.
func (w *cwWriter) step(k int) error {
	id := w.ids[w.rng.IntN(len(w.ids))]
	rec := w.records[id]
	switch op := w.rng.IntN(100); {
	case rec == nil || op < 10: // create, re-create or replace whole
		c := map[string]any{"owner": w.name, "n": k}
		text, _ := json.Marshal(c)
		return w.exec(func() { w.records[id] = c }, cwPut, id, string(text))
	case op < 45: // one top-level field, a projection column included
		field := []string{"f", "g", "display_order"}[w.rng.IntN(3)]
		return w.exec(func() { rec[field] = k }, cwSet, id, "$."+field, k)
	case op < 85: // this writer's field of the shared record, top level or nested
		path, v := []string{"$." + w.name, "$.tags." + w.name}[w.rng.IntN(2)], fmt.Sprintf("%s-%d", w.name, k)
		return w.exec(func() { w.shared[path] = v }, cwSet, "shared", path, v)
	default:
		return w.exec(func() { w.records[id] = nil }, cwDelete, id)
	}
}

// canonJSON re-encodes a JSON text, or the JSON of a value, with sorted
// keys and plain numbers.
func canonJSON(v any) string {
	if s, ok := v.(string); ok {
		json.Unmarshal([]byte(s), &v)
	} else {
		b, _ := json.Marshal(v)
		json.Unmarshal(b, &v)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// checkLastWrites checks that d holds the last value every writer wrote.
func checkLastWrites(t *testing.T, d *device, writers []*cwWriter) {
	t.Helper()
	var shared map[string]any
	json.Unmarshal([]byte(sharedInit), &shared)
	for _, w := range writers {
		for id, want := range w.records {
			if got := d.get(id); (want == nil) != (got == "") || (want != nil && canonJSON(got) != canonJSON(want)) {
				t.Errorf("%s: %s = %q, want %s (null: deleted)", d.name, id, got, canonJSON(want))
			}
		}
		for path, v := range w.shared {
			if path == "$.tags."+w.name {
				shared["tags"].(map[string]any)[w.name] = v
			} else {
				shared[w.name] = v
			}
		}
	}
	if got, want := canonJSON(d.get("shared")), canonJSON(shared); got != want {
		t.Errorf("%s: shared = %s, want %s", d.name, got, want)
	}
}

func checkIntegrity(t *testing.T, d *device) {
	t.Helper()
	var got string
	if err := d.db.QueryRow(`PRAGMA integrity_check`).Scan(&got); err != nil || got != "ok" {
		t.Errorf("%s: integrity_check = %q (%v), want ok", d.name, got, err)
	}
}

func closeDevices(t *testing.T, devs ...*device) {
	t.Helper()
	for _, d := range devs {
		if err := d.eng.Close(); err != nil {
			t.Error(err)
		}
		if err := d.db.Close(); err != nil {
			t.Error(err)
		}
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestConcurrentWritersDuringSync: four app goroutines write on device
// a's pool while a syncs in a loop and b writes and syncs. No write fails,
// none is lost, and the devices converge.
func TestConcurrentWritersDuringSync(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("shared", sharedInit)
	syncAll(t, a, b)
	time.Sleep(time.Millisecond) // see TestConcurrentUploadsInOneMillisecond
	// Short pauses between a sync's steps widen the windows in which the
	// app's writes land while a sync is under way; overlapped counts the
	// syncs in which a write landed between planning and applying.
	var aWrites, overlapped atomic.Int64
	var planned int64 // used by a's syncing goroutine only
	hooks(a.eng).step = func(p string) error {
		switch p {
		case "planned":
			planned = aWrites.Load()
		case "applied":
			if aWrites.Load() != planned {
				overlapped.Add(1)
			}
			return nil
		}
		time.Sleep(time.Millisecond)
		return nil
	}

	const steps = 200
	var aSyncs atomic.Int64
	stop := make(chan struct{})
	var syncers, writing sync.WaitGroup
	syncers.Go(func() {
		for !isClosed(stop) {
			if _, err := a.eng.Sync(context.Background()); err != nil {
				t.Errorf("dev-a: Sync: %v", err)
				return
			}
			aSyncs.Add(1)
			// Two uploads in one millisecond collide: see
			// TestConcurrentUploadsInOneMillisecond.
			time.Sleep(time.Millisecond)
		}
	})
	bw := newWriter(b.db, "wb", 99)
	syncers.Go(func() {
		for k := 0; k < steps/2 || !isClosed(stop); k++ {
			if err := bw.step(k); err != nil {
				t.Error(err)
				return
			}
			if k%10 == 9 {
				if _, err := b.eng.Sync(context.Background()); err != nil {
					t.Errorf("dev-b: Sync: %v", err)
					return
				}
				time.Sleep(time.Millisecond)
			}
		}
	})
	writers := []*cwWriter{bw}
	for i := range 4 {
		w := newWriter(a.db, fmt.Sprintf("w%d", i), uint64(i))
		writers = append(writers, w)
		writing.Go(func() {
			start := aSyncs.Load()
			// At least steps writes, and more until one of them lands
			// between a sync's planning and applying: a fast sync leaves
			// that window narrow, and the test is about that window.
			overlapDeadline := time.Now().Add(2 * time.Minute)
			for k := 0; k < steps || overlapped.Load() == 0 && time.Now().Before(overlapDeadline); k++ {
				// Halfway, wait until a whole sync of a ran during this
				// writer's writes, however the scheduler goes.
				for deadline := time.Now().Add(2 * time.Minute); k == steps/2 && aSyncs.Load() < start+2; {
					if time.Now().After(deadline) {
						t.Errorf("%s: dev-a did not complete a sync during the writes", w.name)
						return
					}
					time.Sleep(time.Millisecond)
				}
				if err := w.step(k); err != nil {
					t.Error(err)
					return
				}
				aWrites.Add(1)
			}
		})
	}
	writing.Wait()
	close(stop)
	syncers.Wait()
	if t.Failed() {
		t.FailNow()
	}
	hooks(a.eng).step = nil
	t.Logf("dev-a synced %d times during the writes, %d with writes between planning and applying", aSyncs.Load(), overlapped.Load())
	if overlapped.Load() == 0 {
		t.Fatal("no write landed while a sync was under way")
	}

	syncAll(t, a, b)
	assertConverged(t, a, b)
	for _, d := range []*device{a, b} {
		checkLastWrites(t, d, writers)
		checkIntegrity(t, d)
	}
	closeDevices(t, a, b)
	goleak.VerifyNone(t, leaks)
}

// TestSyncLeavesNoGoroutines: an engine that synced, with and without a
// deadline, leaves nothing running once it and its database are closed.
func TestSyncLeavesNoGoroutines(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	dir := t.TempDir()
	remote, err := NewFolderRemote(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	for i := range 3 {
		time.Sleep(time.Millisecond) // see TestConcurrentUploadsInOneMillisecond
		a.put(fmt.Sprintf("n%d", i), fmt.Sprintf(`{"v":%d}`, i))
		b.put(fmt.Sprintf("m%d", i), fmt.Sprintf(`{"v":%d}`, i))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if _, err := a.eng.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		b.sync()
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	closeDevices(t, a, b)
	goleak.VerifyNone(t, leaks)
}

// TestCancelDuringSync cancels a's syncs at random moments while b keeps
// producing files. Afterwards plain syncs converge and none of a's edits
// is lost.
func TestCancelDuringSync(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	stop := make(chan struct{})
	var bg sync.WaitGroup
	stopB := sync.OnceFunc(func() { close(stop); bg.Wait() })
	defer stopB() // before t.Cleanup closes b's database, even after t.Fatal
	bWrites := map[string]string{}
	bg.Go(func() {
		for i := 0; !isClosed(stop); i++ {
			id, content := fmt.Sprintf("b%d", i%20), fmt.Sprintf(`{"i":%d}`, i)
			if _, err := b.db.Exec(cwPut, id, content); err != nil {
				t.Errorf("dev-b: %v", err)
				return
			}
			bWrites[id] = content
			if _, err := b.eng.Sync(context.Background()); err != nil {
				t.Errorf("dev-b: Sync: %v", err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})

	aWrites := map[string]string{}
	edit := func(i int) {
		id := fmt.Sprintf("a%d", i%10)
		if i%7 == 6 {
			a.exec(cwDelete, id)
			aWrites[id] = ""
			return
		}
		content := fmt.Sprintf(`{"i":%d,"t":"x"}`, i)
		a.put(id, content)
		aWrites[id] = content
	}
	rng := rand.New(rand.NewPCG(1, 2))
	points := []string{"fetched", "planned", "uploaded", "applied"}
	typical := 10 * time.Millisecond // length of the last uncancelled sync
	var ok, cancelled, leaked int
	var unclassified []error
	for i := range 200 {
		time.Sleep(time.Millisecond) // see TestConcurrentUploadsInOneMillisecond
		edit(i)
		ctx, cancel := context.WithCancel(context.Background())
		switch {
		case i%10 == 0:
			// Uncancelled now and then: a catches up with b's files and
			// the random delays follow the syncs' length.
		case i%2 == 0:
			// Cancel between two steps, or inside the transaction just
			// before COMMIT.
			point := points[rng.IntN(len(points))]
			hooks(a.eng).step = func(p string) error {
				if p == point {
					cancel()
				}
				return nil
			}
		default:
			time.AfterFunc(time.Duration(rng.Int64N(int64(typical))), cancel)
		}
		began := time.Now()
		_, err := a.eng.Sync(ctx)
		ended := ctx.Err() != nil
		cancel()
		hooks(a.eng).step = nil
		switch {
		case err == nil:
			ok++
			typical = max(time.Since(began), time.Millisecond)
		case !ended:
			t.Fatalf("sync %d was not cancelled: got %v, want success", i, err)
		case errors.Is(err, context.Canceled):
			cancelled++
		default:
			cancelled++
			unclassified = append(unclassified, err) // see TestCancelAtEndOfFile
		}
		leaked += discardOpenTx(t, a.db) // see TestCancelDuringBegin
	}
	stopB()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d syncs cancelled, %d completed", cancelled, ok)
	if cancelled == 0 {
		t.Fatal("no sync was cancelled")
	}
	if leaked > 0 {
		t.Logf("%d cancelled syncs left a pooled connection inside a transaction (closed here; see TestCancelDuringBegin)", leaked)
	}
	if len(unclassified) > 0 {
		t.Logf("%d cancelled syncs failed with errors that do not match context.Canceled, such as: %v", len(unclassified), unclassified[0])
	}

	syncAll(t, a, b)
	assertConverged(t, a, b)
	for _, w := range []map[string]string{aWrites, bWrites} {
		for id, want := range w {
			for _, d := range []*device{a, b} {
				if got := d.get(id); canonJSON(got) != canonJSON(want) {
					t.Errorf("%s: %s = %q, want %q", d.name, id, got, want)
				}
			}
		}
	}
	checkIntegrity(t, a)
	checkIntegrity(t, b)
}

// TestCancelAtEndOfFile: a read that fails after the last byte of a
// patch file's JSON, as when the sync's context ends while the engine
// reads its outbox back, must fail with that read error.
func TestCancelAtEndOfFile(t *testing.T) {
	raw := gzipBytes([]byte(evilFile(goodChange)))
	_, err := decodePatchFile(io.MultiReader(bytes.NewReader(raw), iotest.ErrReader(context.Canceled)), evilDev, 1<<20, 1<<20,
		func(fileChange) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want an error matching context.Canceled", err)
	}
}

// discardOpenTx finds the idle connections of db's pool that are inside a
// transaction, which nothing is running now, and discards them (closing
// a connection rolls its transaction back). It returns how many it found.
func discardOpenTx(t *testing.T, db *sql.DB) int {
	t.Helper()
	ctx := context.Background()
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	found := 0
	for range db.Stats().Idle {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.ExecContext(ctx, "BEGIN"); err != nil {
			found++
			c.Raw(func(any) error { return driver.ErrBadConn }) // discarded on Close
		} else if _, err := c.ExecContext(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	}
	return found
}

// lateCtx is done for every goroutine but the one that made it, so that
// the driver's watcher goroutine sees it end while the statement runs on
// the caller's goroutine, which goes on waiting for its lock: the same
// interleaving as a real cancellation that lands just as the lock is
// granted, made certain.
type lateCtx struct {
	context.Context
	owner        string
	ended        atomic.Bool
	open, closed chan struct{}
}

func goroutineID() string {
	b := make([]byte, 64)
	return string(bytes.Fields(b[:runtime.Stack(b, false)])[1])
}

func (c *lateCtx) Done() <-chan struct{} {
	if goroutineID() == c.owner {
		return c.open // never closed: the lock wait goes on
	}
	c.ended.Store(true)
	return c.closed
}

func (c *lateCtx) Err() error {
	if c.ended.Load() {
		return context.Canceled
	}
	return nil
}

// TestCancelDuringBegin: a BEGIN IMMEDIATE whose context ends while it
// waits for the write lock either fails and leaves no transaction, or
// succeeds.
func TestCancelDuringBegin(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	holder, err := sql.Open("sqlite", testDSN(d.path))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	lock, err := holder.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(100*time.Millisecond, func() { lock.ExecContext(context.Background(), "COMMIT"); lock.Close() })
	conn, err := d.db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := &lateCtx{Context: context.Background(), owner: goroutineID(), open: make(chan struct{}), closed: make(chan struct{})}
	close(ctx.closed)
	if err := beginImmediate(ctx, conn); err != nil {
		if _, rerr := conn.ExecContext(context.Background(), "ROLLBACK"); rerr == nil {
			t.Fatalf("beginImmediate returned %v but left its transaction open", err)
		}
	}
}
