package drivesync

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Review 28: device ids the app gives and takes back, keepUploads, and
// copy detection across binds.

// TestReview28RevertedIDStillTaken: a's sync is killed after its upload
// (the outbox holds it). The app opens a with a new Config.DeviceID by
// mistake, the id of another live device, dev-x (settings restored from
// x, say); installSchema records it in renew_id. The app notices and
// opens a again with DeviceID empty ("the engine chooses"): case
// `deviceID == "" && stored != ""` keeps the stored id but leaves
// renew_id set, so the next sync's renewMovedID takes dev-x anyway. x's
// files are older than a's cursor, so checkCopied does not see them in
// that sync: a and x both stamp their edit of s (v, dev-x), and s differs
// between them for good. Expected: an Open with an empty DeviceID drops
// the id the app owed before, and a keeps dev-a.
func TestReview28RevertedIDStillTaken(t *testing.T) {
	ctx := context.Background()
	mem, clk := clockedRemote()
	a := newDevice(t, "dev-a", mem)
	x := newDevice(t, "dev-x", mem)
	x.put("y", `{"v":0}`)
	x.sync()
	a.put("s", `{"v":0}`)
	a.sync()
	x.sync()
	clk.add(time.Hour)
	a.sync()
	x.sync()

	a.put("k", `{"v":1}`)
	hooks(a.eng).step = func(p string) error {
		if p == "uploaded" {
			return errors.New("app killed after the upload")
		}
		return nil
	}
	if _, err := a.eng.Sync(ctx); err == nil {
		t.Fatal("a: the sync was to end after its upload")
	}
	hooks(a.eng).step = nil
	clk.add(time.Minute)

	a.cfg.DeviceID = "dev-x" // the app's mistake
	a.open()
	a.cfg.DeviceID = "" // taken back: the engine chooses
	a.open()

	a.put("s", `{"v":"from a"}`)
	x.put("s", `{"v":"from x"}`)
	hooks(a.eng).step = func(p string) error {
		if p == "planned" {
			x.sync()
		}
		return nil
	}
	a.sync()
	hooks(a.eng).step = nil
	took := a.eng.DeviceID()
	// What the errors ask: x's app gives it its own id.
	for range 2 {
		clk.add(time.Minute)
		for _, d := range []*device{a, x} {
			if _, err := d.eng.Sync(ctx); err != nil {
				t.Logf("%s: %v", d.name, err)
			}
		}
	}
	x.cfg.DeviceID = "dev-x2"
	x.open()
	clk.add(time.Minute)
	syncAll(t, a, x)
	syncAll(t, a, x)
	if took == "dev-x" {
		t.Errorf("opened with an empty Config.DeviceID, a took dev-x, the id the app gave and took back")
	}
	assertSameRecord(t, "s", a, x)
}
