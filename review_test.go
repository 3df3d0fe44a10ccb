package drivesync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/merge"
)

// Regression tests for problems an independent review found.

// A sync slower than the listing overlap must not skip files created
// while it ran: the cursor is the remote's time before the listing.
func TestSlowSyncDoesNotSkipFiles(t *testing.T) {
	mem := NewMemoryRemote()
	clock := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	mem.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return clock })
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	a.put("mine", `{"v":1}`)
	hooks(a.eng).step = func(p string) error {
		if p == "fetched" {
			b.put("theirs", `{"v":1}`)
			b.sync()
			mu.Lock()
			clock = clock.Add(20 * time.Minute)
			mu.Unlock()
		}
		return nil
	}
	a.sync()
	hooks(a.eng).step = nil
	mu.Lock()
	clock = clock.Add(time.Minute)
	mu.Unlock()
	a.sync()
	if a.get("theirs") == "" {
		t.Fatal("a file created during a slow sync was never applied")
	}
}

// A file named in the far future must not move the cursor.
func TestFutureNameDoesNotFreezeCursor(t *testing.T) {
	mem := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	writeRaw(t, mem, "2099/01/01/patch_20990101T000000.000Z_evil.json.gz", true, "garbage")
	if r := b.sync(); len(r.Rejected) != 1 {
		t.Fatalf("rejected %v", r.Rejected)
	}
	a.put("n", `{"v":1}`)
	a.sync()
	b.sync()
	if b.get("n") == "" {
		t.Fatal("b stopped receiving after a future-named file")
	}
}

// A rejected file is read again once it may have changed: after an hour
// (a sync tool may have been writing it), or under new limits.
func TestRejectedFileRetried(t *testing.T) {
	dir := t.TempDir()
	remote, err := NewFolderRemote(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("n", `{"v":1}`)
	a.sync()
	files, _ := remote.List(context.Background(), time.Time{})
	name := files[0].Name
	good, _ := remote.Open(context.Background(), name)
	var content strings.Builder
	buf := make([]byte, 1<<16)
	for {
		k, err := good.Read(buf)
		content.Write(buf[:k])
		if err != nil {
			break
		}
	}
	good.Close()
	// b first sees the file as a sync tool pre-allocates it: zeros.
	path := dir + "/" + name
	writeFile(t, path, strings.Repeat("\x00", content.Len()))
	if r := b.sync(); len(r.Rejected) != 1 {
		t.Fatalf("rejected %v, want the unfinished file", r.Rejected)
	}
	writeFile(t, path, content.String()) // same size, now complete
	if r := b.sync(); len(r.Downloaded) != 0 {
		t.Fatalf("re-read within the hour: %v", r.Downloaded)
	}
	b.exec(`UPDATE sync_files SET checked_at = checked_at - 7200`)
	if r := b.sync(); len(r.Downloaded) != 1 || b.get("n") == "" {
		t.Fatalf("the completed file was not applied: %+v", r)
	}
}

// Clocks nest twice as deep as content; deep content must still load.
func TestDeepContentClock(t *testing.T) {
	deep := func(leaf string) string {
		return strings.Repeat(`{"a":`, 150) + leaf + strings.Repeat("}", 150)
	}
	n := &merge.Node{}
	n.ApplyPatch(mustObject(t, deep(`{"x":1}`), true), merge.Stamp{Version: 1, Device: "d1"})
	n.ApplyPatch(mustObject(t, deep(`{"y":2}`), true), merge.Stamp{Version: 2, Device: "d2"})
	data, clock := merge.EncodeState(n)
	back, err := merge.DecodeState(mustObject(t, data, false), []byte(clock), false)
	if err != nil {
		t.Fatal(err)
	}
	if d, c := merge.EncodeState(back); d != data || c != clock {
		t.Fatal("deep state did not round-trip")
	}
}

// A constraint on a projection column refuses one row; the sync goes on
// and reports it.
func TestConstraintOnProjectionReported(t *testing.T) {
	schema := `CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL, slug TEXT UNIQUE)`
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote, schema), newDevice(t, "dev-b", remote, schema)
	a.put("n1", `{"slug":"same"}`)
	b.put("n2", `{"slug":"same"}`)
	a.sync()
	r := b.sync()
	if len(r.Unwritten) != 1 || r.Unwritten[0].Record != "n1" || r.Uploaded == "" {
		t.Fatalf("report %+v, want n1 unwritten and b's upload done", r)
	}
	a.put("other", `{"slug":"other"}`)
	if r := a.sync(); len(r.Unwritten) != 1 || r.Unwritten[0].Record != "n2" {
		t.Fatalf("a: report %+v, want n2 unwritten", r)
	}
	b.sync()
	if b.get("other") == "" {
		t.Fatal("b's sync is stuck after a refused row")
	}
}

