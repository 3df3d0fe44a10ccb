package drivesync

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// fillerText returns n letters that hardly compress.
func fillerText(rnd *rand.Rand, n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rnd.IntN(len(letters))]
	}
	return string(b)
}

// deferredRefusedRebase: device b (whose table CHECKs display_order) edits
// r's body while it also has enough other changes (f0..f5, ordered before
// r) that r does not fit in the first patch file when the store's
// MaxExpandedSize is small. Meanwhile a sets r's display_order to 500,
// which b's table refuses. Returns what a ends with for r.
func deferredRefusedRebase(t *testing.T, maxExpanded int64) (string, Report) {
	t.Helper()
	remote := NewMemoryRemote()
	b := newDevice(t, "dev-b", remote, checkedNotesSchema)
	b.cfg.Limits = Limits{MaxExpandedSize: maxExpanded}
	b.open()
	b.sync() // b creates the store, with its limits
	a := newDevice(t, "dev-a", remote)
	a.put("r", `{"title":"t","display_order":1,"body":"0"}`)
	syncAll(t, a, b)

	rnd := rand.New(rand.NewPCG(7, 7))
	for i := range 6 {
		b.put(fmt.Sprintf("f%d", i), fmt.Sprintf(`{"title":"f","text":%q}`, fillerText(rnd, 300)))
	}
	b.exec(`UPDATE notes SET content = jsonb_set(content, '$.body', 'mine') WHERE id = 'r'`)

	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.display_order', 500), display_order = 500 WHERE id = 'r'`)
	a.sync()

	rb := b.sync()
	syncAll(t, a, b)
	return a.get("r"), rb
}

// A device's edit goes out whether its changes fit in one patch file or
// take several, while a change the device's table refuses arrives in the
// same sync. (When a sync's changes went out in rounds, the record held
// for a later round was rebased and refused in between, and its edit was
// lost; see also TestEditDuringSyncKeptWhenRebaseRefused.)
func TestEditInSeveralFilesKeptWhenRebaseRefused(t *testing.T) {
	want := `{"body":"mine","display_order":500,"title":"t"}`
	if got, _ := deferredRefusedRebase(t, 1<<20); got != want {
		t.Fatalf("control (one file): a: r = %s, want %s", got, want)
	}
	got, rb := deferredRefusedRebase(t, 1024)
	if got != want {
		t.Errorf("several files: a: r = %s, want %s: b's edit of body was never sent (b sent %d changes, uploaded %s, unwritten %v)", got, want, rb.ChangesSent, rb.Uploaded, unwrittenIDs(rb))
	}
}

// A change larger, uncompressed, than the store's MaxFileSize but well
// within it compressed (and within MaxExpandedSize) is sent: near the
// limit the writer measures each change's compressed size exactly, not
// by a bound that takes it for incompressible.
func TestCompressibleChangeOverFileSizeSent(t *testing.T) {
	remote := NewMemoryRemote()
	a := storeDevice(t, "dev-a", remote, Limits{MaxRecordSize: 4096, MaxFileSize: 1024, MaxExpandedSize: 8192})
	b := newDevice(t, "dev-b", remote)
	b.sync()
	a.put("r", fmt.Sprintf(`{"text":%q}`, strings.Repeat("a", 2000))) // ~2 KB, compresses to ~50 bytes
	ra := a.sync()
	rb := b.sync()
	if len(ra.Skipped) != 0 || b.get("r") == "" {
		var why string
		if len(ra.Skipped) > 0 {
			why = ra.Skipped[0].Err.Error()
		}
		t.Errorf("a skipped %d (%s), %d pending; b rejected %v and shows r = %.20q: a file holding r would be ~100 bytes compressed, ~2 KB uncompressed, within every limit", len(ra.Skipped), why, a.pendingCount(), rb.Rejected, b.get("r"))
	}
}

