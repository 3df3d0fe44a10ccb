package drivesync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/drivesync/drivesync/internal/drivefake"
)

// refusingRemote fails Open for the files named in refuse with the
// error given there, leaving the other files and methods alone.
type refusingRemote struct {
	Remote
	mu     sync.Mutex
	refuse map[string]error
}

func (r *refusingRemote) set(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse == nil {
		r.refuse = map[string]error{}
	}
	if err == nil {
		delete(r.refuse, name)
		return
	}
	r.refuse[name] = err
}

func (r *refusingRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	r.mu.Lock()
	err := r.refuse[name]
	r.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("refusing remote: open %s: %w", name, err)
	}
	return r.Remote.Open(ctx, name)
}

func rejectedNames(r Report) []string {
	var names []string
	for _, f := range r.Rejected {
		names = append(names, f.Name)
	}
	return names
}

// TestUnreadableFileIsRejected: a listed file this device may not read
// (permission denied on a shared folder) is reported and skipped like a
// malformed file, the sync uploads as usual, and the file is read again
// later. A failure of the remote itself still fails the sync.
func TestUnreadableFileIsRejected(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryRemote()
	remote := &refusingRemote{Remote: mem}
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", mem)
	b.put("from-b", `{"v":1}`)
	b.sync()
	denied := remoteFiles(t, mem, kindPatch)[0]
	remote.set(denied, &fs.PathError{Op: "open", Path: denied, Err: syscall.EACCES})

	a.put("from-a", `{"v":1}`)
	r, err := a.eng.Sync(ctx)
	if err != nil {
		t.Fatalf("sync with one unreadable file: %v", err)
	}
	if !slices.Equal(rejectedNames(r), []string{denied}) || !errors.Is(r.Rejected[0].Err, fs.ErrPermission) || r.Uploaded == "" {
		t.Fatalf("report %+v, want %s rejected for its permission and a's upload done", r, denied)
	}
	if b.sync(); b.get("from-a") == "" {
		t.Fatal("a's change did not reach b")
	}

	// Read again once the retry is due, and applied once readable.
	remote.set(denied, nil)
	a.exec(`UPDATE sync_files SET checked_at = checked_at - 7200 WHERE name = ?`, denied)
	if r := a.sync(); !slices.Contains(r.Downloaded, denied) || a.get("from-b") == "" {
		t.Fatalf("report %+v, want %s applied once readable", r, denied)
	}

	// The remote failing is not the file's fault: the sync fails, and
	// nothing is uploaded.
	b.put("from-b", `{"v":2}`)
	b.sync()
	next := slices.DeleteFunc(remoteFiles(t, mem, kindPatch), func(n string) bool { return n == denied || !isFrom(n, "dev-b") })[0]
	for _, outage := range []error{
		&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET},
		fmt.Errorf("drive: %w", errors.New("googleapi: Error 503: Backend Error, backendError")),
	} {
		remote.set(next, outage)
		a.put("from-a", `{"v":2}`)
		r, err := a.eng.Sync(ctx)
		if !errors.Is(err, ErrRemote) || r.Uploaded != "" || len(r.Rejected) != 0 {
			t.Fatalf("outage %v: report %+v, err %v; want the sync failed with ErrRemote", outage, r, err)
		}
	}
	// A cancelled sync is not the file's fault either, even if the remote
	// says "permission denied" as it stops.
	remote.set(next, fs.ErrPermission)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := a.eng.Sync(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sync: %v, want context.Canceled", err)
	}
	remote.set(next, nil)
	syncAll(t, a, b)
	assertConverged(t, a, b)
}

func isFrom(name, device string) bool {
	_, _, d, ok := parseFileName(name)
	return ok && d == device
}

// TestUnreadableSnapshotIsRejected: a snapshot whose header cannot be
// read for permission is rejected, not a failed sync.
func TestUnreadableSnapshotIsRejected(t *testing.T) {
	mem := NewMemoryRemote()
	remote := &refusingRemote{Remote: mem}
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", mem)
	a.put("n", `{"v":1}`)
	syncAll(t, a, b)
	if _, err := b.eng.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	snap := remoteFiles(t, mem, kindSnapshot)[0]
	remote.set(snap, fs.ErrPermission)
	a.put("n", `{"v":2}`)
	r, err := a.eng.Sync(context.Background())
	if err != nil || !slices.Contains(rejectedNames(r), snap) || r.Uploaded == "" {
		t.Fatalf("report %+v, err %v; want the snapshot rejected and a's upload done", r, err)
	}
}

// TestUnreadableFileOverDrive: Drive refusing one file (403
// insufficientFilePermissions on its download) rejects that file; a 503
// that outlasts the retries fails the sync with ErrRemote.
func TestUnreadableFileOverDrive(t *testing.T) {
	srv := drivefake.New(t)
	a, b := driveDevice(t, srv, "dev-a"), driveDevice(t, srv, "dev-b")
	b.put("from-b", `{"v":1}`)
	b.sync()
	var id, name string
	for _, f := range srv.Files() {
		if strings.HasPrefix(f.Name, "patch_") && strings.HasSuffix(f.Name, "_dev-b.json.gz") { // Drive's names are the base names
			id, name = f.ID, f.Name
		}
	}
	srv.Fail(drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files/" + id, Status: http.StatusForbidden, Reason: "insufficientFilePermissions", Times: 1})
	a.put("from-a", `{"v":1}`)
	r, err := a.eng.Sync(context.Background())
	if err != nil || len(r.Rejected) != 1 || !errors.Is(r.Rejected[0].Err, fs.ErrPermission) || r.Uploaded == "" {
		t.Fatalf("report %+v, err %v; want %s rejected and a's upload done", r, err, name)
	}
	a.exec(`UPDATE sync_files SET checked_at = checked_at - 7200`)
	srv.Fail(drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files/" + id, Status: http.StatusServiceUnavailable, Times: 8})
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, ErrRemote) || errors.Is(err, fs.ErrPermission) {
		t.Fatalf("Drive down: %v, want ErrRemote", err)
	}
	srv.ClearFaults()
	if r := a.sync(); a.get("from-b") == "" {
		t.Fatalf("report %+v: the file was not applied once readable", r)
	}
}

// TestUnreadableFileInFolder: a file of a shared folder that this user may
// not read. Root reads every file, so the test needs another user.
func TestUnreadableFileInFolder(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root may read any file")
	}
	dir := t.TempDir()
	remote, err := NewFolderRemote(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	b.put("from-b", `{"v":1}`)
	b.sync()
	denied := remoteFiles(t, remote, kindPatch)[0]
	path := filepath.Join(dir, filepath.FromSlash(denied))
	if err := os.Chmod(path, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(path, 0o644) })
	a.put("from-a", `{"v":1}`)
	r, err := a.eng.Sync(context.Background())
	if err != nil || !slices.Equal(rejectedNames(r), []string{denied}) || r.Uploaded == "" {
		t.Fatalf("report %+v, err %v; want %s rejected and a's upload done", r, err, denied)
	}
}
