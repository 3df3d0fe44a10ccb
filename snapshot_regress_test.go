package drivesync

import (
	"context"
	"errors"
	"slices"
	"strings"
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
	mem, clk := clockedRemote()
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
	mem, clk := clockedRemote()
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
	mem, clk := clockedRemote()
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

// hidingRemote hides the named files from List, as a lagging listing does.
type hidingRemote struct {
	Remote
	hide map[string]bool
}

func (h *hidingRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	files, err := h.Remote.List(ctx, since)
	return slices.DeleteFunc(files, func(f RemoteFile) bool { return h.hide[f.Name] }), err
}

// D: a device whose clock is ahead compacts with a snapshot the moment it
// is written; another device's listing lags that snapshot, so it neither
// sees the deleted file nor the snapshot that holds it. Once it sees the
// snapshot, a cutoff older than its cursor made it skip the snapshot, and
// the file's change was lost to it.
func TestRegressSnapshotHiddenWhileCompacted(t *testing.T) {
	mem, clk := clockedRemote()
	hc := &hidingRemote{Remote: skewRemote{mem, 0}, hide: map[string]bool{}}
	a := newDevice(t, "dev-a", skewRemote{mem, 0}).withRetention(time.Hour)
	b := newDevice(t, "dev-b", skewRemote{mem, time.Hour}).withRetention(time.Hour) // an hour ahead
	c := newDevice(t, "dev-c", hc).withRetention(time.Hour)
	a.put("r1", `{"v":1}`)
	syncAll(t, a, b, c)
	b.snapshot() // named 13:00: b's compaction is due 15 minutes later, by b's clock
	c.sync()
	clk.add(time.Minute)
	a.put("r0", `{"v":0}`)
	held := a.sync().Uploaded // named 12:01
	clk.add(70 * time.Minute)
	snap := a.snapshot().Snapshot // named 13:11; holds r0's file, cutoff 12:11
	hc.hide[snap] = true
	if r := b.sync(); r.Deleted == 0 { // by b's clock a's snapshot is an hour old
		t.Fatalf("b did not compact: %+v", r)
	}
	if slices.Contains(mustList(t, mem), held) {
		t.Fatalf("%s was not compacted", held)
	}
	c.sync() // sees neither the file nor the snapshot
	delete(hc.hide, snap)
	clk.add(time.Minute)
	if r := c.sync(); !slices.Contains(r.Downloaded, snap) {
		t.Errorf("c did not load %s, which holds a file it never saw: %+v", snap, r)
	}
	if got := c.get("r0"); got != `{"v":0}` {
		t.Errorf("c has r0 = %q", got)
	}
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
}

// E: a device offline while three snapshots come and go sees only
// snapshots written after the file it missed was deleted, which no longer
// name it; with its clock ahead, their cutoffs look older than its cursor.
// The newest names, among the snapshots its writer checked, one the device
// never saw: the device loads it.
func TestRegressOfflineAcrossSnapshotChain(t *testing.T) {
	mem, clk := clockedRemote()
	a := newDevice(t, "dev-a", skewRemote{mem, 0}).withRetention(time.Hour)
	d := newDevice(t, "dev-d", skewRemote{mem, 2 * time.Hour}).withRetention(time.Hour)
	a.put("r1", `{"v":1}`)
	syncAll(t, a, d)
	clk.add(time.Minute)
	a.put("r0", `{"v":0}`)
	held := a.sync().Uploaded
	var snaps []string
	for range 4 { // 13:30, 13:50, 14:10, 14:30: each compacts with the one before
		clk.add(20 * time.Minute)
		if len(snaps) == 0 {
			clk.add(69 * time.Minute)
		}
		snaps = append(snaps, a.snapshot().Snapshot)
	}
	left := mustList(t, mem)
	if slices.Contains(left, held) || slices.Contains(left, snaps[0]) || slices.Contains(left, snaps[1]) {
		t.Fatalf("compaction left %v", left)
	}
	r := d.sync()
	if got := d.get("r0"); got != `{"v":0}` {
		t.Errorf("d has r0 = %q after downloading %v", got, r.Downloaded)
	}
	syncAll(t, a, d)
	assertConverged(t, a, d)
}

// F: a listed file deleted before it is downloaded, while the snapshot
// that holds it is still hidden from the listing: the sync stops instead
// of moving its cursor past the file, and the next one loads the snapshot.
func TestRegressVanishedFileWithoutSnapshot(t *testing.T) {
	mem := NewMemoryRemote()
	hb := &hidingRemote{Remote: mem, hide: map[string]bool{}}
	fb := &deleteFailingRemote{Remote: hb, gone: map[string]bool{}}
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", fb)
	syncAll(t, a, b)
	a.put("n", `{"v":1}`)
	held := a.sync().Uploaded
	snap := a.snapshot().Snapshot
	hb.hide[snap] = true
	fb.gone[held] = true
	_, err := b.eng.Sync(context.Background())
	if !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "sync again") {
		t.Fatalf("b's sync: %v, want ErrRemote saying to sync again", err)
	}
	delete(hb.hide, snap)
	if r := b.sync(); !slices.Contains(r.Downloaded, snap) {
		t.Errorf("b did not load %s: %+v", snap, r)
	}
	if got := b.get("n"); got != `{"v":1}` {
		t.Errorf("b has n = %q", got)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
}
