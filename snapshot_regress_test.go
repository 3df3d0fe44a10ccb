package drivesync

import (
	"context"
	"sync"
	"testing"
	"time"
)

type reproClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *reproClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *reproClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// skewRemote is a device's view of a shared folder: its own clock is off.
type skewRemote struct {
	Remote
	skew time.Duration
}

func (s skewRemote) Now(ctx context.Context) (time.Time, error) {
	t, err := s.Remote.Now(ctx)
	return t.Add(s.skew), err
}

func (s skewRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	return s.Remote.List(ctx, time.Time{}) // a folder lists everything
}

func withRetention(d *device, r time.Duration) {
	d.cfg.Retention = r
	d.open()
}

// A: an upload held in the outbox is published late under its old name;
// compaction deletes it by that name before every device has seen it.
func TestRegressOutboxOldNameCompacted(t *testing.T) {
	mem := NewMemoryRemote()
	clk := &reproClock{t: time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)}
	mem.SetClock(clk.now)
	fa := &failingRemote{Remote: mem}
	a, b := newDevice(t, "dev-a", fa), newDevice(t, "dev-b", mem)
	withRetention(a, time.Hour)
	withRetention(b, time.Hour)
	a.put("r1", `{"v":1}`)
	if _, err := a.eng.Snapshot(context.Background()); err != nil { // a's compaction is now due
		t.Fatal(err)
	}
	b.sync()
	clk.add(time.Minute)
	a.put("r2", `{"v":2}`)
	fa.failCreate = true
	if _, err := a.eng.Sync(context.Background()); err == nil { // r2's file stays in a's outbox
		t.Fatal("upload did not fail")
	}
	fa.failCreate = false
	clk.add(3 * time.Hour)
	if _, err := b.eng.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.add(20 * time.Minute)
	r := a.sync() // publishes patch_20260310T120100..., then compacts with b's snapshot
	t.Logf("a: recovered %s, downloaded %v, deleted %d", r.Recovered, r.Downloaded, r.Deleted)
	r = b.sync()
	t.Logf("b: downloaded %v", r.Downloaded)
	syncAll(t, a, b)
	if b.get("r2") == "" {
		t.Errorf("b never got r2 (a has %s)", a.get("r2"))
	}
	assertConverged(t, a, b)
}

// B: with clocks that disagree by more than 2×ListOverlap (a shared
// folder), a device that starts from a snapshot drops a later file of a
// device whose clock is behind, as if the snapshot held it.
func TestRegressSkewCoveredBefore(t *testing.T) {
	mem := NewMemoryRemote()
	clk := &reproClock{t: time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)}
	mem.SetClock(clk.now)
	a := newDevice(t, "dev-a", skewRemote{mem, 0})
	b := newDevice(t, "dev-b", skewRemote{mem, -time.Hour}) // b's clock is an hour behind
	a.put("r1", `{"v":1}`)
	a.sync()
	b.sync()
	if _, err := a.eng.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.add(time.Minute)
	b.put("r2", `{"v":2}`)
	t.Logf("b uploaded %s", b.sync().Uploaded) // named 11:01, after a's snapshot of 12:00
	c := newDevice(t, "dev-c", skewRemote{mem, 0})
	t.Logf("c downloaded %v", c.sync().Downloaded)
	syncAll(t, a, b, c)
	if c.get("r2") == "" {
		t.Errorf("c never got r2")
	}
	assertConverged(t, a, b, c)
}

// C: a snapshot of a store with no records is downloaded and applied
// again at every sync of every device with no synced state.
func TestRegressEmptySnapshotReloaded(t *testing.T) {
	mem := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	if _, err := a.eng.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		ra, rb := a.sync(), b.sync()
		t.Logf("round %d: a downloaded %v, b downloaded %v", i, ra.Downloaded, rb.Downloaded)
		if i > 0 && (len(ra.Downloaded) > 0 || len(rb.Downloaded) > 0) {
			t.Errorf("round %d: an idle sync downloaded the empty snapshot again", i)
		}
	}
}

// A, without compaction: a device that starts from a snapshot skips an
// outbox file published after the snapshot under its old name.
func TestRegressOutboxOldNameSkippedAtBootstrap(t *testing.T) {
	mem := NewMemoryRemote()
	clk := &reproClock{t: time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)}
	mem.SetClock(clk.now)
	fa := &failingRemote{Remote: mem}
	a, b := newDevice(t, "dev-a", fa), newDevice(t, "dev-b", mem)
	a.put("r1", `{"v":1}`)
	a.sync()
	clk.add(time.Minute)
	a.put("r2", `{"v":2}`)
	fa.failCreate = true
	if _, err := a.eng.Sync(context.Background()); err == nil { // r2's file stays in a's outbox, named 12:01
		t.Fatal("upload did not fail")
	}
	fa.failCreate = false
	clk.add(3 * time.Hour)
	if _, err := b.eng.Snapshot(context.Background()); err != nil { // covers 15:01, without r2
		t.Fatal(err)
	}
	clk.add(time.Minute)
	t.Logf("a recovered %s", a.sync().Recovered) // published at 15:02 as patch_20260310T120100
	c := newDevice(t, "dev-c", mem)
	t.Logf("c downloaded %v", c.sync().Downloaded)
	syncAll(t, a, b, c)
	if c.get("r2") == "" {
		t.Errorf("c never got r2")
	}
	assertConverged(t, a, b, c)
}
