package drivesync

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestReview20bCopiesStampAlikeBeforeEitherSeesTheOther: two copies of one
// database diverged for good when both stamped a change before either
// listed a file of the other, which is what happens whenever the copy
// syncs through a shared folder whose sync tool is offline (a laptop the
// user copied the app's data to and then used on a plane: FolderRemote
// works offline on the local folder).
//
// Sequence: a (its database's own id, Config.DeviceID empty) syncs note r;
// its file is copied to b; b's sync tool goes offline. a edits r.v to
// "from a" and syncs: (v+1, dev-a). b edits r.v to "from b" and syncs: its
// file is held by the offline tool, and was stamped (v+1, dev-a) too,
// since b had seen nothing newer. The tool comes back online and delivers
// b's file. checkCopied then made each copy take a new id, but only for
// later stamps: the two writes already made carried one stamp, and each
// device kept the one that arrived first. a kept "from a", b "from b",
// and a third device c whichever file it applied first.
//
// Open now tells the copy's file from the original's (another inode) and
// the copy takes its own id before it stamps anything: the two edits are
// concurrent writes of distinct devices, and every device keeps the same
// one.
func TestReview20bCopiesStampAlikeBeforeEitherSeesTheOther(t *testing.T) {
	clk, a, c, held, cfg := offlineCopyScene(t, "")
	b := copyFileDevice(t, a, "copy", cfg)
	if b.eng.DeviceID() == a.eng.DeviceID() {
		t.Fatalf("the copy opened as %s, the original's id", b.eng.DeviceID())
	}
	editWhileOffline(t, clk, held, a, b)
	for range 3 {
		syncAll(t, a, b, c)
		clk.add(time.Minute)
	}
	t.Logf("ids: a %s, b %s", a.eng.DeviceID(), b.eng.DeviceID())
	assertSameRecord(t, "r", a, b, c)
}

// offlineCopyScene sets up review 20b's sequence: a (Config.DeviceID id,
// empty for the database's own) and c sync note r through one remote;
// cfg is a's configuration over a sync tool that is offline (held), for
// the copy of a's file the test makes.
func offlineCopyScene(t *testing.T, id string) (clk *reproClock, a, c *device, held *heldRemote, cfg Config) {
	t.Helper()
	mem, clk := clockedRemote()
	a = newDevice(t, "dev-a", mem)
	if a.cfg.DeviceID = id; id == "" {
		a.open()
	}
	c = newDevice(t, "dev-c", mem)
	a.put("r", `{"v":"first"}`)
	a.sync()
	c.sync()
	clk.add(time.Minute)
	held = &heldRemote{MemoryRemote: mem}
	cfg = a.cfg
	cfg.Remote = held
	cfg.TempDir = t.TempDir()
	held.goOffline(context.Background())
	return clk, a, c, held, cfg
}

// editWhileOffline has a and the copy b edit r before either sees the
// other's file: a syncs, b's sync is held by its offline tool, and the
// tool then comes back and delivers it. It returns the two syncs' errors.
func editWhileOffline(t *testing.T, clk *reproClock, held *heldRemote, a, b *device) (errA, errB error) {
	t.Helper()
	ctx := context.Background()
	a.put("r", `{"v":"from a"}`)
	_, errA = a.eng.Sync(ctx)
	clk.add(time.Second)
	b.put("r", `{"v":"from b"}`)
	_, errB = b.eng.Sync(ctx) // held by the offline sync tool
	clk.add(time.Second)
	held.goOnline(t)
	clk.add(time.Minute)
	return errA, errB
}

// A database file renamed or moved on its disk keeps its inode, and the
// engine its device id; reopened where it is, too.
func TestReview20bRenamedFileKeepsID(t *testing.T) {
	a := newDevice(t, "dev-a", NewMemoryRemote())
	a.cfg.DeviceID = ""
	a.open()
	a.put("r", `{"v":1}`)
	a.sync()
	id := a.eng.DeviceID()
	a.open()
	if got := a.eng.DeviceID(); got != id {
		t.Fatalf("reopened as %s, was %s", got, id)
	}
	a.exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	if err := a.db.Close(); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(filepath.Dir(a.path), "moved.db")
	if err := os.Rename(a.path, moved); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", testDSN(moved))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	a.db, a.path = db, moved
	a.open()
	if got := a.eng.DeviceID(); got != id {
		t.Fatalf("renamed, opened as %s, was %s", got, id)
	}
}
