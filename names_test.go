package drivesync

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// tickClock is a monotonic remote clock that advances 1µs per reading: a
// fast machine on which a whole sync (small patch files, MemoryRemote or a
// local folder) takes well under a millisecond. It never goes back.
type tickClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *tickClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Microsecond)
	return c.t
}

func bulkPuts(d *device, seed uint64, n int) {
	rnd := rand.New(rand.NewPCG(seed, seed))
	for i := range n {
		d.put(fmt.Sprintf("f%02d", i), fmt.Sprintf(`{"title":"f","text":%q}`, fillerText(rnd, 300)))
	}
}

// Syncs of several files each, back to back on a fast machine (a remote
// clock that moves a microsecond per reading): every file gets a name of
// its own. (Before, a sync's files were named a millisecond apart from
// the clock's time, ahead of it; the next sync named its first file at a
// time already used, and renaming it landed on a sibling: every sync
// failed until the clock passed the last name.)
func TestSeveralFilesBackToBackNames(t *testing.T) {
	mem := NewMemoryRemote()
	clk := &tickClock{t: time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)}
	mem.SetClock(clk.now)
	a := newDevice(t, "dev-a", mem)
	a.cfg.Limits = Limits{MaxExpandedSize: 1024} // ~2 changes per file
	a.open()
	a.sync()
	bulkPuts(a, 1, 8)
	if r := a.sync(); r.ChangesSent != 8 {
		t.Fatalf("setup: sent %d", r.ChangesSent)
	}
	bulkPuts(a, 2, 8) // the user keeps working; the app syncs again
	for i := range 3 {
		r, err := a.eng.Sync(context.Background())
		if err != nil {
			t.Fatalf("sync %d after a several-file sync: %v (clock %s): the new files' names fall on the previous sync's, and renameOutbox cannot move them past them", i, err, clk.now().Format(time.RFC3339Nano))
		}
		_ = r
	}
	if n := a.pendingCount(); n != 0 {
		t.Fatalf("%d records still pending", n)
	}
}

// The same with a remote clock that stands still (or went back): names
// still move on from the last one used, and a rename never lands on
// another file of the outbox.
func TestSeveralFilesNamesWithStillClock(t *testing.T) {
	mem, _ := clockedRemote() // a clock that stands still
	a := storeDevice(t, "dev-a", mem, Limits{MaxExpandedSize: 1024})
	a.put("x", `{"v":1}`)
	a.sync() // one file, named T
	bulkPuts(a, 1, 8)
	var err error
	for range 3 {
		if _, err = a.eng.Sync(context.Background()); err == nil {
			return
		}
	}
	t.Fatalf("three syncs failed, the last with %v", err)
}