func TestTableNameSpelling(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	cfg := d.cfg
	cfg.Tables = []Table{{Name: "Notes"}}
	_, err := Open(context.Background(), d.db, cfg)
	if err == nil || !strings.Contains(err.Error(), "spelled notes") {
		t.Fatalf("got %v, want an error about the spelling", err)
	}
	var n int
	d.db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'trigger'`).Scan(&n)
	if want := len(triggerSQL(&tableInfo{name: "notes"})); n != want {
		t.Fatalf("%d triggers left, want %d", n, want)
	}
}

// Writes during a sync are rebased with the engine's merge, which keeps
// nulls inside arrays.
func TestRebaseKeepsNullsInArrays(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("n", `{"v":1}`)
	syncAll(t, a, b)
	b.put("n", `{"v":2}`)
	b.sync()
	hooks(a.eng).step = func(p string) error {
		if p == "planned" {
			a.put("n", `{"v":1,"arr":[{"x":null,"y":1},null]}`)
		}
		return nil
	}
	a.sync()
	hooks(a.eng).step = nil
	if got, want := a.get("n"), `{"arr":[{"x":null,"y":1},null],"v":2}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
}

// A row rewritten during a sync with the same content but other bytes
// ends canonical, and the pending mark is cleared.
func TestDirtyRowRewrittenCanonical(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("n", `{"x":0}`)
	hooks(a.eng).step = func(p string) error {
		if p == "planned" {
			a.put("n", `{"y":null,"x":0}`)
			a.exec(`UPDATE notes SET title = 'set alone' WHERE id = 'n'`)
		}
		return nil
	}
	a.sync()
	hooks(a.eng).step = nil
	syncAll(t, a, b)
	assertConverged(t, a, b)
}

// Versions are bounded by time: a file may carry no version above what
// its name's time allows (a million a second since 2020), so that no file
// can leave the store unable to stamp its own changes, and every device,
// new or old, judges a file alike. A version at the stamping limit used to
// be accepted, after which no device could ever send a change again.
func TestVersionLimit(t *testing.T) {
	mem, clk := clockedRemote()
	b := newDevice(t, "dev-b", mem)
	file := func(at time.Time, v int64) {
		writeRaw(t, mem, patchFileName(at, "dev-x"), true, fmt.Sprintf(
			`{"format":1,"device":"dev-x","changes":[{"table_name":"notes","record_id":"r%d","patch":{"a":1},"sync_version":%d}]}`, v, v))
	}
	t0 := clk.now().Add(-time.Hour)
	file(t0, merge.MaxVersion+1)
	file(t0.Add(time.Second), merge.MaxVersion)
	file(t0.Add(2*time.Second), merge.VersionsAllowed(t0.Add(2*time.Second))+1)
	at := t0.Add(3 * time.Second)
	file(at, merge.VersionsAllowed(at))
	r := b.sync()
	if len(r.Rejected) != 3 || len(r.Downloaded) != 1 {
		t.Fatalf("report %+v, want three files rejected and the one at the bound applied", r)
	}
	for _, rej := range r.Rejected {
		if !errors.Is(rej.Err, ErrCorruptFile) {
			t.Errorf("%s: %v, want ErrCorruptFile", rej.Name, rej.Err)
		}
	}
	// Above the largest version its clock allows, the store still stamps.
	clk.add(time.Second)
	b.put("mine", `{"v":1}`)
	if r := b.sync(); r.ChangesSent != 1 {
		t.Fatalf("b could not send its change: %+v", r)
	}
	// A new device judges every file as b did, in one sync.
	c := newDevice(t, "dev-c", mem)
	if r := c.sync(); len(r.Rejected) != 3 {
		t.Fatalf("c rejected %v", r.Rejected)
	}
	assertConverged(t, b, c)
	// A file named ahead of the clock with versions its own time allows is
	// refused until the clock gets there, then taken by every device.
	ahead := clk.now().Add(2 * time.Hour)
	file(ahead, merge.VersionsAllowed(ahead))
	clk.add(time.Second)
	if r := b.sync(); len(r.Rejected) != 1 || !strings.Contains(r.Rejected[0].Err.Error(), "ahead of this device's clock") {
		t.Fatalf("file ahead of the clock: rejected %v", r.Rejected)
	}
	clk.add(3 * time.Hour)
	b.sync()
	c.sync()
	assertConverged(t, b, c)
	// A merge file (applied by every device) with a record stamped beyond
	// its time is rejected too.
	clk.add(time.Second)
	mat := clk.now()
	merge := fmt.Sprintf(`{"format":1,"device":"dev-x","store":%q,"covers":"2026-01-01T00:00:00Z","records":[
{"table_name":"notes","record_id":"m","state":{"a":1},"clock":{"d":["dev-x"],"n":[%d,0,{}]},"is_deleted":false}]}`, b.store(), merge.VersionsAllowed(mat)+5)
	writeRaw(t, mem, remoteFileName(kindMerge, mat, "dev-x"), true, merge)
	clk.add(time.Second)
	r = b.sync()
	i := slices.IndexFunc(r.Rejected, func(f FileError) bool { return strings.Contains(f.Name, "/merge_") })
	if i < 0 || !errors.Is(r.Rejected[i].Err, ErrCorruptFile) || !strings.Contains(r.Rejected[i].Err.Error(), "hostile") {
		t.Fatalf("merge file with a version beyond its time: rejected %v", r.Rejected)
	}
}