// recreateRevived: a re-creates r over a delete it saw, while c's edit
// (stamped after the delete, so it brings the deleted record back whole)
// arrives in the same sync. With one file, a's row goes out as a
// replacing write (planned against the state before the downloads); when
// r is deferred to a later round, the round-1 commit rebases the row on
// the revived record and the next round sends an edit.
func recreateRevived(t *testing.T, maxExpanded int64) string {
	t.Helper()
	remote := NewMemoryRemote()
	a := storeDevice(t, "dev-a", remote, Limits{MaxExpandedSize: maxExpanded})
	b := newDevice(t, "dev-b", remote)
	c := newDevice(t, "dev-c", remote)
	a.put("r", `{"title":"old","secret":"s"}`)
	syncAll(t, a, b, c)
	b.exec(`DELETE FROM notes WHERE id = 'r'`)
	b.sync()
	a.sync() // a sees the delete
	c.exec(`UPDATE notes SET content = jsonb_set(content, '$.note', 'c') WHERE id = 'r'`)
	c.sync() // stamped after the delete: brings r back whole
	rnd := rand.New(rand.NewPCG(3, 3))
	for i := range 6 {
		a.put(fmt.Sprintf("f%d", i), fmt.Sprintf(`{"title":"f","text":%q}`, fillerText(rnd, 300)))
	}
	a.put("r", `{"title":"new"}`) // a new record over the delete a saw
	a.sync()
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
	return a.get("r")
}

// A re-created row replaces the deleted record whether the sync's changes
// fit in one patch file or take several: they are planned and committed
// as one.
func TestRecreateSameInSeveralFiles(t *testing.T) {
	one, several := recreateRevived(t, 1<<20), recreateRevived(t, 1024)
	if one != several || strings.Contains(several, "secret") {
		t.Errorf("one file: r = %s; several files: r = %s (the deleted record's \"secret\" must not come back)", one, several)
	}
}

// A record whose clock for one member path is over twice the record
// limit (every write within the limit: here 166 nested levels, each last
// written by its own sync, under a store MaxRecordSize of 1 KiB) cannot
// be split into snapshot entries. The snapshot is not written, as one
// over the store's limits: the sync succeeds, and tries again later.
func TestUnsplittableRecordDoesNotFailSyncs(t *testing.T) {
	remote, clk := clockedRemote()
	a := storeDevice(t, "dev-a", remote, Limits{MaxRecordSize: 1024})
	const depth = 166
	a.put("r", "{"+strings.Repeat(`"a":{`, depth)+`"z":1`+strings.Repeat("}", depth)+"}")
	a.sync()
	for i := depth - 1; i >= 1; i-- { // each level stamped by its own write
		a.exec(`UPDATE notes SET content = jsonb_set(content, ?, 1) WHERE id = 'r'`, "$"+strings.Repeat(".a", i)+".z")
		clk.add(time.Second)
		if r := a.sync(); len(r.Skipped) != 0 {
			t.Fatalf("level %d skipped: %v", i, r.Skipped)
		}
	}
	clk.add(40 * 24 * time.Hour) // a snapshot falls due
	for i := range 2 {
		if _, err := a.eng.Sync(t.Context()); err != nil {
			t.Errorf("sync %d after the month turned: %v", i, err)
		}
		clk.add(time.Hour)
	}
}

// The app edits r during b's sync while a's change to r, which b's table
// refuses, arrives. The row rebased on it is refused, and still shows
// the edit over what it showed before: the edit goes out next time.
// (Before, the row, edit included, was recorded as the edit's base, and
// the edit was never sent.)
func TestEditDuringSyncKeptWhenRebaseRefused(t *testing.T) {
	remote := NewMemoryRemote()
	b := newDevice(t, "dev-b", remote, checkedNotesSchema)
	b.sync()
	a := newDevice(t, "dev-a", remote)
	a.put("r", `{"title":"t","display_order":1,"body":"0"}`)
	syncAll(t, a, b)
	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.display_order', 500), display_order = 500 WHERE id = 'r'`)
	a.sync()
	hooks(b.eng).step = func(point string) error {
		if point == "planned" {
			b.exec(`UPDATE notes SET content = jsonb_set(content, '$.body', 'mine') WHERE id = 'r'`)
		}
		return nil
	}
	b.sync()
	hooks(b.eng).step = nil
	syncAll(t, a, b)
	if got, want := a.get("r"), `{"body":"mine","display_order":500,"title":"t"}`; got != want {
		t.Errorf("a: r = %s, want %s (b shows %s, %d pending on b)", got, want, b.get("r"), b.pendingCount())
	}
}
