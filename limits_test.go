package drivesync

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/merge"

	"github.com/drivesync/drivesync/internal/jsonv"
	"pgregory.net/rapid"
)

// A store's limits come from its marker, whatever each device's Config
// says: a file is readable on every device or on none.
func TestLimitsAreTheStores(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	a.cfg.Limits = Limits{MaxRecordSize: 2048}
	a.open()
	a.put("n1", `{"v":1}`)
	a.sync() // creates the store with a's limits

	b := newDevice(t, "dev-b", remote) // default Config.Limits: 4 MiB records
	b.sync()
	big := strings.Repeat("x", 3000)
	writeRaw(t, remote, "2026/01/01/patch_20260101T000000.000Z_dev-x.json.gz", true,
		fmt.Sprintf(`{"format":1,"device":"dev-x","changes":[{"table_name":"notes","record_id":"big","patch":{"t":%q},"is_deleted":false,"sync_version":9}]}`, big))
	for _, d := range []*device{a, b} {
		r := d.sync()
		if len(r.Rejected) != 1 || !errors.Is(r.Rejected[0].Err, ErrFileTooLarge) {
			t.Errorf("%s: rejected %v, want the 3000-byte change over the store's 2048-byte limit", d.name, r.Rejected)
		}
	}
	// b's own record over the store's limit is not sent, whatever b's
	// Config says.
	b.put("mine", fmt.Sprintf(`{"t":%q}`, big))
	r := b.sync()
	if len(r.Skipped) != 1 || r.Skipped[0].Record != "mine" || r.ChangesSent != 0 {
		t.Fatalf("b sent a record over the store's limit: skipped %v, sent %d", r.Skipped, r.ChangesSent)
	}
	if b.pendingCount() != 1 {
		t.Fatal("the skipped record is no longer pending")
	}
}

// A marker whose limits are absurd is refused, not obeyed.
func TestMarkerLimitsBounded(t *testing.T) {
	for _, body := range []string{
		`{"format":1,"store":"s1","created":"2026-01-01T00:00:00Z","limits":{"max_file_size":1099511627776000,"max_expanded_size":1048576,"max_record_size":4096,"max_snapshot_size":1048576,"max_held_files":2048}}`,
		`{"format":1,"store":"s1","created":"2026-01-01T00:00:00Z","limits":{"max_file_size":0,"max_expanded_size":1048576,"max_record_size":4096,"max_snapshot_size":1048576,"max_held_files":2048}}`,
	} {
		remote := NewMemoryRemote()
		writeRaw(t, remote, markerName, false, body)
		a := newDevice(t, "dev-a", remote)
		_, err := a.eng.Sync(context.Background())
		if !errors.Is(err, ErrCorruptFile) || !strings.Contains(err.Error(), "max_") && !strings.Contains(err.Error(), "Max") {
			t.Errorf("marker %s: got %v, want ErrCorruptFile naming the limit", body, err)
		}
	}
	remote := NewMemoryRemote()
	d := &device{t: t, name: "dev-a", remote: remote}
	d.cfg = Config{Remote: remote, Tables: []Table{{Name: "notes"}}, Limits: Limits{MaxRecordSize: 10}}
	db := newDevice(t, "dev-z", remote).db
	if _, err := Open(context.Background(), db, d.cfg); err == nil || !strings.Contains(err.Error(), "MaxRecordSize") {
		t.Errorf("Open with a 10-byte record limit: got %v, want an error naming MaxRecordSize", err)
	}
}

