package drivesync

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// Review 26: device identity across JoinRemote, copies and snapshot names.

// TestReview26RejoinOldStoreSeesOwnFilesAsCopy: a device (Config.DeviceID
// set by the app) syncs with store S1, moves to S2 with JoinRemote, syncs
// there into the next month (whose first sync prunes sync_uploaded of
// every name S2 does not list: all of S1's), then moves back to S1 with
// JoinRemote. S1 still holds the files this database uploaded to it, named
// with its id; checkCopied no longer finds their names in sync_uploaded
// and takes them for a copy's: every sync fails until another device
// compacts those files away (never, if a was S1's only device). With
// Config.DeviceID empty the same makes it take a needless new id.
func TestReview26RejoinOldStoreSeesOwnFilesAsCopy(t *testing.T) {
	ctx := context.Background()
	s1 := NewMemoryRemote() // used a month before s2
	clk1 := &reproClock{t: time.Date(2026, 2, 10, 12, 0, 0, 0, time.UTC)}
	s1.SetClock(clk1.now)
	s2, clk2 := clockedRemote()
	a := newDevice(t, "dev-a", s1)
	id := a.eng.DeviceID()
	a.put("r1", `{"v":1}`)
	a.sync()
	clk1.add(time.Minute)
	a.put("r2", `{"v":2}`)
	a.sync()
	clk1.add(time.Minute)
	a.put("r3", `{"v":3}`)
	a.sync()

	x := storeDevice(t, "dev-x", s2, Limits{})
	a.cfg.Remote = s2
	a.open()
	if err := a.eng.JoinRemote(ctx); err != nil {
		t.Fatal(err)
	}
	a.sync()
	clk2.add(time.Minute)
	a.sync()
	clk2.add(time.Date(2026, 4, 5, 12, 0, 0, 0, time.UTC).Sub(clk2.now()))
	a.sync() // the month's first sync prunes sync_uploaded
	clk2.add(time.Minute)
	a.sync()
	syncAll(t, a, x)

	a.cfg.Remote = s1
	a.open()
	if err := a.eng.JoinRemote(ctx); err != nil {
		t.Fatal(err)
	}
	clk1.add(time.Minute)
	a.put("r4", `{"v":4}`)
	var errs []error
	for range 3 {
		if _, err := a.eng.Sync(ctx); err != nil {
			errs = append(errs, err)
		}
		clk1.add(time.Minute)
	}
	if len(errs) > 0 {
		t.Fatalf("back on its old store, %d of 3 syncs failed: %v", len(errs), errs[len(errs)-1])
	}
	if got := a.eng.DeviceID(); got != id {
		t.Errorf("back on its old store, the database took a new id %s (was %s): its own old files taken for a copy's", got, id)
	}
}

// TestReview26SnapshotNamesWithStillClock: a remote whose clock stands
// still (or several snapshots within one millisecond); writeState tries a
// millisecond later after each name taken, four times, so the fifth
// Snapshot fails (file already exists), and so does every one after it
// while the clock stands still; patch names avoid this (patchTime).
func TestReview26SnapshotNamesWithStillClock(t *testing.T) {
	ctx := context.Background()
	mem, _ := clockedRemote()
	a := newDevice(t, "dev-a", mem)
	for i := range 8 {
		a.put("r", fmt.Sprintf(`{"i":%d}`, i))
		if _, err := a.eng.Snapshot(ctx); err != nil {
			files, _ := mem.List(ctx, time.Time{})
			var names []string
			for _, f := range files {
				names = append(names, f.Name)
			}
			t.Fatalf("snapshot %d: %v\nremote: %s", i+1, err, strings.Join(names, "\n"))
		}
	}
}

// TestReview26FixedIDCopyStampsAlike: review20b's sequence with an app that
// sets Config.DeviceID. The copy of a's file (another inode) was opened
// with the id the app gave a; Open knew the file moved (fileMoved) but
// kept the id, so both copies stamped their edit of r (v+1, dev-a) before
// either listed the other's file, and the devices kept different values
// of r for good. Open now refuses the copy under a's id; the app gives it
// its own, and the edits made before either saw the other's converge.
func TestReview26FixedIDCopyStampsAlike(t *testing.T) {
	clk, a, c, held, cfg := offlineCopyScene(t, "dev-a")
	// Open refuses the copy under a's id, and says what to do: the app
	// gives the copy its own.
	b := copyFileRefused(t, a, "copy", cfg)
	b.cfg.DeviceID = "dev-b"
	b.open()
	errA, errB := editWhileOffline(t, clk, held, a, b)
	_, errA2 := a.eng.Sync(context.Background())
	t.Logf("a: %v, %v; copy: %v", errA, errA2, errB)

	// The fix the error named: leave Config.DeviceID empty.
	for _, d := range []*device{a, b} {
		d.cfg.DeviceID = ""
		d.open()
	}
	for range 3 {
		syncAll(t, a, b, c)
		clk.add(time.Minute)
	}
	assertSameRecord(t, "r", a, b, c)
}

