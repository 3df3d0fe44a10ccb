package drivesync

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Review 27: new device ids given by the app, uploads_since across a
// rebind, and names past the last of their kind.

// TestReview27JoinStoreWhereCloneSyncs: a (Config.DeviceID empty) syncs
// on s1; a clone of its file (same inode: Open cannot tell) joins s2 and
// syncs there under a's id. Then a joins s2 too. rebind emptied
// uploads_since, so a's join sync sets it to the listing's time and
// judges none of the files already on s2: the clone's files, named with
// a's id, are applied as if a had written them, and a keeps the id. Its
// join sync stamps its edit of r with the next version under that id,
// while the clone, which has not seen a's file yet, stamps its own edit
// of r alike (same version, same id): r differs between them for good.
// Before that change uploads_since survived the join, a's join sync found
// the clone's files and took a new id before it stamped anything. Now it
// survives again, and rebind keeps the names of the stores left instead
// (keepUploads), which review 26's rejoin needed.
func TestReview27JoinStoreWhereCloneSyncs(t *testing.T) {
	ctx := context.Background()
	s1, clk1 := clockedRemote()
	s2, clk2 := clockedRemote()
	a := newDevice(t, "dev-a", s1)
	a.cfg.DeviceID = ""
	a.open()
	id := a.eng.DeviceID()
	a.put("r", `{"v":0}`)
	a.sync()
	clk1.add(time.Minute)
	a.sync()

	x := storeDevice(t, "dev-x", s2, Limits{})
	clk2.add(time.Minute)
	cfg := a.cfg
	cfg.Remote = s2
	cfg.TempDir = t.TempDir()
	c := copyDevice(t, a, "clone", cfg)
	if err := c.eng.JoinRemote(ctx); err != nil {
		t.Fatal(err)
	}
	c.sync()
	for i := range 3 {
		clk2.add(time.Minute)
		c.put("c", fmt.Sprintf(`{"n":%d}`, i))
		c.sync()
	}
	clk2.add(time.Minute)
	x.sync()
	if c.eng.DeviceID() != id {
		t.Fatalf("setup: the clone took id %s", c.eng.DeviceID())
	}

	a.cfg.Remote = s2
	a.open()
	if err := a.eng.JoinRemote(ctx); err != nil {
		t.Fatal(err)
	}
	clk2.add(time.Minute)
	a.put("r", `{"v":"from a"}`)
	c.put("r", `{"v":"from the clone"}`)
	hooks(a.eng).step = func(p string) error {
		if p == "planned" {
			c.sync() // before a's file is on s2
		}
		return nil
	}
	a.sync()
	hooks(a.eng).step = nil
	idAfterJoin := a.eng.DeviceID()
	for range 3 {
		clk2.add(time.Minute)
		for _, d := range []*device{a, c, x} {
			if _, err := d.eng.Sync(ctx); err != nil {
				t.Logf("%s: %v", d.name, err)
			}
		}
	}
	if idAfterJoin == id {
		t.Errorf("a joined the store where its clone syncs under %s and kept the id: the clone's files were not judged", id)
	}
	syncAll(t, a, c, x)
	assertSameRecord(t, "r", a, c, x)
}

// TestReview27CopyWhileNewIDOwed: a (Config.DeviceID set by the app) is
// killed after an upload; the app gives it a new id, dev-a2, which Open
// owes until the outbox is adopted (renew_id). The file is then copied
// and the copy opened with the app's config (dev-a2), as
// TestReview26FixedIDCopyStampsAlike opens its copy. Open refuses a copy
// under the app's id when the id is stored, but here the stored id is
// still dev-a, so installSchema takes the "new id with an outbox" branch
// and never looks at moved: both files adopt the outbox, both take
// dev-a2, and their first syncs stamp alike before either lists the
// other's file. Open now refuses the copy (as without the outbox); the
// app gives it its own id, and the edits converge.
func TestReview27CopyWhileNewIDOwed(t *testing.T) {
	ctx := context.Background()
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	x := newDevice(t, "x-dev", remote)
	killedAfterUpload(t, a, x)
	a.cfg.DeviceID = "dev-a2"
	a.open()
	cfg := a.cfg
	cfg.TempDir = t.TempDir()
	// Open refuses the copy under the id owed; the app gives it its own.
	c := copyFileRefused(t, a, "copy", cfg)
	c.cfg.DeviceID = "dev-c"
	c.open()

	a.put("r2", `{"v":"from a"}`)
	c.put("r2", `{"v":"from the copy"}`)
	hooks(a.eng).step = func(p string) error {
		if p == "planned" {
			c.sync()
		}
		return nil
	}
	a.sync()
	hooks(a.eng).step = nil
	if a.eng.DeviceID() != c.eng.DeviceID() {
		return
	}
	// Both find the other's files and fail, as they should; the app gives
	// each its own id.
	for _, d := range []*device{a, c} {
		if _, err := d.eng.Sync(ctx); err == nil {
			t.Logf("%s: no error", d.name)
		}
	}
	a.cfg.DeviceID, c.cfg.DeviceID = "dev-a3", "dev-c"
	a.open()
	c.open()
	syncAll(t, a, c, x)
	syncAll(t, a, c, x)
	assertSameRecord(t, "r2", a, c, x)
}