// A record whose clock outgrew the store's record limit (tombstones of
// many removed keys) goes into the snapshot in parts: the snapshot is
// readable, compaction acts on it, and a new device that bootstraps from
// it alone holds the record's exact state. (Before, such a record made
// every snapshot unreadable.)
func TestTombstonesOverLimitInSnapshot(t *testing.T) {
	mem, clk := clockedRemote()
	a := newDevice(t, "dev-a", mem)
	a.cfg.Limits = Limits{MaxRecordSize: 2048}
	a.cfg.Retention = time.Minute
	a.open()
	a.put("r", `{"keep":1}`)
	a.put("other", `{"v":1}`)
	a.sync()
	for round := range 4 {
		var keys []string
		for i := range 30 {
			keys = append(keys, fmt.Sprintf(`"%s-%02d-%02d":1`, strings.Repeat("k", 32), round, i))
		}
		a.put("r", `{"keep":1,`+strings.Join(keys, ",")+`}`)
		a.sync()
		clk.add(time.Second)
		a.put("r", `{"keep":1}`) // removes them: each leaves a tombstone in the clock
		a.sync()
		clk.add(time.Second)
	}
	var clock string
	a.db.QueryRow(`SELECT clock FROM sync_states WHERE record_id = 'r'`).Scan(&clock)
	if len(clock) <= 2*2048 {
		t.Fatalf("the clock has %d bytes: the test needs one over the limit", len(clock))
	}
	clk.add(40 * time.Minute)
	if r, err := a.eng.Snapshot(context.Background()); err != nil || r.Snapshot == "" {
		t.Fatalf("Snapshot: wrote %q, err %v", r.Snapshot, err)
	}
	clk.add(40 * time.Minute)
	if r, err := a.eng.Snapshot(context.Background()); err != nil || r.Deleted == 0 {
		t.Fatalf("compaction: %+v, %v", r, err)
	}
	c := newDevice(t, "dev-c", mem)
	if r := c.sync(); len(r.Rejected) != 0 || len(r.Downloaded) != 1 {
		t.Fatalf("c downloaded %v, rejected %v; want the newest snapshot alone", r.Downloaded, r.Rejected)
	}
	assertConverged(t, a, c)
}

// A snapshot over the store's MaxSnapshotSize would be rejected by every
// device. The writer reads its snapshot back under the store's limits and
// does not upload it, so nothing is compacted on its authority and a new
// device still receives everything from the patch files.
func TestUnreadableSnapshotNotUploaded(t *testing.T) {
	mem, clk := clockedRemote()
	a := newDevice(t, "dev-a", mem)
	a.cfg.Limits = Limits{MaxSnapshotSize: 1024}
	a.cfg.Retention = time.Minute
	a.open()
	rnd := rand.New(rand.NewPCG(3, 4))
	for i := range 40 {
		a.put(fmt.Sprintf("r%02d", i), fmt.Sprintf(`{"v":"%x"}`, rnd.Uint64()))
	}
	a.sync()
	clk.add(40 * time.Minute)
	r, err := a.eng.Snapshot(context.Background())
	if !errors.Is(err, ErrFileTooLarge) || r.Snapshot != "" {
		t.Fatalf("Snapshot: wrote %q, err %v; want no snapshot and ErrFileTooLarge", r.Snapshot, err)
	}
	clk.add(40 * time.Minute)
	a.eng.Snapshot(context.Background())
	a.sync()
	if snaps := remoteFiles(t, mem, kindSnapshot); len(snaps) != 0 {
		t.Fatalf("snapshots on the remote: %v", snaps)
	}
	c := newDevice(t, "dev-c", mem)
	if r := c.sync(); len(r.Rejected) != 0 {
		t.Fatalf("c rejected %v", r.Rejected)
	}
	assertConverged(t, a, c)
}

// A busy store holds more files than a record may have bytes: the list of
// held files in a snapshot's header has its own bound, so the snapshot
// stays readable. A writer with more files than the bound lists the
// oldest; a new device downloads the others as well.
func TestSnapshotHeaderOfBusyStore(t *testing.T) {
	mem, clk := clockedRemote()
	a := newDevice(t, "dev-a", mem)
	a.cfg.Limits = Limits{MaxRecordSize: 1024, MaxHeldFiles: 1024}
	a.open()
	a.sync() // creates the store
	const files = 1100
	const longDev = "6f1c2a9e-4b7d-4c1e-9a53-0d8e2f7b6c41" // a UUID, as devices name themselves
	for i := range files {
		at := clk.now().Add(time.Duration(i) * time.Millisecond)
		writeRaw(t, mem, patchFileName(at, longDev), true, fmt.Sprintf(
			`{"format":1,"device":"`+longDev+`","changes":[{"table_name":"notes","record_id":"r%04d","patch":{"i":%d},"is_deleted":false,"sync_version":%d}]}`, i, i, i+1))
	}
	if r := a.sync(); len(r.Downloaded) != files {
		t.Fatalf("a applied %d files, want %d", len(r.Downloaded), files)
	}
	r, err := a.eng.Snapshot(context.Background())
	if err != nil || r.Snapshot == "" {
		t.Fatalf("Snapshot: %q, %v", r.Snapshot, err)
	}
	c := newDevice(t, "dev-c", mem)
	r = c.sync()
	if len(r.Rejected) != 0 || len(r.Downloaded) == 0 || !strings.Contains(r.Downloaded[0], "/snapshot_") {
		t.Fatalf("c: rejected %v, downloaded %d files starting %v; want the snapshot loaded", r.Rejected, len(r.Downloaded), r.Downloaded[:min(1, len(r.Downloaded))])
	}
	if got, want := len(r.Downloaded), 1+files-1024; got != want {
		t.Errorf("c downloaded %d files, want the snapshot and the %d files its header could not list", got, files-1024)
	}
	assertConverged(t, a, c)
}