// TestReview26RestoredBackupSameInode: a's database file (Config.DeviceID
// set by the app) is restored from a backup by writing the old bytes over
// it (cp keeps the inode, so Open sees the same file). The backup predates
// a's upload of r2; the restored database lists that file, named with its
// id and absent from its sync_uploaded, and every sync fails saying the
// database was copied: "Give each copy its own Config.DeviceID". The app
// does so, and Open refuses the new id (installSchema): the database
// cannot sync again until another device compacts r2's file away.
func TestReview26RestoredBackupSameInode(t *testing.T) {
	ctx := context.Background()
	mem, clk := clockedRemote()
	a := newDevice(t, "dev-a", mem)
	x := newDevice(t, "dev-x", mem)
	a.put("r1", `{"v":1}`)
	a.sync()
	clk.add(time.Minute)
	a.exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	backup, err := os.ReadFile(a.path)
	if err != nil {
		t.Fatal(err)
	}
	a.put("r2", `{"v":2}`)
	a.sync()
	clk.add(time.Minute)
	x.sync()

	if err := a.db.Close(); err != nil {
		t.Fatal(err)
	}
	os.Remove(a.path + "-wal")
	os.Remove(a.path + "-shm")
	if err := os.WriteFile(a.path, backup, 0o600); err != nil { // same inode
		t.Fatal(err)
	}
	a.reopen()
	a.put("r3", `{"v":3}`)
	if _, err := a.eng.Sync(ctx); err == nil || !strings.Contains(err.Error(), "Config.DeviceID") {
		t.Fatalf("got %v, want the error telling the app to give the copy its own Config.DeviceID", err)
	}
	// What the error says to do.
	a.cfg.DeviceID = "dev-a2"
	eng, err := Open(ctx, a.db, a.cfg)
	if err != nil {
		t.Fatalf("given its own Config.DeviceID as the sync error says, Open fails: %v", err)
	}
	a.eng = eng
	clk.add(time.Minute)
	syncAll(t, a, x)
	assertConverged(t, a, x)
	if a.get("r2") == "" || x.get("r3") == "" {
		t.Fatal("r2 or r3 lost")
	}
}

// An app that gives a database a new Config.DeviceID (as the errors above
// ask of a copy) while its outbox holds an upload under the old id: the
// next sync publishes and adopts the upload under the old id, then syncs
// as the new one, and nothing is lost or stamped twice.
func TestReview26NewDeviceIDWithOutbox(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	x := newDevice(t, "x-dev", remote)
	killedAfterUpload(t, a, x)
	a.cfg.DeviceID = "dev-a2"
	a.open()
	if id := a.eng.DeviceID(); id != "dev-a" {
		t.Fatalf("opened as %s with an upload of dev-a's in the outbox", id)
	}
	a.sync()
	if id := a.eng.DeviceID(); id != "dev-a2" {
		t.Fatalf("syncs as %s once the outbox is adopted, want dev-a2", id)
	}
	a.put("r2", `{"v":"after"}`)
	for range 2 {
		syncAll(t, a, x)
	}
	a.open() // the app's id is now the stored one
	if got := x.get("r2"); got == "" {
		t.Errorf("x lacks r2, written under the new id")
	}
	assertSameRecord(t, "r", a, x)
}

// copyFileRefused copies d's database file as copyFileDevice does, checks
// that Open refuses the copy under cfg (the id the app set for d) and
// says what to do, and returns the copy unopened.
func copyFileRefused(t *testing.T, d *device, name string, cfg Config) *device {
	t.Helper()
	c := copyFileDB(t, d, name, cfg)
	if _, err := Open(context.Background(), c.db, cfg); err == nil || !strings.Contains(err.Error(), "give this one its own Config.DeviceID") {
		t.Fatalf("the copy opens under %s's id %q: %v", d.name, cfg.DeviceID, err)
	}
	return c
}
