package drivesync

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/drivefake"
)

func TestHeldSet(t *testing.T) {
	h := heldSet{}
	for _, r := range []seqRun{{5, 5}, {1, 2}, {9, 12}, {3, 3}, {11, 14}, {7, 7}} {
		h.add("a", r.first, r.last)
	}
	h.add("b", 4, 4)
	h.add("b", 0, 3) // no number 0
	if got, want := h["a"], []seqRun{{1, 3}, {5, 5}, {7, 7}, {9, 14}}; !slices.Equal(got, want) {
		t.Errorf("runs of a: got %v, want %v", got, want)
	}
	// A device's numbers may start past 1: only those between two held
	// are gaps.
	if got, want := h.gaps(), []FileSpan{{"a", 4, 4}, {"a", 6, 6}, {"a", 8, 8}}; !slices.Equal(got, want) {
		t.Errorf("gaps: got %v, want %v", got, want)
	}
	for _, c := range []struct {
		device string
		n      int64
		want   bool
	}{{"a", 1, true}, {"a", 4, false}, {"a", 14, true}, {"a", 15, false}, {"b", 4, true}, {"c", 1, false}} {
		if got := h.has(c.device, c.n); got != c.want {
			t.Errorf("has(%s, %d) = %v, want %v", c.device, c.n, got, c.want)
		}
	}
	o := heldSet{}
	o.add("a", 2, 10)
	o.add("c", 1, 1)
	if got, want := h.minus(o).spans(), []FileSpan{{"a", 1, 1}, {"a", 11, 14}, {"b", 4, 4}}; !slices.Equal(got, want) {
		t.Errorf("minus: got %v, want %v", got, want)
	}
	text := string(h.appendJSON(nil))
	if want := `{"a":[[1,3],[5,5],[7,7],[9,14]],"b":[[4,4]]}`; text != want {
		t.Errorf("JSON: got %s, want %s", text, want)
	}
	back, err := parseHeld([]byte(text), 100)
	if err != nil || !slices.Equal(back.spans(), h.spans()) {
		t.Errorf("parseHeld(%s) = %v, %v; want %v", text, back.spans(), err, h.spans())
	}
}

// A snapshot header's holds come from other devices: what no engine
// writes is refused, with what was wrong, and the number of runs and the
// numbers are bounded (a device numbers its files on past what it holds,
// see plan, and must never pass int64).
func TestParseHeldRefuses(t *testing.T) {
	for _, c := range []struct{ in, why string }{
		{`[]`, "object"},
		{`{"a":[[0,1]]}`, "first to last"},
		{`{"a":[[3,2]]}`, "first to last"},
		{`{"a":[[1]]}`, "[first,last]"},
		{`{"a":[[1,"2"]]}`, "first to last"},
		{`{"a":[[1,2.5]]}`, "first to last"},
		{`{"a b":[[1,2]]}`, "device id"},
		{`{"a":[[1,1],[3,3],[5,5]]}`, "more than 2 runs"},
		{`{"a":[[1,4611686018427387905]]}`, "first to last"}, // past maxFileSeq
	} {
		if _, err := parseHeld([]byte(c.in), 2); err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("parseHeld(%s): got %v, want an error saying %q", c.in, err, c.why)
		}
	}
}

// A device that finds a long run of numbers gone checks by name only the
// files it knows and takes the rest as one run: a snapshot's header may
// claim any run (1 to 2^62 here), and a sync that took the numbers one by
// one would never end.
func TestVanishedLongRunEndsTheSync(t *testing.T) {
	folder, err := NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := newDevice(t, "dev-a", folder)
	a.put("r1", `{"v":1}`)
	a.sync()
	// What loading a snapshot that claims the run leaves, once no
	// snapshot on the remote holds it any more.
	a.exec(`INSERT INTO sync_held (device, first, last) VALUES ('dev-ghost', 1, 1 << 62)`)
	done := make(chan Report, 1)
	go func() {
		r, err := a.eng.Sync(context.Background())
		if err != nil {
			t.Errorf("Sync: %v", err)
		}
		done <- r
	}()
	select {
	case r := <-done:
		want := []FileSpan{{"dev-ghost", 1, 1 << 62}}
		if !slices.Equal(r.Vanished, want) || r.Snapshot == "" {
			t.Errorf("Vanished %v, Snapshot %q; want %v and a snapshot", r.Vanished, r.Snapshot, want)
		}
	case <-time.After(time.Minute):
		t.Fatal("the sync did not end within a minute")
	}
	if r := a.sync(); len(r.Vanished) != 0 || r.Snapshot != "" {
		t.Errorf("after the snapshot: Vanished %v, Snapshot %q; want none", r.Vanished, r.Snapshot)
	}
}