// A record that grew past the record limit by merging additions from
// two devices still takes small edits: the limit bounds what is sent.
func TestMergedRecordOverLimitTakesEdits(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.cfg.Limits = Limits{MaxRecordSize: 2048}
	a.open()
	a.put("r", `{"v":0}`)
	syncAll(t, a, b)
	fill := func(prefix string) string {
		var kv []string
		for i := range 40 {
			kv = append(kv, fmt.Sprintf(`"%s%02d":"%s"`, prefix, i, strings.Repeat("v", 20)))
		}
		return strings.Join(kv, ",")
	}
	a.put("r", `{"v":0,`+fill("a")+`}`)
	b.put("r", `{"v":0,`+fill("b")+`}`)
	a.sync()
	b.sync()
	a.sync()
	if n := len(a.get("r")); n <= 2048 {
		t.Fatalf("merged record has %d bytes; the test needs it over the limit", n)
	}
	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.v', 1) WHERE id = 'r'`)
	if r := a.sync(); r.ChangesSent != 1 || len(r.Skipped) != 0 {
		t.Fatalf("an edit of the grown record was not sent: %+v", r)
	}
	b.sync()
	assertConverged(t, a, b)
}

// A record whose change is over MaxRecordSize is skipped and stays
// pending; its row is laid over what the sync brings. Before, the whole
// row was laid over the synced state with no base, so a key the app had
// removed from the row came back from the synced state, and the app's
// removal was lost. Now the skipped record's edits are taken from what its
// row showed before them.
func TestSkippedRecordKeepsRemovedKey(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	a.cfg.Limits = Limits{MaxRecordSize: 2048}
	a.open()
	b := newDevice(t, "dev-b", remote)
	a.put("r", `{"keep":1,"secret":"remove me"}`)
	syncAll(t, a, b)

	// The app removes "secret" and adds a field too large to sync.
	big := strings.Repeat("x", 4096)
	a.put("r", `{"keep":1,"note":"`+big+`"}`)
	b.put("other", `{"v":1}`) // something for a to receive, so its sync commits
	b.sync()
	r := a.sync()
	if len(r.Skipped) != 1 {
		t.Fatalf("setup: want r skipped, got %v", r.Skipped)
	}
	if got := a.get("r"); strings.Contains(got, "secret") {
		t.Errorf("a's row got the removed key back: %.80s...", got)
	}
	// The app shortens the note; the removal of "secret" is never sent.
	a.put("r", strings.Replace(a.get("r"), big, "short", 1))
	syncAll(t, a, b)
	if got := b.get("r"); strings.Contains(got, "secret") {
		t.Errorf("b: r = %s, the app removed \"secret\"", got)
	}
}

