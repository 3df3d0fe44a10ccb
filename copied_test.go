package drivesync

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// copyDevice copies d's database file to a new path, as a user copying
// an app's data to another machine would, and opens it with cfg. The copy
// keeps the file's identity, as a cloned disk does: the engine cannot
// tell it from the original at Open, and finds it by its files only (see
// checkCopied). copyFileDevice makes a copy that Open tells apart.
func copyDevice(t *testing.T, d *device, name string, cfg Config) *device {
	t.Helper()
	return copyDeviceFile(t, d, name, cfg, true)
}

// copyFileDevice is copyDevice for a copy of the file that Open can tell
// from the original (another inode).
func copyFileDevice(t *testing.T, d *device, name string, cfg Config) *device {
	t.Helper()
	return copyDeviceFile(t, d, name, cfg, false)
}

func copyDeviceFile(t *testing.T, d *device, name string, cfg Config, clone bool) *device {
	t.Helper()
	c := copyFileDB(t, d, name, cfg)
	if clone {
		c.exec(`UPDATE sync_meta SET value = ? WHERE key = ?`, fileID(c.path), metaFileID)
	}
	c.open()
	return c
}

// A database copied to another machine keeps its device id; the first
// sync that finds a file of its id that it did not write takes a new id
// before it stamps anything, and the copies converge.
func TestCopiedDatabaseTakesNewDeviceID(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	a.cfg.DeviceID = "" // the id the database chose and stored
	a.open()
	a.put("r1", `{"v":1}`)
	a.sync()
	cfg := a.cfg
	cfg.TempDir = t.TempDir()
	c := copyDevice(t, a, "copy", cfg)
	if c.eng.DeviceID() != "dev-a" {
		t.Fatalf("the copy syncs as %s", c.eng.DeviceID())
	}
	c.put("r2", `{"v":2}`)
	c.sync() // a file named with dev-a that a never wrote
	a.put("r3", `{"v":3}`)
	r := a.sync()
	if a.eng.DeviceID() == "dev-a" || !strings.HasSuffix(r.Uploaded, "_"+a.eng.DeviceID()+".json.gz") {
		t.Fatalf("a syncs as %s and uploaded %s; want a new device id before stamping", a.eng.DeviceID(), r.Uploaded)
	}
	syncAll(t, a, c)
	assertConverged(t, a, c)
	if a.get("r2") == "" || c.get("r3") == "" {
		t.Fatal("the copies did not exchange their changes")
	}
	// Reopened, a keeps its new id.
	id := a.eng.DeviceID()
	a.open()
	if a.eng.DeviceID() != id {
		t.Fatalf("after Open a syncs as %s, want %s", a.eng.DeviceID(), id)
	}
}

// An app that sets Config.DeviceID itself is told that a copy syncs
// under the same id; nothing is stamped or lost.
func TestCopiedDatabaseWithFixedDeviceID(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	a.put("r1", `{"v":1}`)
	a.sync()
	cfg := a.cfg
	cfg.TempDir = t.TempDir()
	c := copyDevice(t, a, "copy", cfg)
	c.put("r2", `{"v":2}`)
	c.sync()
	a.put("r3", `{"v":3}`)
	_, err := a.eng.Sync(context.Background())
	if err == nil || !strings.Contains(err.Error(), "copied to another device") {
		t.Fatalf("got %v, want an error saying the database was copied", err)
	}
	if a.pendingCount() != 1 {
		t.Fatal("a's change is no longer pending")
	}
}