// fileNumbers returns the names of the patch and merge files on remote,
// by the number each carries.
func fileNumbers(t *testing.T, remote Remote) map[fileNumber][]string {
	t.Helper()
	ctx := context.Background()
	files, err := remote.List(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[fileNumber][]string{}
	for _, f := range files {
		kind, _, device, ok := parseFileName(f.Name)
		if !ok || kind == kindSnapshot {
			continue
		}
		rc, err := remote.Open(ctx, f.Name)
		if err != nil {
			t.Fatal(err)
		}
		var seq int64
		if kind == kindPatch {
			seq, err = decodePatchFile(rc, device, math.MaxInt64, math.MaxInt64, func(fileChange) error { return nil })
		} else {
			var h stateHeader
			h, err = decodeStateFile(rc, device, Limits{}.withDefaults(), func(fileChange) error { return nil })
			seq = h.seq
		}
		rc.Close()
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		if seq > 0 {
			out[fileNumber{device, seq}] = append(out[fileNumber{device, seq}], f.Name)
		}
	}
	return out
}

// An app that gives a database a device id it used before numbers that
// id's files on from those it published: a number under the id must name
// one file.
func TestNumbersUnderAnIdGivenBackFollowItsFiles(t *testing.T) {
	folder, err := NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := newDevice(t, "dev-x", folder)
	a.put("r1", `{"v":1}`)
	a.sync()
	a.put("r2", `{"v":2}`)
	a.sync()
	a.cfg.DeviceID = "dev-y"
	a.open()
	a.put("r3", `{"v":3}`)
	a.sync()
	a.cfg.DeviceID = "dev-x"
	a.open()
	a.put("r4", `{"v":4}`)
	a.sync()
	numbers := fileNumbers(t, folder)
	for n, names := range numbers {
		if len(names) > 1 {
			t.Errorf("number %d of %s names %d files: %v", n.seq, n.device, len(names), names)
		}
	}
	var xs int
	for n := range numbers {
		if n.device == "dev-x" {
			xs++
		}
	}
	if xs != 3 {
		t.Errorf("dev-x's files carry %d numbers, want 3: %v", xs, numbers)
	}
}

// A patch file's number past maxFileSeq is no number, as one that is not
// a positive integer: the file reads alike, numbered or not.
func TestPatchSeqBounded(t *testing.T) {
	for _, c := range []struct {
		seq  string
		want int64
	}{{"17", 17}, {"4611686018427387904", maxFileSeq}, {"4611686018427387905", 0}, {"9223372036854775807", 0}, {"0", 0}, {"-3", 0}, {"1.5", 0}, {`"7"`, 0}} {
		raw := gzipBytes([]byte(`{"format":1,"device":"d","changes":[],"seq":` + c.seq + `}`))
		got, err := decodePatchFile(bytes.NewReader(raw), "d", 1<<20, 1<<20, func(fileChange) error { return nil })
		if err != nil || got != c.want {
			t.Errorf("seq %s: got %d, %v; want %d", c.seq, got, err, c.want)
		}
	}
}

// A device whose marker lost the race to start a store joins the
// winner's store on the same remote, where its files from before stay:
// it numbers its next files after them, so that no number names two
// files.
func TestNumbersAfterLosingTheMarkerRaceNameOneFile(t *testing.T) {
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
	srv.SetListingLag(0)
	for i := range 5 { // until the lagging listings show every file
		a.put("ra", fmt.Sprintf(`{"v":%d}`, i))
		b.put("rb", fmt.Sprintf(`{"v":%d}`, i))
		a.sync()
		b.sync()
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	for n, names := range fileNumbers(t, a.cfg.Remote) {
		if len(names) > 1 {
			t.Errorf("number %d of %s names %d files: %v", n.seq, n.device, len(names), names)
		}
	}
}