// VersionsAllowed and VersionTime agree: the bound grows a million a
// second, and VersionTime is the first time it admits a version.
func TestVersionsAllowed(t *testing.T) {
	for _, at := range []time.Time{
		time.Date(2019, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 23, 10, 11, 12, 345678901, time.UTC),
		time.Date(2290, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		v := merge.VersionsAllowed(at)
		if v < merge.VersionBase || v > merge.MaxVersion {
			t.Errorf("VersionsAllowed(%v) = %d", at, v)
		}
		if v < merge.MaxVersion && v > merge.VersionBase {
			if vt := merge.VersionTime(v); merge.VersionsAllowed(vt) < v || merge.VersionsAllowed(vt.Add(-time.Microsecond)) >= v {
				t.Errorf("VersionTime(%d) = %v does not first admit it", v, vt)
			}
		}
	}
	if got, want := merge.VersionsAllowed(time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC))-merge.VersionsAllowed(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), int64(merge.VersionRate); got != want {
		t.Errorf("one second allows %d versions, want %d", got, want)
	}
}

// A remote clock that does not move must not make a device's upload names
// collide with its earlier ones; a name another file took meanwhile (a
// copy of the database, a hostile writer) is renamed at recovery, and the
// other file never taken for the device's own.
func TestUploadNameCollision(t *testing.T) {
	mem := NewMemoryRemote()
	frozen := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	mem.SetClock(func() time.Time { return frozen })
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	a.put("n1", `{"v":1}`)
	r1 := a.sync()
	a.put("n2", `{"v":2}`)
	r2 := a.sync()
	if r1.Uploaded == r2.Uploaded || r2.Uploaded == "" {
		t.Fatalf("uploads %q and %q", r1.Uploaded, r2.Uploaded)
	}
	// At recovery: the first attempt fails before storing, and another
	// file takes the stored upload's name meanwhile.
	fr := &failingRemote{Remote: mem, failCreate: true}
	a.cfg.Remote = fr
	a.open()
	a.put("n3", `{"v":3}`)
	if _, err := a.eng.Sync(context.Background()); err == nil {
		t.Fatal("sync succeeded with a failing Create")
	}
	var pending string
	a.db.QueryRow(`SELECT name FROM sync_outbox`).Scan(&pending)
	if pending == r1.Uploaded || pending == r2.Uploaded {
		t.Fatalf("outbox name %q repeats an earlier upload's", pending)
	}
	writeRaw(t, mem, pending, true, `{"format":2,"device":"dev-a","changes":[]}`)
	fr.failCreate = false
	if r := a.sync(); r.Recovered == "" || r.Recovered == pending {
		t.Fatalf("recovered %q, want the upload under a new name (not %q)", r.Recovered, pending)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if b.get("n3") != `{"v":3}` {
		t.Fatal("the renamed upload never arrived")
	}
}

// A device whose own changes are stamped at the time bound, with the
// remote's clock standing still, names them a little after the clock (see
// waitForVersions). A snapshot it writes then must be named no earlier
// than its versions allow, or every other device would reject it.
// (Found by the harness once its clock could move less than a
// millisecond between readings.)
func TestSnapshotNamedAfterItsVersions(t *testing.T) {
	mem, clk := clockedRemote()
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	writeRaw(t, mem, patchFileName(clk.now(), "dev-x"), true, fmt.Sprintf(
		`{"format":2,"device":"dev-x","changes":[{"table_name":"notes","record_id":"x","patch":{"a":1},"sync_version":%d}]}`, merge.VersionsAllowed(clk.now())))
	a.sync()
	a.put("mine", `{"v":1}`)
	if r := a.sync(); r.ChangesSent != 1 {
		t.Fatalf("a could not send its change: %+v", r)
	}
	r, err := a.eng.Snapshot(context.Background())
	if err != nil || r.Snapshot == "" {
		t.Fatalf("Snapshot: %+v, %v", r, err)
	}
	clk.add(time.Second) // the clock reaches the versions a's files carry
	if rb := b.sync(); len(rb.Rejected) != 0 {
		t.Fatalf("b rejected %v", rb.Rejected)
	}
	c := newDevice(t, "dev-c", mem)
	if rc := c.sync(); len(rc.Rejected) != 0 {
		t.Fatalf("c rejected %v", rc.Rejected)
	}
	assertConverged(t, a, b, c)
}
