package drivesync

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/drivesync/drivesync/internal/drivefake"
	"google.golang.org/api/drive/v3"
)

// TestDriveMarkerKept: a device reads the store's marker once, then from
// memory while each listing shows the same file with the same checksum.
// A marker replaced by another file, edited in place or deleted is read
// again: the device follows it, or stops with ErrRemoteChanged, exactly
// as if it had downloaded the marker every sync.
func TestDriveMarkerKept(t *testing.T) {
	ctx := context.Background()
	srv := drivefake.New(t)
	svc := srv.Service(ctx, t)
	creator := driveDevice(t, srv, "dev-c")
	creator.sync() // creates the marker
	// The device under test joins the store: the one that created it
	// takes a different marker in the next moments for a lost race.
	a := driveDevice(t, srv, "dev-a")
	a.put("r", `{"v":1}`)
	a.sync()
	marker := func() drivefake.File {
		t.Helper()
		var found []drivefake.File
		for _, f := range srv.Files() {
			if f.Name == markerName && !f.Trashed {
				found = append(found, f)
			}
		}
		if len(found) != 1 {
			t.Fatalf("%d markers on the server, want 1", len(found))
		}
		return found[0]
	}
	reads := func(id string) (n int) {
		for _, line := range srv.RequestLog() {
			if line == "GET /drive/v3/files/"+id {
				n++
			}
		}
		return n
	}
	m := marker()
	original := string(m.Content)

	// Unchanged: not downloaded again.
	srv.ResetRequests()
	a.sync()
	if n := reads(m.ID); n != 0 || srv.Requests() != 1 {
		t.Fatalf("an idle sync read the unchanged marker %d times in %d requests: %v", n, srv.Requests(), srv.RequestLog())
	}

	// Replaced by another file with the same content: read, and followed.
	if err := svc.Files.Delete(m.ID).Context(ctx).Do(); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Files.Create(&drive.File{Name: markerName, Parents: m.Parents}).Media(strings.NewReader(original)).Context(ctx).Do(); err != nil {
		t.Fatal(err)
	}
	m = marker()
	srv.ResetRequests()
	a.sync()
	if n := reads(m.ID); n != 1 {
		t.Fatalf("the replacing marker was read %d times, want 1: %v", n, srv.RequestLog())
	}

	// Edited in place to name another store: read again, and refused.
	other := strings.Replace(original, a.eng.mustStore(t), newStoreID(), 1)
	if other == original {
		t.Fatalf("the marker %s does not name the store %s", original, a.eng.mustStore(t))
	}
	if _, err := svc.Files.Update(m.ID, &drive.File{}).Media(strings.NewReader(other)).Context(ctx).Do(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.eng.Sync(ctx); !errors.Is(err, ErrRemoteChanged) {
		t.Fatalf("sync after the marker was edited to another store: %v, want ErrRemoteChanged", err)
	}
	// Edited back: read again, and the device syncs.
	if _, err := svc.Files.Update(m.ID, &drive.File{}).Media(strings.NewReader(original)).Context(ctx).Do(); err != nil {
		t.Fatal(err)
	}
	a.put("r2", `{"v":2}`)
	a.sync()

	// Deleted: not served from memory.
	if err := svc.Files.Delete(m.ID).Context(ctx).Do(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.eng.Sync(ctx); !errors.Is(err, ErrRemoteChanged) {
		t.Fatalf("sync after the marker was deleted: %v, want ErrRemoteChanged", err)
	}
}
