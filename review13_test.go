package drivesync

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/drivefake"
)

// TestReview13RotationBySlowClockUnnoticed: on a shared folder each device
// names files by its own clock. Device a, whose clock is an hour behind,
// changes the store's key. Its key check was named an hour before the
// store's creation, and device b, which had verified the old key at the
// store's creation, skipped it (key checks were ordered by the time in
// their names): b's Sync kept succeeding while it rejected every file a
// wrote, and never got a's note. b must stop with ErrWrongKey.
func TestReview13RotationBySlowClockUnnoticed(t *testing.T) {
	mem, clk := clockedRemote()
	oldKey, newKey := Passphrase("old"), Passphrase("new")
	b := secretDevice(t, "dev-b", skewRemote{Remote: mem}, oldKey) // right clock, creates the store
	b.put("n0", `{"v":"b"}`)
	b.sync()
	a := secretDevice(t, "dev-a", skewRemote{Remote: mem, skew: -time.Hour}, oldKey)
	syncAll(t, a, b)
	assertConverged(t, a, b)

	clk.add(time.Minute)
	a.rekey(newKey, oldKey)
	a.put("n1", `{"v":"written by a after the key change"}`)
	a.sync()

	for range 3 {
		clk.add(time.Minute)
		r, err := b.eng.Sync(context.Background())
		if errors.Is(err, ErrWrongKey) {
			return // b was told: fine
		}
		if err != nil {
			t.Fatalf("b: %v", err)
		}
		if b.get("n1") == "" {
			t.Logf("b synced without error, rejected %v", r.Rejected)
		}
	}
	if b.get("n1") == "" {
		t.Fatalf("b lacks a's note n1 and its Sync still succeeds without ErrWrongKey: a's key change went unnoticed (a's key check named by a slow clock)")
	}
}

// TestReview13RotationAfterFastClockStuck: on a shared folder, device a,
// whose clock is an hour ahead, changes the key old->mid; device b (right
// clock), given mid and old, syncs fine. Then b changes the key again,
// mid->new, keeping mid and old as previous keys. b's check for new was
// named an hour before mid's, and b took mid's check (a key it holds,
// named later) for another device's key change: every Sync of b failed
// with ErrWrongKey, every key of the store in hand, and b's note was
// never sent.
func TestReview13RotationAfterFastClockStuck(t *testing.T) {
	mem, clk := clockedRemote()
	oldKey, midKey, newKey := Passphrase("old"), Passphrase("mid"), Passphrase("new")
	b := secretDevice(t, "dev-b", skewRemote{Remote: mem}, oldKey)
	b.put("n0", `{"v":"b"}`)
	b.sync()
	a := secretDevice(t, "dev-a", skewRemote{Remote: mem, skew: time.Hour}, oldKey)
	syncAll(t, a, b)

	clk.add(time.Minute)
	a.rekey(midKey, oldKey)
	a.put("n1", `{"v":"a, mid key"}`)
	a.sync()
	b.rekey(midKey, oldKey)
	syncAll(t, a, b)
	assertConverged(t, a, b)

	clk.add(time.Minute)
	b.rekey(newKey, midKey, oldKey)
	b.put("n2", `{"v":"b, new key"}`)
	var err error
	for range 3 {
		if _, err = b.eng.Sync(context.Background()); err == nil {
			break
		}
		clk.add(2 * time.Hour) // long past a's skew
	}
	if err != nil {
		t.Fatalf("b, holding the new, mid and old keys, cannot sync (%d pending): %v", b.pendingCount(), err)
	}
	a.rekey(newKey, midKey, oldKey)
	syncAll(t, a, b)
	assertConverged(t, a, b)
}

