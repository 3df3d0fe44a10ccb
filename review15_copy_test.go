package drivesync

import (
	"context"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/drivefake"
)

// TestDriveCopiesNameAFileAlike: two copies of one database (same device id)
// on two machines name their next patch file the same (the remote clock
// is behind the newest name they share, so patchTime gives both "last
// name + 1ms"). Copy B uploads while copy A is between its listing and
// its upload. A must not create a second file of that name: a third
// device reads only one file of a name (slices.Min(ids)), so one copy's
// changes would be lost to it for good. The upload's own check that the
// name is free, just before it creates the file, is what renames A's:
// skipping it when the sync's listing showed the name free lost a record.
func TestDriveCopiesNameAFileAlike(t *testing.T) {
	ctx := context.Background()
	srv := drivefake.New(t)
	a, c := driveDevice(t, srv, "dev-a"), driveDevice(t, srv, "dev-c")
	a.cfg.DeviceID = "" // the database's own id, as an app that sets none
	a.open()
	a.put("r0", `{"v":0}`)
	a.sync()
	c.sync()

	rb, err := NewDriveRemote(ctx, srv.Service(ctx, t), DriveOptions{MinSleep: time.Millisecond, MaxSleep: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cfg := a.cfg
	cfg.Remote, cfg.TempDir = rb, t.TempDir()
	b := copyDevice(t, a, "copy", cfg)

	// Drive's clock, as both machines estimate it, is now behind the
	// newest name the copies share.
	srv.SetClock(func() time.Time { return time.Now().Add(-5 * time.Second) })
	a.sync() // an idle sync: a's estimate of Drive's clock follows it

	a.put("ra", `{"from":"a"}`)
	b.put("rb", `{"from":"b"}`)
	once := false
	hooks(a.eng).step = func(point string) error {
		if point == "fetched" && !once {
			once = true
			t.Logf("b uploaded %s", b.sync().Uploaded)
		}
		return nil
	}
	t.Logf("a uploaded %s", a.sync().Uploaded)
	hooks(a.eng).step = nil

	names := map[string]int{}
	for _, f := range srv.Files() {
		if f.MimeType != "application/vnd.google-apps.folder" {
			names[f.Name]++
		}
	}
	for n, k := range names {
		if k > 1 {
			t.Errorf("%d files named %s on Drive", k, n)
		}
	}
	for range 3 {
		for _, d := range []*device{a, b, c} {
			d.eng.Sync(ctx)
		}
	}
	for _, id := range []string{"ra", "rb"} {
		if c.get(id) == "" {
			t.Errorf("dev-c never received %s", id)
		}
	}
}
