package drivesync

import (
	"context"
	"errors"
	"testing"

	"github.com/drivesync/drivesync/internal/drivefake"
)

// TestPointedAtAnotherFolder: two devices create their stores moments
// apart in two different folders. When device A is pointed at B's folder,
// the different store is not a race between A and B creating one store's
// marker (A made its marker in another folder): Sync stops with
// ErrRemoteChanged, and nothing is joined, uploaded or changed.
func TestPointedAtAnotherFolder(t *testing.T) {
	ra, err := NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rb, err := NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, b := newDevice(t, "dev-a", ra), newDevice(t, "dev-b", rb)
	a.put("ra", `{"v":"a"}`)
	a.sync()
	b.put("rb", `{"v":"b"}`)
	b.sync()
	storeA := a.store()
	pointAt(a, rb)
	before := remoteFiles(t, rb, kindPatch)
	_, err = a.eng.Sync(context.Background())
	if !errors.Is(err, ErrRemoteChanged) {
		t.Fatalf("sync pointed at B's folder: %v, want ErrRemoteChanged", err)
	}
	if a.store() != storeA || len(remoteFiles(t, rb, kindPatch)) != len(before) || a.get("rb") != "" {
		t.Fatal("a joined B's store")
	}
	// Pointed back, A syncs as before.
	pointAt(a, ra)
	a.put("ra", `{"v":"a2"}`)
	a.sync()

	// A folder with nothing in it yet, moments after A created its store,
	// is not A's remote lagging either.
	empty, err := NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pointAt(a, empty)
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, ErrRemoteChanged) {
		t.Fatalf("sync pointed at an empty folder: %v, want ErrRemoteChanged", err)
	}
}

func pointAt(d *device, r Remote) {
	d.t.Helper()
	d.eng.Close()
	d.remote, d.cfg.Remote = r, r
	d.open()
}

// TestPointedAtAnotherAccount: the same over Drive, with two accounts,
// while two devices that race to create one store on one account still
// join it (see TestMarkerRaceOverDrive).
func TestPointedAtAnotherAccount(t *testing.T) {
	srvA, srvB := drivefake.New(t), drivefake.New(t)
	srvB.SetUser("other.user@example.com", "00000000000000000002")
	a, b := driveDevice(t, srvA, "dev-a"), driveDevice(t, srvB, "dev-b")
	a.put("ra", `{"v":"a"}`)
	a.sync()
	b.put("rb", `{"v":"b"}`)
	b.sync()
	r, err := NewDriveRemote(context.Background(), srvB.Service(context.Background(), t), DriveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pointAt(a, r)
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, ErrRemoteChanged) {
		t.Fatalf("sync signed in to B's account: %v, want ErrRemoteChanged", err)
	}
}

// TestRemoteIdentities: an identity is stable for one storage and differs
// between storages.
func TestRemoteIdentities(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv, other := drivefake.New(t), drivefake.New(t)
	other.SetUser("other.user@example.com", "00000000000000000002")
	drive := func(srv *drivefake.Server, folder string) Remote {
		r, err := NewDriveRemote(ctx, srv.Service(ctx, t), DriveOptions{Folder: folder})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	folder := func(dir string) Remote {
		r, err := NewFolderRemote(dir)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	mem := NewMemoryRemote()
	same := [][2]Remote{
		{folder(dir), folder(dir + "/.")},
		{drive(srv, ""), drive(srv, "")},
		{drive(srv, "Notes"), drive(srv, "Notes")},
		{mem, mem},
	}
	different := [][2]Remote{
		{folder(dir), folder(t.TempDir())},
		{drive(srv, ""), drive(other, "")},
		{drive(srv, ""), drive(srv, "Notes")},
		{drive(srv, "Notes"), drive(srv, "Other")},
		{NewMemoryRemote(), NewMemoryRemote()},
	}
	id := func(r Remote) string {
		ir, ok := r.(IdentifiedRemote)
		if !ok {
			t.Fatalf("%T has no identity", r)
		}
		s, err := ir.Identity(ctx)
		if err != nil || s == "" {
			t.Fatalf("%T: Identity = %q, %v", r, s, err)
		}
		return s
	}
	for _, p := range same {
		if x, y := id(p[0]), id(p[1]); x != y {
			t.Errorf("one storage, identities %q and %q", x, y)
		}
	}
	for _, p := range different {
		if x, y := id(p[0]), id(p[1]); x == y {
			t.Errorf("two storages, one identity %q", x)
		}
	}
}
