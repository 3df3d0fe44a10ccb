package drivesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// stepClock is a remote clock a test moves by hand.
type stepClock struct {
	mu sync.Mutex
	at time.Time
}

func newStepClock(m *MemoryRemote) *stepClock {
	c := &stepClock{at: time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)}
	m.SetClock(c.now)
	return c
}

func (c *stepClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = c.at.Add(time.Millisecond) // every call moves on, as real time does
	return c.at
}

func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	c.at = c.at.Add(d)
	c.mu.Unlock()
}

// remoteFiles lists the remote's files of one kind.
func remoteFiles(t testing.TB, r Remote, kind fileKind) []string {
	t.Helper()
	files, err := r.List(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		if k, _, _, ok := parseFileName(f.Name); ok && k == kind {
			out = append(out, f.Name)
		}
	}
	return out
}

func (d *device) snapshot() Report {
	d.t.Helper()
	r, err := d.eng.Snapshot(context.Background())
	if err != nil {
		d.t.Fatalf("%s: Snapshot: %v", d.name, err)
	}
	if r.Snapshot == "" {
		d.t.Fatalf("%s: Snapshot wrote no snapshot: %+v", d.name, r)
	}
	return r
}

// withRetention reopens d with a short retention.
func (d *device) withRetention(r time.Duration) *device {
	d.cfg.Retention = r
	d.open()
	return d
}

// TestBootstrapFromSnapshot: a new device starts from the newest snapshot
// and the files after it, skips the files the snapshot holds, keeps and
// uploads the rows it had before its first sync, and ends byte-identical.
func TestBootstrapFromSnapshot(t *testing.T) {
	mem := NewMemoryRemote()
	clk := newStepClock(mem)
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	for i := range 20 {
		a.put(fmt.Sprint("n", i), fmt.Sprintf(`{"v":%d,"tags":{"a":1}}`, i))
	}
	a.sync()
	b.sync()
	b.put("n1", `{"v":1,"tags":{"b":2}}`)
	b.exec(`DELETE FROM notes WHERE id = 'n2'`)
	syncAll(t, a, b)
	clk.advance(time.Hour)
	snap := a.snapshot().Snapshot
	clk.advance(time.Hour)
	b.put("n3", `{"v":"after the snapshot"}`)
	syncAll(t, a, b)

	c := newDevice(t, "dev-c", mem)
	c.put("mine", `{"from":"c"}`) // written before c ever synced
	c.put("n4", `{"v":"c's own"}`)
	r := c.sync()
	if len(r.Downloaded) == 0 || r.Downloaded[0] != snap {
		t.Fatalf("c downloaded %v, want the snapshot %s first", r.Downloaded, snap)
	}
	if len(r.Downloaded) != 2 {
		t.Fatalf("c downloaded %v, want the snapshot and the one file written after it", r.Downloaded)
	}
	if r.ChangesSent != 2 {
		t.Fatalf("c sent %d changes, want its 2 rows written before its first sync", r.ChangesSent)
	}
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
	if got := a.get("mine"); got != `{"from":"c"}` {
		t.Fatalf("a has c's row as %q", got)
	}
	// c's row, written without seeing n4, is c's merge patch: it wins
	// on "v" and leaves the rest.
	if got := a.get("n4"); got != `{"tags":{"a":1},"v":"c's own"}` {
		t.Fatalf("a has n4 = %q, want c's later write merged", got)
	}
	if got := c.get("n2"); got != "" {
		t.Fatalf("c has the deleted n2: %s", got)
	}
}

