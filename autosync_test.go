package drivesync

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// watchedRemote counts the listings in flight, and fails while down.
type watchedRemote struct {
	Remote
	inFlight, most atomic.Int32
	down           atomic.Bool
}

func (w *watchedRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	n := w.inFlight.Add(1)
	defer w.inFlight.Add(-1)
	for m := w.most.Load(); n > m && !w.most.CompareAndSwap(m, n); m = w.most.Load() {
	}
	time.Sleep(2 * time.Millisecond)
	return w.Remote.List(ctx, since)
}

func (w *watchedRemote) Now(ctx context.Context) (time.Time, error) {
	if w.down.Load() {
		return time.Time{}, errors.New("injected: unreachable")
	}
	return w.Remote.Now(ctx)
}

func (w *watchedRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	return w.Remote.Open(ctx, name)
}

type syncResult struct {
	at  time.Time
	r   Report
	err error
}

// autoSync runs AutoSync on d until the returned stop is called, which
// checks that it returned and left no goroutine behind.
func autoSync(t *testing.T, d *device, opts AutoSyncOptions) (results <-chan syncResult, stop func()) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	ch := make(chan syncResult, 1000)
	opts.OnSync = func(r Report, err error) { ch <- syncResult{time.Now(), r, err} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.eng.AutoSync(ctx, opts) }()
	return ch, func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("AutoSync returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("AutoSync did not return after its context ended")
		}
		goleak.VerifyNone(t, ignore)
	}
}

func next(t *testing.T, results <-chan syncResult, within time.Duration) syncResult {
	t.Helper()
	select {
	case r := <-results:
		return r
	case <-time.After(within):
		t.Fatalf("no sync within %v", within)
		return syncResult{}
	}
}

// TestAutoSync: a sync at start, one a debounce after a burst of local
// writes (one sync for the burst), one at each interval for the others'
// changes, one at once on SyncNow, never two at once.
func TestAutoSync(t *testing.T) {
	mem := NewMemoryRemote()
	w := &watchedRemote{Remote: mem}
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", w)
	results, stop := autoSync(t, b, AutoSyncOptions{Debounce: 150 * time.Millisecond, Interval: time.Hour, Poll: 10 * time.Millisecond})
	if r := next(t, results, 5*time.Second); r.err != nil {
		t.Fatalf("the first sync: %v", r.err)
	}

	// A burst of writes, 30 ms apart: one sync, a debounce after the last.
	var last time.Time
	for i := range 5 {
		b.put("n"+string(rune('0'+i)), `{"v":1}`)
		last = time.Now()
		time.Sleep(30 * time.Millisecond)
	}
	r := next(t, results, 5*time.Second)
	if r.err != nil || r.r.ChangesSent != 5 || r.at.Sub(last) < 140*time.Millisecond {
		t.Fatalf("the debounced sync: sent %d, %v after the last write, %v", r.r.ChangesSent, r.at.Sub(last), r.err)
	}
	select {
	case r := <-results:
		t.Fatalf("a second sync for the burst: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}

	// SyncNow brings a's note at once (the interval is an hour).
	a.put("from-a", `{"v":1}`)
	a.sync()
	asked := time.Now()
	b.eng.SyncNow()
	r = next(t, results, 5*time.Second)
	if r.err != nil || r.r.ChangesReceived != 1 || r.at.Sub(asked) > 2*time.Second || b.get("from-a") == "" {
		t.Fatalf("SyncNow: received %d after %v, %v", r.r.ChangesReceived, r.at.Sub(asked), r.err)
	}

	// Syncs the app runs meanwhile take turns with AutoSync's.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				b.eng.Sync(context.Background())
				b.eng.SyncNow()
			}
		}()
	}
	wg.Wait()
	stop()
	if m := w.most.Load(); m != 1 {
		t.Fatalf("%d listings at once: two syncs overlapped", m)
	}
}

// TestAutoSyncInterval: with no local change, AutoSync fetches the
// others' changes every Interval.
func TestAutoSyncInterval(t *testing.T) {
	mem := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	results, stop := autoSync(t, b, AutoSyncOptions{Interval: 200 * time.Millisecond, Poll: 20 * time.Millisecond})
	defer stop()
	next(t, results, 5*time.Second)
	a.put("n1", `{"v":1}`)
	a.sync()
	for deadline := time.Now().Add(5 * time.Second); b.get("n1") == ""; {
		r := next(t, results, time.Until(deadline))
		if r.err != nil {
			t.Fatal(r.err)
		}
	}
}

// TestAutoSyncBackoff: while the remote is unreachable, retries come
// further and further apart (with jitter, between half and all of each
// doubling wait); the first success ends the backoff.
func TestAutoSyncBackoff(t *testing.T) {
	w := &watchedRemote{Remote: NewMemoryRemote()}
	d := newDevice(t, "dev-a", w)
	w.down.Store(true)
	results, stop := autoSync(t, d, AutoSyncOptions{Backoff: 40 * time.Millisecond, MaxBackoff: 320 * time.Millisecond, Interval: time.Hour, Poll: 5 * time.Millisecond})
	defer stop()
	var at []time.Time
	for range 7 {
		r := next(t, results, 5*time.Second)
		if r.err == nil || !errors.Is(r.err, ErrRemote) {
			t.Fatalf("got %v, want ErrRemote", r.err)
		}
		at = append(at, r.at)
	}
	// Waits of 40, 80, 160, 320, 320, 320 ms, each drawn in [w/2, w].
	for i, want := range []time.Duration{40, 80, 160, 320, 320, 320} {
		want *= time.Millisecond
		// A loaded machine only makes waits longer: the upper bound is loose.
		if got := at[i+1].Sub(at[i]); got < want/2 || got > want+2*time.Second {
			t.Fatalf("wait %d was %v, want %v-%v", i+1, got, want/2, want)
		}
	}
	w.down.Store(false)
	d.put("n1", `{"v":1}`)
	r := next(t, results, 5*time.Second)
	if r.err != nil || r.r.ChangesSent != 1 {
		t.Fatalf("after the remote came back: %+v", r)
	}
}

// A second AutoSync of one engine is refused; Close ends a running one.
func TestAutoSyncTwiceAndClose(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	ignore := goleak.IgnoreCurrent()
	done := make(chan error, 1)
	go func() { done <- d.eng.AutoSync(context.Background(), AutoSyncOptions{Poll: 5 * time.Millisecond}) }()
	time.Sleep(50 * time.Millisecond)
	if err := d.eng.AutoSync(context.Background(), AutoSyncOptions{}); !errors.Is(err, ErrAutoSyncRunning) {
		t.Fatalf("a second AutoSync: %v", err)
	}
	d.eng.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("AutoSync after Close returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("AutoSync went on after Close")
	}
	goleak.VerifyNone(t, ignore)
}
