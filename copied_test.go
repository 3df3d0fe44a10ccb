package drivesync

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// copyDevice copies d's database file to a new path, as a user copying
// an app's data to another machine would, and opens it with cfg.
func copyDevice(t *testing.T, d *device, name string, cfg Config) *device {
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