// A change larger than the store's record limit, made of members each
// within it, goes out as several writes of those members: the record is
// not left pending for ever (before, it was skipped until the app made the
// change smaller), and every device ends with exactly the whole change.
func TestLargeChangeSentInParts(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	a.cfg.Limits = Limits{MaxRecordSize: 1024}
	a.open()
	b := newDevice(t, "dev-b", remote)
	var keys, tags []string
	for i := range 40 {
		keys = append(keys, fmt.Sprintf(`"key_%02d_with_a_long_name":"value %d"`, i, i))
		tags = append(tags, fmt.Sprintf(`"tag-%02d-0123456789abcdef":{"name":"tag %d"}`, i, i))
	}
	a.put("r", `{"title":"t",`+strings.Join(keys, ",")+`,"tags":{`+strings.Join(tags, ",")+`}}`)
	r := a.sync()
	if len(r.Skipped) != 0 || r.ChangesSent < 3 {
		t.Fatalf("sent %d changes, skipped %v: want the record in several writes", r.ChangesSent, r.Skipped)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	// Remove every key: the removal is over the limit too.
	a.put("r", `{"title":"t2"}`)
	if r := a.sync(); len(r.Skipped) != 0 {
		t.Fatalf("skipped %v", r.Skipped)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := b.get("r"); got != `{"title":"t2"}` {
		t.Fatalf("b: r = %s", got)
	}
}

// splitPatch's parts, applied in order, write exactly what the whole patch
// writes, and each fits the limit.
func TestSplitPatchEqualsWhole(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base := mustObject(t, genObject(t, 0, "base"), true)
		patch := mustObject(t, genObject(t, 0, "patch"), true)
		limit := int64(rapid.IntRange(12, 80).Draw(t, "limit"))
		parts, err := splitPatch(patch, limit)
		if err != nil {
			t.Skip("a value over the limit")
		}
		whole := merge.NewRecordState(base, merge.Stamp{Version: 1, Device: "d"})
		whole.ApplyPatch(patch, merge.Stamp{Version: 2, Device: "d"})
		split := merge.NewRecordState(base, merge.Stamp{Version: 1, Device: "d"})
		for i, p := range parts {
			if n := int64(len(jsonv.Encode(p))); n > limit {
				t.Fatalf("part %s has %d bytes, over %d", jsonv.Encode(p), n, limit)
			}
			split.ApplyPatch(p, merge.Stamp{Version: int64(2 + i), Device: "d"})
		}
		if got, want := string(jsonv.Encode(split.Value())), string(jsonv.Encode(whole.Value())); got != want {
			t.Fatalf("parts %v give %s, the whole patch %s", parts, got, want)
		}
	})
}

// The uploader keeps its file within the store's size limits: a file
// over them would be rejected by every reader, and its changes never
// arrive while the writer counts them sent. (Before, a change split to
// fit the record limit could make the file pass MaxExpandedSize.) Here
// the change's parts, one write, cannot fit in any file: it is reported,
// stays pending, and goes out once the app makes it smaller.
func TestUploadWithinExpandedLimit(t *testing.T) {
	remote := NewMemoryRemote()
	a := storeDevice(t, "dev-a", remote, Limits{MaxRecordSize: 1024, MaxExpandedSize: 2048})
	b := newDevice(t, "dev-b", remote)
	b.sync()
	var m []string
	for i := range 4 {
		m = append(m, fmt.Sprintf(`"f%d":%q`, i, strings.Repeat(string(rune('a'+i)), 600)))
	}
	a.put("r", "{"+strings.Join(m, ",")+"}")
	ra := a.sync()
	if len(ra.Skipped) != 1 || !strings.Contains(ra.Skipped[0].Err.Error(), "MaxExpandedSize") || a.pendingCount() != 1 {
		t.Fatalf("a skipped %v with %d pending; want r reported over MaxExpandedSize, still pending", ra.Skipped, a.pendingCount())
	}
	if rb := b.sync(); len(rb.Rejected) != 0 || b.get("r") != "" {
		t.Fatalf("b rejected %v and shows r = %q", rb.Rejected, b.get("r"))
	}
	a.put("r", fmt.Sprintf(`{"f0":%q}`, strings.Repeat("a", 600)))
	syncAll(t, a, b)
	if b.get("r") != a.get("r") || a.pendingCount() != 0 {
		t.Fatalf("a shows r = %.20s…, b %.20s…; %d pending on a", a.get("r"), b.get("r"), a.pendingCount())
	}
}

