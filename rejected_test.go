package drivesync

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// truncatingRemote serves the first half of the files named in cut, as a
// folder-sync tool still writing them would.
type truncatingRemote struct {
	Remote
	mu  sync.Mutex
	cut map[string]bool
}

func (r *truncatingRemote) setCut(names ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cut = map[string]bool{}
	for _, n := range names {
		r.cut[n] = true
	}
}

func (r *truncatingRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	rc, err := r.Remote.Open(ctx, name)
	r.mu.Lock()
	cut := r.cut[name]
	r.mu.Unlock()
	if err != nil || !cut {
		return rc, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(b[:len(b)/2])), nil
}

// A snapshot a device could not read stays rejected, and is read again
// (by name: the remote no longer lists it to that device) once it may
// have been completed. Before, it was recorded as applied and never
// loaded, and the patch file it replaced was lost to that device.
func TestRejectedSnapshotReadAgain(t *testing.T) {
	mem, clk := clockedRemote()
	tb := &truncatingRemote{Remote: mem}
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", tb)
	withRetention(a, time.Minute)
	withRetention(b, time.Minute)
	a.put("r1", `{"v":1}`)
	a.sync()
	b.sync()
	a.put("r2", `{"v":2}`)
	a.sync()
	clk.add(40 * time.Minute)
	if _, err := a.eng.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.add(20 * time.Minute)
	r, err := a.eng.Snapshot(context.Background()) // compacts with the first snapshot: r2's file goes
	if err != nil || r.Deleted == 0 {
		t.Fatalf("compaction deleted %d files, err %v", r.Deleted, err)
	}
	tb.setCut(remoteFiles(t, mem, kindSnapshot)...)
	r = b.sync()
	if len(r.Rejected) == 0 {
		t.Fatalf("b read the truncated snapshots: %+v", r)
	}
	tb.setCut()
	clk.add(5 * time.Minute)
	b.sync() // within the retry delay: nothing read again
	clk.add(2 * time.Hour)
	r = b.sync()
	if b.get("r2") == "" {
		t.Fatalf("b never got r2 from the snapshot it first could not read: %+v", r)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
}

// A rejected patch file is read again by name once it may have changed,
// although the remote lists only files created since the cursor.
func TestRejectedFileReadAgainByName(t *testing.T) {
	mem, clk := clockedRemote()
	tb := &truncatingRemote{Remote: mem}
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", tb)
	a.put("n", `{"v":1}`)
	a.sync()
	tb.setCut(remoteFiles(t, mem, kindPatch)...)
	if r := b.sync(); len(r.Rejected) != 1 {
		t.Fatalf("rejected %v, want the truncated file", r.Rejected)
	}
	tb.setCut()
	clk.add(30 * time.Minute)
	if r := b.sync(); len(r.Downloaded) != 0 {
		t.Fatalf("read again within the retry delay: %v", r.Downloaded)
	}
	clk.add(2 * time.Hour) // the file is now far behind b's listing window
	r := b.sync()
	if b.get("n") == "" {
		t.Fatalf("the completed file was never read again: %+v", r)
	}
}

// A patch file truncated in place on a shared folder is rejected by a
// device that joins; a snapshot written by a device that had applied the
// file brings its records to that device.
func TestCorruptFileHealedBySnapshot(t *testing.T) {
	dir := t.TempDir()
	remote, err := NewFolderRemote(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := newDevice(t, "dev-a", remote)
	for i := range 50 {
		a.put("r"+string(rune('A'+i%26))+string(rune('a'+i/26)), `{"v":1}`)
	}
	a.sync()
	patches := remoteFiles(t, remote, kindPatch)
	if len(patches) != 1 {
		t.Fatalf("patches %v", patches)
	}
	path := filepath.Join(dir, filepath.FromSlash(patches[0]))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	c := newDevice(t, "dev-c", remote)
	if r := c.sync(); len(r.Rejected) != 1 {
		t.Fatalf("c: rejected %v, want the truncated file", r.Rejected)
	}
	if _, err := a.eng.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := c.sync()
	var got int
	if err := c.db.QueryRow(`SELECT count(*) FROM notes`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != 50 {
		t.Fatalf("c holds %d records after a snapshot holding the truncated file appeared, want 50: %+v", got, r)
	}
	assertConverged(t, a, c)
}

// A file a device rejected, then found gone when it read it again
// (compacted meanwhile, on the authority of a snapshot the device had
// already checked), is taken from a snapshot that holds it. Before, the
// device forgot the file and never received its records.
func TestRejectedFileCompactedMeanwhile(t *testing.T) {
	mem, clk := clockedRemote()
	tb := &truncatingRemote{Remote: mem}
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", tb)
	withRetention(a, time.Minute)
	withRetention(b, time.Minute)
	a.put("n", `{"v":1}`)
	a.sync()
	tb.setCut(remoteFiles(t, mem, kindPatch)...)
	if r := b.sync(); len(r.Rejected) != 1 {
		t.Fatalf("rejected %v, want the truncated file", r.Rejected)
	}
	clk.add(40 * time.Minute)
	snap := a.snapshot().Snapshot
	// b checked that snapshot while it read the file again (the header
	// showed nothing else missing); the file failed again.
	b.exec(`INSERT INTO sync_files (name, status, size) VALUES (?, 'checked', 0)`, snap)
	clk.add(20 * time.Minute)
	if r := a.snapshot(); r.Deleted == 0 {
		t.Fatalf("a compacted nothing: %+v", r)
	}
	tb.setCut()
	clk.add(3 * time.Hour)
	r := b.sync()
	if b.get("n") == "" {
		t.Fatalf("b never got the records of the file it rejected: %+v", r)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
}

// onceRemote lets each named file be opened once (a snapshot's header
// reads), then refuses it, as a shared folder whose owner withdrew the
// permission between two reads would.
type onceRemote struct {
	Remote
	mu     sync.Mutex
	opened map[string]int
	names  map[string]bool
}

func (r *onceRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	r.mu.Lock()
	r.opened[name]++
	refuse := r.names[name] && r.opened[name] > 1
	r.mu.Unlock()
	if refuse {
		return nil, fmt.Errorf("once remote: open %s: %w", name, fs.ErrPermission)
	}
	return r.Remote.Open(ctx, name)
}

// A snapshot whose header showed nothing lacking while a file it holds was
// still to be downloaded is not checked when that file is then rejected
// and the snapshot itself cannot be read: the device does not hold what
// the snapshot holds. Before, it was recorded as checked; the device's own
// snapshot then named it as known, and once compaction had deleted the
// file, the device loaded its own snapshot to recover it, took the
// checked snapshot as held, and never received the file's records.
func TestSnapshotNotCheckedWhenItsFileIsRejected(t *testing.T) {
	mem, clk := clockedRemote()
	refuse := &refusingRemote{Remote: mem}
	once := &onceRemote{Remote: refuse, opened: map[string]int{}, names: map[string]bool{}}
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", once)
	withRetention(a, time.Minute)
	withRetention(b, time.Minute)
	a.put("r1", `{"v":1}`)
	a.sync()
	b.sync()
	s0 := a.snapshot().Snapshot
	clk.add(time.Minute)
	a.put("r2", `{"v":2}`)
	f := a.sync().Uploaded
	clk.add(40 * time.Minute)
	s1 := a.snapshot().Snapshot // holds f, knows s0

	refuse.set(f, fs.ErrPermission)
	once.names[s1] = true
	r := b.sync()
	if got := rejectedNames(r); !slices.Contains(got, f) || !slices.Contains(got, s1) {
		t.Fatalf("b rejected %v, want %s and %s", got, f, s1)
	}
	var status string
	b.db.QueryRow(`SELECT status FROM sync_files WHERE name = ?`, s1).Scan(&status)
	if status == fileChecked || status == fileApplied {
		t.Fatalf("b recorded %s as %s, though it holds %s, which b rejected", s1, status, f)
	}
	clk.add(10 * time.Minute)
	b.snapshot()

	// a compacts on s1's authority (b's snapshot is too young to be one):
	// f and s0 go; s1 stays.
	clk.add(6 * time.Minute)
	if r := a.sync(); r.Deleted == 0 {
		t.Fatalf("a compacted nothing: %+v", r)
	}
	if files := remoteFiles(t, mem, kindPatch); slices.Contains(files, f) {
		t.Fatalf("%s was not compacted", f)
	}
	if snaps := remoteFiles(t, mem, kindSnapshot); slices.Contains(snaps, s0) || !slices.Contains(snaps, s1) {
		t.Fatalf("snapshots after compaction: %v (want %s gone, %s kept)", snaps, s0, s1)
	}

	refuse.set(f, nil)
	once.names[s1] = false
	clk.add(3 * time.Hour)
	r = b.sync()
	if b.get("r2") == "" {
		t.Fatalf("b never received r2, whose file it rejected: %+v", r)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
}

// A snapshot that lists, in its header, an older snapshot that
// is listed now is recorded as checked on the strength of that older one
// being "checked later in this sync". If the older one is deleted (a
// compaction by its writer, or a listing that still shows a deleted file)
// before its header is read, it is neither checked nor rejected, and the
// newer snapshot stays recorded as checked although this device never held
// what the older one held. Files compacted on the older one's authority
// never reach this device.

// goneOnOpen is a device's view of a remote on which another device
// compacts while this one syncs: before is run when the named file is
// opened the first time.
type goneOnOpen struct {
	Remote
	mu     sync.Mutex
	name   string
	before func()
}

func (g *goneOnOpen) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	g.mu.Lock()
	fn := g.before
	if name == g.name && fn != nil {
		g.before = nil
	}
	g.mu.Unlock()
	if name == g.name && fn != nil {
		fn()
	}
	return g.Remote.Open(ctx, name)
}

// Before, the newer snapshot was recorded as checked; files compacted on
// the older one's authority never reached this device.
func TestSnapshotGoneWhileCheckingNotChecked(t *testing.T) {
	mem, clk := clockedRemote()
	view := &goneOnOpen{Remote: mem}
	a := newDevice(t, "dev-a", mem)
	x := newDevice(t, "dev-x", view)
	withRetention(a, time.Hour)
	withRetention(x, time.Hour)

	a.put("r0", `{"v":0}`)
	a.sync()
	x.sync() // x has synced state: it is not a new device

	clk.add(time.Minute)
	a.put("r1", `{"v":1}`) // x is offline from here on
	a.sync()

	clk.add(2 * time.Hour)
	r, err := a.eng.Snapshot(context.Background()) // S2: holds r1's file
	if err != nil {
		t.Fatal(err)
	}
	s2 := r.Snapshot
	clk.add(20 * time.Minute)
	r = a.sync() // compacts on S2: r0's and r1's files go
	t.Logf("a compacted %d files on %s", r.Deleted, s2)
	if r.Deleted == 0 {
		t.Fatal("setup: nothing compacted")
	}
	clk.add(time.Hour)
	r, err = a.eng.Snapshot(context.Background()) // S1: knows S2
	if err != nil {
		t.Fatal(err)
	}
	s1 := r.Snapshot
	clk.add(20 * time.Minute)

	// x comes back and lists S1 and S2. Between its listing and its read
	// of S2, a compacts on S1's authority, which deletes S2 (S1 knows it).
	view.name = s2
	view.before = func() {
		r := a.sync()
		t.Logf("a compacted %d files while x synced", r.Deleted)
	}
	rx := x.sync()
	t.Logf("x: downloaded %v, rejected %v", rx.Downloaded, rx.Rejected)
	var status string
	x.db.QueryRow(`SELECT status FROM sync_files WHERE name = ?`, s1).Scan(&status)
	t.Logf("x records %s as %q", s1, status)

	syncAll(t, a, x)
	if got := x.get("r1"); got != `{"v":1}` {
		t.Errorf("x: r1 = %q, want {\"v\":1}: its file was compacted and the snapshot holding it was never loaded", got)
	}
	assertConverged(t, a, x)
}