// TestReview13ConcurrentRotationsDiverge: devices a and b change the
// store's key at about the same time, to different keys (a: old->ka, b:
// old->kb); b's listing does not show a's key check yet (lag). b skipped
// a's check for good (named before b's own), so it never learned that
// a's files are encrypted with a key it lacks: its Sync kept succeeding
// while it rejected them, and a's note never reached b.
func TestReview13ConcurrentRotationsDiverge(t *testing.T) {
	mem, clk := clockedRemote()
	oldKey, ka, kb := Passphrase("old"), Passphrase("key of a"), Passphrase("key of b")
	a := secretDevice(t, "dev-a", mem, oldKey)
	view := &checkHidingRemote{Remote: mem}
	b := secretDevice(t, "dev-b", view, oldKey)
	a.put("n0", `{"v":0}`)
	syncAll(t, a, b)

	clk.add(time.Minute)
	a.rekey(ka, oldKey)
	a.put("n1", `{"v":"a, with ka"}`)
	a.sync()
	clk.add(time.Second)
	view.hide = true // b's listing lags behind a's key check
	b.rekey(kb, oldKey)
	b.put("n2", `{"v":"b, with kb"}`)
	b.sync()
	view.hide = false

	// a is told, and given b's key (its own kept as previous).
	clk.add(time.Minute)
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("a after b's key change: %v", err)
	}
	a.rekey(kb, ka, oldKey)
	for range 4 {
		clk.add(rejectRetryMax)
		a.sync()
		if _, err := b.eng.Sync(context.Background()); errors.Is(err, ErrWrongKey) {
			return // b was told it lacks a key: fine
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if a.get("n2") == "" {
		t.Fatal("a lacks b's note")
	}
	if b.get("n1") == "" {
		t.Fatalf("b lacks a's note n1 (written with a's key) and every Sync of b succeeds: b never learns of a's key change; the devices diverge")
	}
}

// TestReview13AutoSyncMissesEditDuringSync: an edit the app makes while
// AutoSync's sync runs stays pending (as documented). AutoSync took the
// pending count after the sync as already known, and only a change of
// that count restarted the debounce: further edits of the same record
// kept the count at 1 and waited for the Interval (here an hour) instead
// of the Debounce.
func TestReview13AutoSyncMissesEditDuringSync(t *testing.T) {
	mem := NewMemoryRemote()
	a := newDevice(t, "dev-a", mem)
	a.put("n1", `{"v":0}`)
	a.sync()
	var once atomic.Bool
	hooks(a.eng).step = func(point string) error {
		if point == "uploaded" && once.CompareAndSwap(false, true) {
			// The user keeps typing while the sync runs.
			if _, err := a.db.Exec(`UPDATE notes SET content = jsonb('{"v":2}') WHERE id = 'n1'`); err != nil {
				return err
			}
		}
		return nil
	}
	results, stop := autoSync(t, a, AutoSyncOptions{Debounce: 30 * time.Millisecond, Poll: 5 * time.Millisecond, Interval: time.Hour})
	next(t, results, 5*time.Second) // the sync at start: nothing to send
	a.put("n1", `{"v":1}`)
	r := next(t, results, 5*time.Second) // sends v1; v2 is written during it
	if r.err != nil {
		t.Fatal(r.err)
	}
	time.Sleep(50 * time.Millisecond)
	a.put("n1", `{"v":3}`) // one more edit of the same record, after the sync
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && a.pendingCount() > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if n := a.pendingCount(); n > 0 {
		t.Fatalf("2 s after the last edit (Debounce 30 ms), %d record is still pending: AutoSync waits for its Interval", n)
	}
}

// TestReview13StatusOverrunsDeadline: the app holds the write lock; a Sync
// with a 300 ms deadline must return at the deadline. Recording the
// sync's status waited up to a second more for the same lock, and then
// failed anyway: Sync overran its caller's deadline by a second, and
// Status still showed the sync before as the last one, with no error.
func TestReview13StatusOverrunsDeadline(t *testing.T) {
	a := newDevice(t, "dev-a", NewMemoryRemote())
	a.put("n1", `{"v":1}`)
	a.sync()
	a.put("n1", `{"v":2}`)
	conn, err := a.db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = a.eng.Sync(ctx)
	took := time.Since(start)
	conn.ExecContext(context.Background(), "ROLLBACK")
	if err == nil {
		t.Fatal("the sync did not fail under the held lock")
	}
	st, _ := a.eng.Status(context.Background())
	if took > 700*time.Millisecond || st.LastError == "" {
		t.Fatalf("Sync with a 300 ms deadline returned after %v (%v); Status then says LastError %q, LastSuccess %v", took.Round(time.Millisecond), err, st.LastError, st.LastSuccess)
	}
}

// TestReview13DriveUploadNotRetried: publishing handed the remote a
// progress-counting reader (and, encrypted, an age stream) instead of the
// upload's file. DriveRemote retries a failed upload only for content it
// can seek back, so one 503 on the upload of a patch file failed the
// whole Sync ("not retried: the content cannot be read again").
func TestReview13DriveUploadNotRetried(t *testing.T) {
	srv := drivefake.New(t)
	a := driveDevice(t, srv, "dev-a")
	a.put("n0", `{"v":0}`)
	a.sync() // the marker and the folders exist
	a.put("n1", `{"v":1}`)
	srv.Fail(drivefake.Fault{Method: "POST", PathPrefix: "/upload", Status: 503, Times: 1})
	if _, err := a.eng.Sync(context.Background()); err != nil {
		t.Fatalf("one 503 on the upload failed the sync: %v", err)
	}
}
