package drivesync

import (
	"context"
	"fmt"
	"net/http"
	"path"
	"sync"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/drivefake"
)

func driveDevice(t *testing.T, srv *drivefake.Server, name string) *device {
	t.Helper()
	r, err := NewDriveRemote(context.Background(), srv.Service(context.Background(), t), DriveOptions{MinSleep: time.Millisecond, MaxSleep: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return newDevice(t, name, r)
}

// TestSyncOverDrive runs the core scenarios over the fake Drive with
// rate limits, server errors, dropped connections and listing lag.
func TestSyncOverDrive(t *testing.T) {
	srv := drivefake.New(t)
	a, b, c := driveDevice(t, srv, "dev-a"), driveDevice(t, srv, "dev-b"), driveDevice(t, srv, "dev-c")
	srv.SetListingLag(1)
	a.put("r", `{"title":"A","desc":"A"}`)
	syncAll(t, a, b, c)
	a.put("r", `{"title":"B","desc":"A"}`)
	b.put("r", `{"title":"A","desc":"B"}`)
	c.put("other", `{"n":9007199254740993}`)
	srv.Fail(
		drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusForbidden, Reason: "userRateLimitExceeded", Times: 3},
		drivefake.Fault{Method: "POST", PathPrefix: "/upload", Status: http.StatusServiceUnavailable, Times: 2},
		drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files/", ResetMidBody: true, Times: 2},
		drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusTooManyRequests, RetryAfter: "0", Times: 2},
	)
	for round := 0; round < 3; round++ {
		for _, d := range []*device{b, a, c} {
			d.eng.Sync(context.Background()) // faults may fail a sync; the next one retries
		}
	}
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
	if got, want := c.get("r"), `{"desc":"B","title":"B"}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// TestDriveRequestBudget counts HTTP requests at the fake server: a sync
// with nothing new costs 1 (its listing), one that uploads a file and
// downloads k files at most 3+k: the listing, the check that the upload's
// name is free, the upload and the k downloads (folders created or
// discovered once a day aside).
func TestDriveRequestBudget(t *testing.T) {
	srv := drivefake.New(t)
	a, b := driveDevice(t, srv, "dev-a"), driveDevice(t, srv, "dev-b")
	// Warm up: both devices have synced and uploaded today.
	a.put("wa", `{"v":1}`)
	b.put("wb", `{"v":1}`)
	syncAll(t, a, b)

	srv.ResetRequests()
	a.sync()
	idle := srv.Requests()
	t.Logf("idle: %v", srv.RequestLog())
	if idle > 1 {
		t.Errorf("a sync with nothing new cost %d requests, want 1: %v", idle, srv.RequestLog())
	}
	const k = 3
	for i := range k {
		b.put(fmt.Sprint("from-b-", i), `{"v":1}`)
		b.sync()
	}
	a.put("mine", `{"v":1}`)
	srv.ResetRequests()
	r := a.sync()
	if len(r.Downloaded) != k || r.Uploaded == "" {
		t.Fatalf("report %+v", r)
	}
	if n := srv.Requests(); n > 3+k {
		t.Errorf("upload 1 + download %d cost %d requests, want at most %d: %v", k, n, 3+k, srv.RequestLog())
	}
	t.Logf("requests: nothing new: %d; upload 1 + download %d: %d: %v", idle, k, srv.Requests(), srv.RequestLog())
}

// BenchmarkDriveRequests compares the HTTP requests of a sync that sends
// n changed records with a design that stores one file per record, as
// RxDB's Drive plugin and Joplin's file targets do.
func BenchmarkDriveRequests(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			srv := drivefake.New(b)
			r, err := NewDriveRemote(context.Background(), srv.Service(context.Background(), b), DriveOptions{})
			if err != nil {
				b.Fatal(err)
			}
			d := newDevice(b, "dev-a", r)
			d.put("warm", `{"v":0}`)
			d.sync()
			var ours, perRecord int
			for i := 0; b.Loop(); i++ {
				for j := range n {
					d.put(fmt.Sprintf("r%d", j), fmt.Sprintf(`{"v":%d}`, i))
				}
				srv.ResetRequests()
				d.sync()
				ours += srv.Requests()
				srv.ResetRequests()
				for j := range n { // the per-record design: one file per changed record
					if err := r.Create(context.Background(), fmt.Sprintf("2026/01/01/rec-%d-%d", i, j), http.NoBody); err != nil {
						b.Fatal(err)
					}
				}
				perRecord += srv.Requests()
			}
			b.ReportMetric(float64(ours)/float64(b.N), "requests/sync")
			b.ReportMetric(float64(perRecord)/float64(b.N), "per-record-design-requests")
		})
	}
}

// TestMarkerRaceOverDrive: two devices start a store on an empty Drive at
// the same moment and, the listing lagging, both create the marker (Drive
// allows two files of one name). Neither gets ErrRemoteChanged: both
// settle on the same store and converge, and an hour later the binding
// holds.
func TestMarkerRaceOverDrive(t *testing.T) {
	srv := drivefake.New(t)
	clk := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	srv.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return clk })
	a, b := driveDevice(t, srv, "dev-a"), driveDevice(t, srv, "dev-b")
	srv.SetListingLag(8)
	a.put("ra", `{"v":"a"}`)
	b.put("rb", `{"v":"b"}`)
	a.sync()
	b.sync()
	markers := 0
	for _, f := range srv.Files() {
		if f.Name == markerName {
			markers++
		}
	}
	if markers != 2 {
		t.Fatalf("%d markers, want the race's 2", markers)
	}
	srv.SetListingLag(0)
	for range 5 { // until the lagging listings show every file
		a.sync()
		b.sync()
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if a.eng.mustStore(t) != b.eng.mustStore(t) {
		t.Fatal("the devices bound different stores")
	}
	mu.Lock()
	clk = clk.Add(time.Hour)
	mu.Unlock()
	syncAll(t, a, b)
	c := driveDevice(t, srv, "dev-c")
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
	if a.get("rb") == "" || b.get("ra") == "" || c.get("ra") == "" {
		t.Fatal("a record was lost in the race")
	}
}

// filesNamed counts the files of Drive that have the base name of name,
// trashed or not.
func filesNamed(srv *drivefake.Server, name string) int {
	n := 0
	for _, f := range srv.Files() {
		if f.Name == path.Base(name) {
			n++
		}
	}
	return n
}

// TestDriveUploadStoredTwice: Drive stores an upload while the device
// sees its connection cut, and the DriveRemote sends it again (it asks
// whether the name is free before the first try only): the name has two
// files of the same bytes. Every device applies the change once, a new
// device starts from them, and Delete removes both.
func TestDriveUploadStoredTwice(t *testing.T) {
	srv := drivefake.New(t)
	a, b := driveDevice(t, srv, "dev-a"), driveDevice(t, srv, "dev-b")
	a.put("r1", `{"v":1}`)
	syncAll(t, a, b)
	a.put("r2", `{"v":2}`)
	srv.Fail(drivefake.Fault{Method: "POST", PathPrefix: "/upload/drive/v3/files", ResetMidBody: true, Times: 1})
	r := a.sync()
	if r.Uploaded == "" {
		t.Fatalf("nothing uploaded: %+v", r)
	}
	if n := filesNamed(srv, r.Uploaded); n != 2 {
		t.Fatalf("%d files named %s, want the 2 of a retried upload", n, r.Uploaded)
	}
	if got := b.sync(); got.ChangesReceived != 1 {
		t.Errorf("b received %d changes, want 1: %+v", got.ChangesReceived, got)
	}
	c := driveDevice(t, srv, "dev-c")
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
	if got := c.get("r2"); got != `{"v":2}` {
		t.Fatalf("c holds r2 = %q", got)
	}
	if err := a.cfg.Remote.Delete(context.Background(), r.Uploaded); err != nil {
		t.Fatal(err)
	}
	if n := filesNamed(srv, r.Uploaded); n != 0 {
		t.Fatalf("%d files named %s after Delete", n, r.Uploaded)
	}
}

// TestDriveRecoveredUploadIsChecked: an upload that Drive stored every
// time the device saw it fail stays in the outbox; the next sync asks
// Drive whether the name is taken before it publishes the file again
// (the earlier sync may have stored it), finds it, and stores no more
// copies.
func TestDriveRecoveredUploadIsChecked(t *testing.T) {
	srv := drivefake.New(t)
	r, err := NewDriveRemote(context.Background(), srv.Service(context.Background(), t), DriveOptions{MinSleep: time.Millisecond, MaxSleep: 5 * time.Millisecond, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	a, b := newDevice(t, "dev-a", r), driveDevice(t, srv, "dev-b")
	a.put("r1", `{"v":1}`)
	syncAll(t, a, b)
	a.put("r2", `{"v":2}`)
	srv.Fail(drivefake.Fault{Method: "POST", PathPrefix: "/upload/drive/v3/files", ResetMidBody: true, Times: 3})
	if _, err := a.eng.Sync(context.Background()); err == nil {
		t.Fatal("the sync succeeded though every upload failed")
	}
	var name string
	if err := a.db.QueryRow(`SELECT name FROM sync_outbox`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	stored := filesNamed(srv, name)
	if stored != 3 {
		t.Fatalf("%d files named %s, want the 3 tries'", stored, name)
	}
	srv.ResetRequests()
	a.sync()
	if n := filesNamed(srv, name); n != stored {
		t.Errorf("%d files named %s after the recovery, want still %d: %v", n, name, stored, srv.RequestLog())
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if b.get("r2") != `{"v":2}` {
		t.Fatalf("b holds r2 = %q", b.get("r2"))
	}
}