// TestBootstrapAdoptsRowsOfNewTable: rows that existed before the table
// was registered, on a device that never synced, are uploaded too.
func TestBootstrapAdoptsRowsOfNewTable(t *testing.T) {
	mem := NewMemoryRemote()
	a := newDevice(t, "dev-a", mem)
	a.put("x", `{"v":"a"}`)
	a.sync()
	a.snapshot()
	c := newDevice(t, "dev-c", mem, notesSchema, `CREATE TABLE tasks (id TEXT PRIMARY KEY, content TEXT NOT NULL)`)
	c.exec(`INSERT INTO tasks (id, content) VALUES ('t1', '{"done":false}')`) // before registration
	c.cfg.Tables = append(c.cfg.Tables, Table{Name: "tasks"})
	c.open()
	if r := c.sync(); r.ChangesSent != 1 {
		t.Fatalf("c sent %d changes, want the task", r.ChangesSent)
	}
	a.sync()
	var n int
	if err := a.db.QueryRow(`SELECT count(*) FROM sync_states WHERE table_name = 'tasks'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("a has %d task states (%v), want 1", n, err)
	}
}

// TestTwoSnapshotsSameMonth: two devices snapshot in the same month; both
// files are harmless, the newest is used, and compaction keeps it.
func TestTwoSnapshotsSameMonth(t *testing.T) {
	mem := NewMemoryRemote()
	clk := newStepClock(mem)
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	a.put("n", `{"v":1}`)
	syncAll(t, a, b)
	s1 := a.snapshot().Snapshot
	b.put("n", `{"v":2}`)
	s2 := b.snapshot().Snapshot
	if s1 >= s2 {
		t.Fatalf("snapshot names out of order: %s, %s", s1, s2)
	}
	c := newDevice(t, "dev-c", mem)
	if r := c.sync(); r.Downloaded[0] != s2 {
		t.Fatalf("c started from %v, want the newest snapshot %s", r.Downloaded, s2)
	}
	clk.advance(time.Hour)
	syncAll(t, a, b, c) // b's compaction is due: it supersedes a's snapshot
	if got := remoteFiles(t, mem, kindSnapshot); len(got) != 1 || got[0] != s2 {
		t.Fatalf("snapshots left %v, want only %s", got, s2)
	}
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
}

// TestCompaction deletes the patch files older than the retention once a
// snapshot is older than the listing overlap, and never a newer file.
func TestCompaction(t *testing.T) {
	mem := NewMemoryRemote()
	clk := newStepClock(mem)
	a := newDevice(t, "dev-a", mem).withRetention(24 * time.Hour)
	b := newDevice(t, "dev-b", mem).withRetention(24 * time.Hour)
	for day := range 5 {
		a.put("n", fmt.Sprintf(`{"day":%d}`, day))
		b.put(fmt.Sprint("b", day), `{"v":1}`)
		syncAll(t, a, b)
		clk.advance(24 * time.Hour)
	}
	a.put("n", `{"day":5}`)
	syncAll(t, a, b)
	old := remoteFiles(t, mem, kindPatch)
	r := a.snapshot()
	if r.Deleted != 0 {
		t.Fatalf("deleted %d files before the snapshot was older than the overlap", r.Deleted)
	}
	clk.advance(time.Hour)
	r = a.sync()
	if r.Deleted == 0 {
		t.Fatalf("the first sync after the overlap compacted nothing: %+v", r)
	}
	left := remoteFiles(t, mem, kindPatch)
	_, snapAt, _, _ := parseFileName(remoteFiles(t, mem, kindSnapshot)[0])
	for _, name := range left {
		if _, at, _, _ := parseFileName(name); at.Before(snapAt.Add(-24*time.Hour - time.Minute)) {
			t.Fatalf("%s is older than the retention and was kept", name)
		}
	}
	if len(left) == 0 || len(left) >= len(old) {
		t.Fatalf("%d patch files before, %d after: want some, not all, deleted", len(old), len(left))
	}
	// A new device still gets everything.
	c := newDevice(t, "dev-c", mem)
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
}

// deleteFailingRemote refuses deletes while failing is set.
type deleteFailingRemote struct {
	Remote
	mu      sync.Mutex
	failing bool
	gone    map[string]bool // names Open pretends were deleted
}

func (r *deleteFailingRemote) Delete(ctx context.Context, name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing {
		return errInjected
	}
	return r.Remote.Delete(ctx, name)
}

func (r *deleteFailingRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	r.mu.Lock()
	gone := r.gone[name]
	r.mu.Unlock()
	if gone {
		return nil, fs.ErrNotExist
	}
	return r.Remote.Open(ctx, name)
}

// TestFailedDeletesAreRetried: compaction skips a delete that fails, the
// sync still succeeds, and the next compaction deletes the file.
func TestFailedDeletesAreRetried(t *testing.T) {
	mem := NewMemoryRemote()
	clk := newStepClock(mem)
	fr := &deleteFailingRemote{Remote: mem, failing: true}
	a := newDevice(t, "dev-a", fr).withRetention(time.Hour)
	a.put("n", `{"v":1}`)
	a.sync()
	clk.advance(3 * time.Hour)
	a.put("n", `{"v":2}`)
	a.sync()
	a.snapshot()
	clk.advance(time.Hour)
	r := a.sync()
	if r.Deleted != 0 || len(remoteFiles(t, mem, kindPatch)) != 2 {
		t.Fatalf("deleted %d with deletes failing; %v left", r.Deleted, remoteFiles(t, mem, kindPatch))
	}
	fr.mu.Lock()
	fr.failing = false
	fr.mu.Unlock()
	if r = a.snapshot(); r.Deleted != 1 {
		t.Fatalf("the next compaction deleted %d files, want the old patch file", r.Deleted)
	}
	// Deleting an already-deleted file is fine.
	if err := fr.Delete(context.Background(), "2026/01/01/patch_20260101T000000.000Z_x.json.gz"); err != nil {
		t.Fatal(err)
	}
}

// TestFileCompactedBetweenListAndDownload: a file listed but gone when
// downloaded makes the device load the newest snapshot, which holds it.
func TestFileCompactedBetweenListAndDownload(t *testing.T) {
	mem := NewMemoryRemote()
	fr := &deleteFailingRemote{Remote: mem, gone: map[string]bool{}}
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", fr)
	b.sync()
	a.put("n", `{"v":1}`)
	r := a.sync()
	fr.gone[r.Uploaded] = true // compacted the moment b lists it
	snap := a.snapshot().Snapshot
	rb := b.sync()
	if len(rb.Downloaded) != 1 || rb.Downloaded[0] != snap {
		t.Fatalf("b downloaded %v, want the snapshot %s", rb.Downloaded, snap)
	}
	if got := b.get("n"); got != `{"v":1}` {
		t.Fatalf("b has %q", got)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
}

// TestListingLagDuringCompaction: a device that cannot list the newest
// files for a while, while another compacts, converges once it can.
func TestListingLagDuringCompaction(t *testing.T) {
	mem := NewMemoryRemote()
	clk := newStepClock(mem)
	lag := &laggingRemote{Remote: mem, hidden: map[string][]string{}}
	a := newDevice(t, "dev-a", lag.as("a")).withRetention(time.Hour)
	b := newDevice(t, "dev-b", lag.as("b")).withRetention(time.Hour)
	a.put("n", `{"v":1}`)
	syncAll(t, a, b)
	lag.hide("b", "dev-a") // b stops seeing a's new files
	for i := range 3 {
		a.put("n", fmt.Sprintf(`{"v":%d}`, i+2))
		a.put(fmt.Sprint("a", i), `{"x":1}`)
		a.sync()
		b.put(fmt.Sprint("b", i), `{"x":1}`)
		b.sync()
		clk.advance(2 * time.Hour)
	}
	a.snapshot()
	clk.advance(time.Hour)
	if r := a.sync(); r.Deleted == 0 {
		t.Fatalf("nothing compacted: %+v", r)
	}
	lag.hide("b") // the listing catches up
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := b.get("n"); got != `{"v":4}` {
		t.Fatalf("b has n = %q, want a's last write", got)
	}
}

// TestOfflineAcrossTwoCompactions: a device offline while two snapshots
// compact the files it never saw rejoins with its pending edits; nothing
// is lost beyond last-writer-wins, and all converge.
func TestOfflineAcrossTwoCompactions(t *testing.T) {
	mem := NewMemoryRemote()
	clk := newStepClock(mem)
	a := newDevice(t, "dev-a", mem).withRetention(time.Hour)
	c := newDevice(t, "dev-c", mem).withRetention(time.Hour)
	a.put("shared", `{"title":"t0","body":"b0"}`)
	a.put("gone", `{"v":1}`)
	syncAll(t, a, c)
	// c goes offline and edits.
	c.put("shared", `{"title":"t0","body":"c's body"}`)
	c.put("c-only", `{"v":"c"}`)
	for round := range 2 {
		a.put("shared", fmt.Sprintf(`{"title":"a%d","body":"b0"}`, round))
		a.put(fmt.Sprint("a", round), `{"v":1}`)
		if round == 1 {
			a.exec(`DELETE FROM notes WHERE id = 'gone'`)
		}
		a.sync()
		clk.advance(48 * time.Hour)
		a.snapshot()
		clk.advance(time.Hour)
		if r := a.sync(); r.Deleted == 0 {
			t.Fatalf("round %d: nothing compacted", round)
		}
	}
	r := c.sync()
	if len(r.Downloaded) == 0 || !strings.Contains(r.Downloaded[0], "snapshot_") {
		t.Fatalf("c downloaded %v, want the newest snapshot first", r.Downloaded)
	}
	syncAll(t, a, c)
	assertConverged(t, a, c)
	if got := a.get("shared"); got != `{"body":"c's body","title":"a1"}` {
		t.Fatalf("shared = %s, want a's title and c's body", got)
	}
	if a.get("c-only") == "" || c.get("a0") == "" || c.get("gone") != "" {
		t.Fatal("a record was lost or a delete undone")
	}
}

// TestRemoteWiped: an emptied remote stops Sync with ErrRemoteChanged and
// leaves local data alone; StartFresh uploads it as a new store, and
// another device of the old store joins it.
func TestRemoteWiped(t *testing.T) {
	mem := NewMemoryRemote()
	clk := newStepClock(mem)
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	a.put("n1", `{"v":1}`)
	b.put("n2", `{"v":2}`)
	syncAll(t, a, b)
	clk.advance(time.Hour) // past the moments after the store's creation, when a missing marker may be lag
	syncAll(t, a, b)
	b.put("n2", `{"v":"b's edit"}`) // pending on b
	for _, f := range mustList(t, mem) {
		if err := mem.Delete(context.Background(), f); err != nil {
			t.Fatal(err)
		}
	}
	before := a.dump()
	_, err := a.eng.Sync(context.Background())
	if !errors.Is(err, ErrRemoteChanged) || !strings.Contains(err.Error(), "StartFresh") {
		t.Fatalf("got %v, want ErrRemoteChanged naming StartFresh", err)
	}
	if a.dump() != before {
		t.Fatal("a's data changed on a wiped remote")
	}
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, ErrRemoteChanged) {
		t.Fatalf("second sync: %v", err)
	}
	r, err := a.eng.StartFresh(context.Background())
	if err != nil || r.Snapshot == "" {
		t.Fatalf("StartFresh: %+v, %v", r, err)
	}
	if _, err := a.eng.StartFresh(context.Background()); err == nil {
		t.Fatal("a second StartFresh on a remote with a store succeeded")
	}
	_, err = b.eng.Sync(context.Background())
	if !errors.Is(err, ErrRemoteChanged) || !strings.Contains(err.Error(), "JoinRemote") {
		t.Fatalf("b: got %v, want ErrRemoteChanged naming JoinRemote", err)
	}
	if err := b.eng.JoinRemote(context.Background()); err != nil {
		t.Fatal(err)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := a.get("n2"); got != `{"v":"b's edit"}` {
		t.Fatalf("a has n2 = %q, want b's pending edit", got)
	}
	// A third device starts from the new store.
	c := newDevice(t, "dev-c", mem)
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
}

func mustList(t testing.TB, r Remote) []string {
	t.Helper()
	files, err := r.List(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	return names
}

// TestRemoteSwapped: pointed at another store (another account), Sync
// fails with ErrRemoteChanged; JoinRemote merges both stores' records.
func TestRemoteSwapped(t *testing.T) {
	home, other := NewMemoryRemote(), NewMemoryRemote()
	other.SetClock(func() time.Time { return time.Now().Add(time.Hour) }) // a store set up an hour apart
	a := newDevice(t, "dev-a", home)
	a.put("mine", `{"v":"a"}`)
	a.put("both", `{"title":"a","x":1}`)
	a.sync()
	x := newDevice(t, "dev-x", other)
	x.put("theirs", `{"v":"x"}`)
	x.put("both", `{"title":"x","y":2}`)
	x.sync()

	a.cfg.Remote = other
	a.open()
	before := a.dump()
	_, err := a.eng.Sync(context.Background())
	if !errors.Is(err, ErrRemoteChanged) || !strings.Contains(err.Error(), "another account") {
		t.Fatalf("got %v, want ErrRemoteChanged", err)
	}
	if a.dump() != before {
		t.Fatal("a's data changed")
	}
	if _, err := a.eng.StartFresh(context.Background()); err == nil {
		t.Fatal("StartFresh over another store succeeded")
	}
	if err := a.eng.JoinRemote(context.Background()); err != nil {
		t.Fatal(err)
	}
	syncAll(t, a, x)
	assertConverged(t, a, x)
	if x.get("mine") == "" || a.get("theirs") == "" {
		t.Fatal("the join lost a store's records")
	}
	if got := a.get("both"); got != `{"title":"x","x":1,"y":2}` {
		t.Fatalf("both = %s, want a per-field merge with x's later title", got)
	}
}

// TestNewerFormat: a snapshot or merge file of a newer format is reported
// ("upgrade the app") and not applied; a newer marker stops the sync.
func TestNewerFormat(t *testing.T) {
	mem := NewMemoryRemote()
	a := newDevice(t, "dev-a", mem)
	a.put("n", `{"v":1}`)
	a.sync()
	a.snapshot()
	future := func(kind fileKind) string {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		fmt.Fprintf(gz, `{"format":%d,"device":"dev-z","store":"whatever","covers":"2026-01-01T00:00:00Z","records":[]}`, stateFormat+1)
		gz.Close()
		name := remoteFileName(kind, time.Now().Add(time.Second), "dev-z")
		if err := mem.Create(context.Background(), name, &buf); err != nil {
			t.Fatal(err)
		}
		return name
	}
	merge := future(kindMerge)
	c := newDevice(t, "dev-c", mem)
	future(kindSnapshot) // newest: c falls back to a's
	r := c.sync()
	var rejected []string
	for _, f := range r.Rejected {
		if !errors.Is(f.Err, ErrUnsupportedFormat) || !strings.Contains(f.Err.Error(), "upgrade the app") {
			t.Fatalf("%s rejected with %v, want ErrUnsupportedFormat", f.Name, f.Err)
		}
		rejected = append(rejected, f.Name)
	}
	if len(rejected) != 2 || !strings.Contains(strings.Join(rejected, " "), merge) {
		t.Fatalf("rejected %v, want the newer snapshot and merge file", rejected)
	}
	if got := c.get("n"); got != `{"v":1}` {
		t.Fatalf("c has %q, want a's record from the older snapshot", got)
	}

	m2 := NewMemoryRemote()
	if err := m2.Create(context.Background(), markerName, strings.NewReader(`{"format":99,"store":"s"}`)); err != nil {
		t.Fatal(err)
	}
	d := newDevice(t, "dev-d", m2)
	if _, err := d.eng.Sync(context.Background()); !errors.Is(err, ErrUnsupportedFormat) {
		t.Fatalf("newer marker: %v, want ErrUnsupportedFormat", err)
	}
}

// TestNewerPatchHeldBySnapshot: a patch file of a newer format, which a
// newer app applied and put in its snapshot, reaches an older device
// through that snapshot, and is no longer reported.
func TestNewerPatchHeldBySnapshot(t *testing.T) {
	mem := NewMemoryRemote()
	a, d := newDevice(t, "dev-a", mem), newDevice(t, "dev-d", mem)
	syncAll(t, a, d)
	a.put("n", `{"v":2}`)
	newer := a.sync().Uploaded
	snap := a.snapshot().Snapshot // holds newer
	// As if a newer app had written it: same name, a format d cannot read.
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	fmt.Fprintf(gz, `{"format":%d,"device":"dev-a","changes":[]}`, patchFormat+1)
	gz.Close()
	if err := mem.Delete(context.Background(), newer); err != nil {
		t.Fatal(err)
	}
	if err := mem.Create(context.Background(), newer, &buf); err != nil {
		t.Fatal(err)
	}
	r := d.sync()
	if len(r.Rejected) != 0 || !slices.Contains(r.Downloaded, snap) {
		t.Fatalf("d rejected %v and downloaded %v, want %s from the snapshot", r.Rejected, r.Downloaded, snap)
	}
	if got := d.get("n"); got != `{"v":2}` {
		t.Fatalf("d has %q", got)
	}
	if r := d.sync(); len(r.Downloaded) != 0 || len(r.Rejected) != 0 {
		t.Fatalf("next sync: %+v", r)
	}
	assertConverged(t, a, d)
}

// TestHostileSnapshot: a snapshot whose clocks the merge rules could not
// have produced is rejected whole.
func TestHostileSnapshot(t *testing.T) {
	mem := NewMemoryRemote()
	a := newDevice(t, "dev-a", mem)
	a.put("n", `{"v":1}`)
	a.sync()
	store := a.eng.mustStore(t)
	for _, rec := range []string{
		`{"table_name":"notes","record_id":"x","state":{"v":1},"clock":{"d":["d"],"n":[1,0,{"v":[2,0]}]},"is_deleted":false}`,     // child newer than parent
		`{"table_name":"notes","record_id":"x","state":{"v":1},"clock":{"d":["d"],"n":[0,0,{}]},"is_deleted":false}`,              // version 0
		`{"table_name":"notes","record_id":"x","state":{"v":1},"clock":{"d":["a/b"],"n":[1,0,{}]},"is_deleted":false}`,            // bad device
		`{"table_name":"sqlite_master","record_id":"x","state":{},"clock":{"d":["d"],"n":[1,0,{}]},"is_deleted":false}`,           // bad table
		`{"table_name":"notes","record_id":"x","state":{"v":1},"clock":{"d":["d"],"n":[5,0,{"v":[3,0]},4,0]},"is_deleted":false}`, // member below the floor
	} {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		fmt.Fprintf(gz, `{"format":1,"device":"dev-z","store":%q,"covers":"2026-01-01T00:00:00Z","records":[%s]}`, store, rec)
		gz.Close()
		name := remoteFileName(kindMerge, time.Now(), "dev-z")
		if err := mem.Create(context.Background(), name, &buf); err != nil {
			t.Fatal(err)
		}
		r := a.sync()
		if len(r.Rejected) != 1 || !errors.Is(r.Rejected[0].Err, ErrCorruptFile) || a.get("x") != "" {
			t.Fatalf("%s: %+v, want it rejected as corrupt", rec, r)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (e *Engine) mustStore(t testing.TB) string {
	t.Helper()
	s, err := getMeta(context.Background(), e.db, metaStore)
	if err != nil || s == "" {
		t.Fatalf("store id %q: %v", s, err)
	}
	return s
}

// TestMonthlySnapshot: the first sync of a month writes a snapshot, not
// the store's first month, and only one device of those that sync after.
func TestMonthlySnapshot(t *testing.T) {
	mem := NewMemoryRemote()
	clk := newStepClock(mem)
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	a.put("n", `{"v":1}`)
	for range 3 {
		syncAll(t, a, b)
	}
	if got := remoteFiles(t, mem, kindSnapshot); len(got) != 0 {
		t.Fatalf("snapshots in the store's first month: %v", got)
	}
	clk.advance(31 * 24 * time.Hour)
	if r := a.sync(); r.Snapshot == "" {
		t.Fatal("the month's first sync wrote no snapshot")
	}
	if r := b.sync(); r.Snapshot != "" {
		t.Fatal("a second device wrote a snapshot in the same month")
	}
	if got := remoteFiles(t, mem, kindSnapshot); len(got) != 1 {
		t.Fatalf("snapshots: %v", got)
	}
}

// The applied-files ledger stays bounded by what the remote holds, also on
// a device that never writes a snapshot: once a month it forgets the
// files compaction deleted.
func TestLedgerPrunedMonthly(t *testing.T) {
	mem, clk := clockedRemote()
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	withRetention(a, time.Minute)
	withRetention(b, time.Minute)
	for i := range 5 {
		a.put(fmt.Sprint("r", i), `{"v":1}`)
		a.sync()
		b.sync()
		clk.add(time.Minute)
	}
	clk.add(40 * time.Minute)
	a.snapshot()
	b.sync()
	clk.add(40 * time.Minute)
	if r := a.snapshot(); r.Deleted == 0 {
		t.Fatalf("a compacted nothing: %+v", r)
	}
	ledger := func() (n int) {
		b.db.QueryRow(`SELECT count(*) FROM sync_files`).Scan(&n)
		return n
	}
	before := ledger()
	clk.add(30 * 24 * time.Hour) // into April
	if r := a.sync(); r.Snapshot == "" {
		t.Fatal("a wrote no monthly snapshot")
	}
	if r := b.sync(); r.Snapshot != "" {
		t.Fatal("b wrote a snapshot too: the test needs a device that does not")
	}
	present := map[string]bool{}
	for _, n := range append(remoteFiles(t, mem, kindPatch), remoteFiles(t, mem, kindSnapshot)...) {
		present[n] = true
	}
	rows, err := b.db.Query(`SELECT name FROM sync_files`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		rows.Scan(&name)
		if !present[name] {
			t.Errorf("b still remembers %s, which the remote no longer has (ledger %d rows, was %d)", name, ledger(), before)
		}
	}
}