// Changes that do not fit in one patch file go out in several, in one
// Sync, as one plan and one commit: every file within the store's limits, compressed (random text
// hardly compresses) and uncompressed, and every change arrives. A
// change too large for any file is reported and stays pending.
func TestUploadInSeveralFiles(t *testing.T) {
	const maxFile, maxExpanded = 6 << 10, 12 << 10
	remote := NewMemoryRemote()
	a := storeDevice(t, "dev-a", remote, Limits{MaxRecordSize: 8 << 10, MaxFileSize: maxFile, MaxExpandedSize: maxExpanded})
	b := newDevice(t, "dev-b", remote)
	b.sync()
	rnd := rand.New(rand.NewPCG(1, 2))
	text := func(n int) string {
		const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
		b := make([]byte, n)
		for i := range b {
			b[i] = letters[rnd.IntN(len(letters))]
		}
		return string(b)
	}
	for i := range 40 {
		a.put(fmt.Sprintf("r%02d", i), fmt.Sprintf(`{"t":%q}`, text(200+rnd.IntN(1500))))
	}
	a.put("huge", fmt.Sprintf(`{"p":%q,"q":%q}`, text(7000), text(7000))) // 2 parts, over any file
	r := a.sync()
	if r.ChangesSent != 40 || len(r.Skipped) != 1 || r.Skipped[0].Record != "huge" {
		t.Fatalf("sent %d changes (want 40), skipped %v (want huge)", r.ChangesSent, r.Skipped)
	}
	if !strings.Contains(r.Skipped[0].Err.Error(), "MaxExpandedSize") {
		t.Errorf("the skip says %q; it should name the store limit", r.Skipped[0].Err)
	}
	if a.pendingCount() != 1 {
		t.Errorf("%d records pending, want 1 (huge)", a.pendingCount())
	}
	files, _ := remote.List(context.Background(), time.Time{})
	patches := 0
	for _, f := range files {
		if !strings.Contains(f.Name, "patch_") {
			continue
		}
		patches++
		if f.Size > maxFile {
			t.Errorf("%s: %d bytes, over MaxFileSize", f.Name, f.Size)
		}
	}
	if patches < 3 {
		t.Errorf("%d patch files for ~38 KiB of changes under a 12 KiB limit", patches)
	}
	rb := b.sync()
	if len(rb.Rejected) != 0 {
		t.Fatalf("b rejected %v", rb.Rejected)
	}
	for i := range 40 {
		id := fmt.Sprintf("r%02d", i)
		if b.get(id) != a.get(id) {
			t.Fatalf("%s did not arrive", id)
		}
	}
}

// A record whose state outgrew the record limit (its change went out in
// parts) goes into snapshots in parts, which every device reads and
// merges back into the whole, shown or deleted (before, every snapshot
// holding it was refused, for good). A new device bootstraps from the
// snapshot alone.
func TestRecordOverLimitInSnapshot(t *testing.T) {
	remote, clk := clockedRemote()
	a := storeDevice(t, "dev-a", remote, Limits{MaxRecordSize: 1024})
	b := newDevice(t, "dev-b", remote)
	b.sync()
	a.put("r", fmt.Sprintf(`{"p":%q,"q":%q}`, strings.Repeat("p", 600), strings.Repeat("q", 600)))
	a.sync()
	b.sync()
	b.exec(`DELETE FROM notes WHERE id = 'r'`)
	syncAll(t, a, b)
	for _, d := range []*device{a, b} {
		if _, err := d.eng.Snapshot(context.Background()); err != nil {
			t.Errorf("%s: Snapshot after r was deleted: %v", d.name, err)
		}
	}
	// Shown again (an edit that did not see the delete brings the
	// record back whole), then compacted: the snapshot alone holds it.
	a.exec(`INSERT INTO notes (id, content) VALUES ('r', '{"p":"short"}')`)
	a.sync()
	var states [2]string
	a.db.QueryRow(`SELECT record_data || clock FROM sync_states WHERE record_id = 'r'`).Scan(&states[0])
	if _, err := a.eng.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.add(2 * time.Hour)
	if r, err := a.eng.Snapshot(context.Background()); err != nil || r.Deleted == 0 {
		t.Fatalf("compaction: %+v, %v", r, err)
	}
	c := newDevice(t, "dev-c", remote)
	r := c.sync()
	if len(r.Rejected) != 0 || len(r.Downloaded) != 1 || !strings.Contains(r.Downloaded[0], "snapshot_") {
		t.Fatalf("c downloaded %v, rejected %v; want the snapshot alone", r.Downloaded, r.Rejected)
	}
	c.db.QueryRow(`SELECT record_data || clock FROM sync_states WHERE record_id = 'r'`).Scan(&states[1])
	if states[0] != states[1] || c.get("r") != a.get("r") {
		t.Fatalf("c holds r as %.80s…, a as %.80s…", states[1], states[0])
	}
}

// A file rejected under some limits is read again once the limits that
// decide readability change: every one of them is in the rejection's key
// (MaxSnapshotSize was missing from it).
func TestLimitsKeyNamesEveryLimit(t *testing.T) {
	base := Limits{}.withDefaults()
	v := reflect.ValueOf(&base).Elem()
	for i := range v.NumField() {
		changed := base
		f := reflect.ValueOf(&changed).Elem().Field(i)
		f.SetInt(f.Int() + 1)
		if changed.key() == base.key() {
			t.Errorf("Limits.%s is not in the key that decides a re-read", v.Type().Field(i).Name)
		}
	}
}