// sync_uploaded, the names this database uploaded, stays bounded by what
// the remote holds, and a copy of the database is still found after it
// was pruned.
func TestUploadedNamesBounded(t *testing.T) {
	remote, clk := clockedRemote()
	a := newDevice(t, "dev-a", remote)
	a.cfg.DeviceID = ""
	a.open()
	uploads := 0
	for week := range 20 {
		a.put("r", fmt.Sprintf(`{"week":%d}`, week))
		if a.sync().Uploaded != "" {
			uploads++
		}
		clk.add(7 * 24 * time.Hour)
	}
	var names int
	a.db.QueryRow(`SELECT count(*) FROM sync_uploaded`).Scan(&names)
	files, err := remote.List(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// What the remote holds of a's, plus the names of the month since
	// the last pruning.
	if bound := len(files) + 5; names > bound || uploads < 20 {
		t.Fatalf("sync_uploaded holds %d names after %d uploads over 20 weeks, want at most %d: the remote holds %d files", names, uploads, bound, len(files))
	}
	cfg := a.cfg
	cfg.TempDir = t.TempDir()
	c := copyDevice(t, a, "copy", cfg)
	c.put("r2", `{"v":2}`)
	c.sync()
	clk.add(time.Minute)
	a.put("r3", `{"v":3}`)
	if a.sync(); a.eng.DeviceID() == c.eng.DeviceID() {
		t.Fatal("the copy was not found after sync_uploaded was pruned")
	}
	syncAll(t, a, c)
	assertConverged(t, a, c)
}

// heldRemote is a device's view of a shared folder whose sync tool is
// offline: the device sees only the files it saw when it went offline and
// its own, and what it writes reaches the others only when deliver runs
// (late, as a folder-sync tool delivers it: the file keeps its name,
// the others list it when it arrives).
type heldRemote struct {
	*MemoryRemote
	mu      sync.Mutex
	offline bool
	seen    map[string]bool
	held    map[string][]byte
	order   []string
}

func (h *heldRemote) goOffline(ctx context.Context) {
	files, _ := h.MemoryRemote.List(ctx, time.Time{})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.offline, h.seen, h.held = true, map[string]bool{}, map[string][]byte{}
	for _, f := range files {
		h.seen[f.Name] = true
	}
}

// deliver hands the held files to the shared folder; the device stays
// offline (it does not receive).
func (h *heldRemote) deliver(t *testing.T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, name := range h.order {
		if err := h.MemoryRemote.Create(context.Background(), name, bytes.NewReader(h.held[name])); err != nil {
			t.Fatal(err)
		}
		h.seen[name] = true
	}
	h.held, h.order = map[string][]byte{}, nil
}

func (h *heldRemote) goOnline(t *testing.T) {
	h.deliver(t)
	h.mu.Lock()
	h.offline = false
	h.mu.Unlock()
}

func (h *heldRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	h.mu.Lock()
	off := h.offline
	h.mu.Unlock()
	if !off {
		return h.MemoryRemote.List(ctx, since)
	}
	all, err := h.MemoryRemote.List(ctx, time.Time{})
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []RemoteFile
	for _, f := range all {
		if h.seen[f.Name] {
			out = append(out, f)
		}
	}
	for _, name := range h.order {
		out = append(out, RemoteFile{Name: name, Size: int64(len(h.held[name]))})
	}
	return out, nil
}

func (h *heldRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	h.mu.Lock()
	b, ok := h.held[name]
	h.mu.Unlock()
	if ok {
		return io.NopCloser(bytes.NewReader(b)), nil
	}
	return h.MemoryRemote.Open(ctx, name)
}

func (h *heldRemote) Create(ctx context.Context, name string, r io.Reader) error {
	h.mu.Lock()
	off := h.offline
	h.mu.Unlock()
	if !off {
		return h.MemoryRemote.Create(ctx, name, r)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held[name] = b
	h.order = append(h.order, name)
	return nil
}

// A copy of the database syncs through a shared folder whose sync tool is
// offline; its first file reaches the original's folder weeks later,
// named when the copy wrote it, after the original pruned sync_uploaded.
// The original must still judge that file and take a new id: keeping the
// shared one, its next write would be stamped exactly as the copy's (same
// device id, same version), and the devices would diverge for good. (A
// pruning that moved uploads_since to its listing's start did that.)
func TestCopyFileDeliveredLateAfterUploadsPruned(t *testing.T) {
	mem, clk := clockedRemote()
	a := newDevice(t, "dev-a", mem)
	a.cfg.DeviceID = ""
	a.open()
	a.put("r1", `{"v":1}`)
	a.sync()
	clk.add(time.Minute)
	a.sync()

	held := &heldRemote{MemoryRemote: mem}
	cfg := a.cfg
	cfg.Remote = held
	cfg.TempDir = t.TempDir()
	held.goOffline(context.Background())
	b := copyDevice(t, a, "copy", cfg)
	b.put("x", `{"by":"copy"}`)
	b.sync() // held: named now, delivered weeks later

	for _, day := range []time.Time{
		time.Date(2026, 4, 5, 12, 0, 0, 0, time.UTC),
		time.Date(2026, 5, 5, 12, 0, 0, 0, time.UTC),
	} {
		clk.add(day.Sub(clk.now()))
		a.sync() // the month's first sync prunes sync_uploaded
	}
	held.deliver(t) // the copy's March file reaches the folder
	clk.add(time.Minute)
	id := a.eng.DeviceID()
	a.sync()
	if a.get("x") == "" {
		t.Fatal("setup: a did not apply the copy's file")
	}
	if a.eng.DeviceID() == id {
		t.Errorf("a applied a file carrying its device id that it did not write, and kept the id")
	}
	// Both stamp their next write of z; the copy still sees nothing new.
	a.put("z", `{"by":"a"}`)
	a.sync()
	clk.add(time.Second)
	b.put("z", `{"by":"copy"}`)
	b.sync()
	held.goOnline(t)
	clk.add(time.Minute)
	syncAll(t, a, b)
	syncAll(t, a, b)
	if ga, gb := a.get("z"), b.get("z"); ga != gb {
		t.Fatalf("z = %s on a, %s on the copy: two writes stamped alike", ga, gb)
	}
	assertConverged(t, a, b)
}

// Every device saw x deleted. a creates x again, b receives that and
// deletes it again; c, which received neither, creates x again over the
// first delete, its clock past b's delete. b's delete must hold for a's
// record: nothing of it may come back. c's reset is the first delete (the
// newest stamp c saw), so a's fields, stamped after it, survive the reset,
// and c's write, newer than b's delete, shows the record with them.

// copyFileDB copies d's database file to a file of its own (another
// inode) and opens the copy's database, without an engine.
func copyFileDB(t *testing.T, d *device, name string, cfg Config) *device {
	t.Helper()
	d.exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	b, err := os.ReadFile(d.path)
	if err != nil {
		t.Fatal(err)
	}
	c := &device{t: t, name: name, path: filepath.Join(t.TempDir(), name+".db"), remote: d.remote, cfg: cfg}
	if err := os.WriteFile(c.path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if c.db, err = sql.Open("sqlite", testDSN(c.path)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.db.Close() })
	return c
}
