// Package remotetest is the conformance suite every drivesync.Remote must
// pass. The engine relies on exactly these properties, so a new Remote that
// passes Run can be trusted with a user's data.
package remotetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/drivesync/drivesync"
)

// Options relax the contract for remotes that cannot keep all of it.
type Options struct {
	// CreateMayRace is for stores that allow several files of one name
	// (Google Drive): Create refuses an existing name, but concurrent
	// Creates of one name may all succeed. Each file must still be whole.
	CreateMayRace bool
}

// Run tests the Remote that newRemote returns against the contract documented
// on drivesync.Remote. Each subtest calls newRemote once and expects an empty
// Remote that no one else is using, so that List's result can be checked
// exactly.
func Run(t *testing.T, newRemote func(t *testing.T) drivesync.Remote, opts ...Options) {
	var opt Options
	for _, o := range opts {
		opt = o
	}
	tests := []struct {
		name string
		test func(t *testing.T, r drivesync.Remote)
	}{
		{"RoundTrip", testRoundTrip},
		{"CreateExisting", testCreateExisting},
		{"ConcurrentCreate", func(t *testing.T, r drivesync.Remote) { testConcurrentCreate(t, r, opt.CreateMayRace) }},
		{"OpenMissing", testOpenMissing},
		{"Delete", testDelete},
		{"DeleteMissing", testDeleteMissing},
		{"ListAll", testListAll},
		{"ListSince", testListSince},
		{"Now", testNow},
		{"CancelledContext", testCancelledContext},
		{"CancelDuringCreate", testCancelDuringCreate},
		{"InvalidNames", testInvalidNames},
		{"Identity", testIdentity},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.test(t, newRemote(t))
		})
	}
}

func testRoundTrip(t *testing.T, r drivesync.Remote) {
	large := make([]byte, 3<<20)
	rng := rand.NewChaCha8([32]byte{1})
	rng.Read(large)
	for name, content := range map[string][]byte{
		"empty":            {},
		"small":            []byte("hello, remote"),
		"2026/11/22/large": large,
	} {
		create(t, r, name, content)
		got := read(t, r, name)
		if !bytes.Equal(got, content) {
			t.Errorf("Open(%q): got %d bytes %s, want %d bytes %s", name, len(got), preview(got), len(content), preview(content))
		}
	}
}

func testCreateExisting(t *testing.T, r drivesync.Remote) {
	ctx := context.Background()
	create(t, r, "a/b", []byte("first"))
	err := r.Create(ctx, "a/b", bytes.NewReader([]byte("second")))
	if !errors.Is(err, fs.ErrExist) {
		t.Errorf("second Create(%q): got %v, want fs.ErrExist", "a/b", err)
	}
	if got, want := read(t, r, "a/b"), "first"; string(got) != want {
		t.Errorf("after second Create, Open(%q): got %q, want %q", "a/b", got, want)
	}
}

func testConcurrentCreate(t *testing.T, r drivesync.Remote, mayRace bool) {
	const n = 8
	const name = "2026/11/22/race"
	contents := make([][]byte, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		// Each goroutine's content is one distinct byte repeated, large
		// enough to take several writes, so a mix would show.
		contents[i] = bytes.Repeat([]byte{'A' + byte(i)}, 256<<10)
		wg.Go(func() {
			<-start
			errs[i] = r.Create(context.Background(), name, bytes.NewReader(contents[i]))
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0 && mayRace:
			// Several files of one name: Open reads one of them, whole.
		case err == nil && winner >= 0:
			t.Errorf("Create %d and %d both succeeded, want exactly one", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, fs.ErrExist):
			t.Errorf("losing Create %d: got %v, want fs.ErrExist", i, err)
		}
	}
	if winner < 0 {
		t.Fatalf("no Create succeeded, want exactly one: %v", errs)
	}
	got := read(t, r, name)
	whole := false
	for i, err := range errs {
		if err == nil && bytes.Equal(got, contents[i]) && (mayRace || i == winner) {
			whole = true
		}
	}
	if !whole {
		t.Errorf("Open(%q): got %d bytes %s, want one successful Create's content whole (winner %d: %s)", name, len(got), preview(got), winner, preview(contents[winner]))
	}
}

func testOpenMissing(t *testing.T, r drivesync.Remote) {
	for _, name := range []string{"missing", "2026/11/22/missing"} {
		rc, err := r.Open(context.Background(), name)
		if err == nil {
			rc.Close()
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Open(%q): got %v, want fs.ErrNotExist", name, err)
		}
	}
}

func testDelete(t *testing.T, r drivesync.Remote) {
	ctx := context.Background()
	const name = "2026/11/22/gone"
	create(t, r, name, []byte("x"))
	create(t, r, "2026/11/22/kept", []byte("y"))
	for i := range 2 {
		if err := r.Delete(ctx, name); err != nil {
			t.Errorf("Delete(%q) #%d: got %v, want nil", name, i+1, err)
		}
	}
	rc, err := r.Open(ctx, name)
	if err == nil {
		rc.Close()
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open(%q) after Delete: got %v, want fs.ErrNotExist", name, err)
	}
	if got, want := read(t, r, "2026/11/22/kept"), "y"; string(got) != want {
		t.Errorf("Open of a sibling after Delete: got %q, want %q", got, want)
	}
}

func testDeleteMissing(t *testing.T, r drivesync.Remote) {
	for _, name := range []string{"never", "2026/11/22/never"} {
		if err := r.Delete(context.Background(), name); err != nil {
			t.Errorf("Delete(%q) of a missing file: got %v, want nil", name, err)
		}
	}
}

func testListAll(t *testing.T, r drivesync.Remote) {
	want := map[string]int64{
		"top":          3,
		"empty":        0,
		"2026/11/22/a": 1,
		"2026/11/22/b": 1000,
		"2026/11/23/c": 70000,
	}
	for name, size := range want {
		create(t, r, name, bytes.Repeat([]byte{'x'}, int(size)))
	}
	create(t, r, "2026/11/21/deleted", []byte("x"))
	if err := r.Delete(context.Background(), "2026/11/21/deleted"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	got := list(t, r, time.Time{})
	for name, size := range got {
		wantSize, ok := want[name]
		switch {
		case !ok:
			t.Errorf("List(zero) returned %q, want only %v", name, sortedNames(want))
		case size != wantSize && size != -1:
			t.Errorf("List(zero): %q: got size %d, want %d", name, size, wantSize)
		}
	}
	for name := range want {
		if _, ok := got[name]; !ok {
			t.Errorf("List(zero): missing %q; got %v, want %v", name, sortedNames(got), sortedNames(want))
		}
	}
}

func testListSince(t *testing.T, r drivesync.Remote) {
	ctx := context.Background()
	create(t, r, "2026/11/21/old", []byte("old"))
	since, err := r.Now(ctx)
	if err != nil {
		t.Fatalf("Now: %v", err)
	}
	newer := []string{"2026/11/22/new1", "2026/11/22/new2", "new3"}
	for _, name := range newer {
		create(t, r, name, []byte(name))
	}
	// Files created before since may or may not be listed; later ones must.
	got := list(t, r, since)
	for _, name := range newer {
		if size, ok := got[name]; !ok {
			t.Errorf("List(since): missing %q; got %v, want at least %v", name, sortedNames(got), newer)
		} else if want := int64(len(name)); size != want && size != -1 {
			t.Errorf("List(since): %q: got size %d, want %d", name, size, want)
		}
	}
}

func testNow(t *testing.T, r drivesync.Remote) {
	// The remote's clock may differ from ours, so only check it is sane.
	ctx := context.Background()
	t1, err := r.Now(ctx)
	if err != nil {
		t.Fatalf("Now: %v", err)
	}
	t2, err := r.Now(ctx)
	if err != nil {
		t.Fatalf("Now: %v", err)
	}
	if t1.IsZero() {
		t.Errorf("Now: got the zero time, want a real time")
	}
	if t2.Before(t1.Add(-time.Second)) {
		t.Errorf("Now went backwards: got %v then %v, want the second no more than 1s before the first", t1, t2)
	}
}

func testCancelledContext(t *testing.T, r drivesync.Remote) {
	create(t, r, "exists", []byte("x"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	check := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: got %v, want context.Canceled", op, err)
		}
	}
	_, err := r.List(ctx, time.Time{})
	check("List", err)
	rc, err := r.Open(ctx, "exists")
	if err == nil {
		rc.Close()
	}
	check("Open", err)
	check("Create", r.Create(ctx, "cancelled", bytes.NewReader([]byte("x"))))
	check("Delete", r.Delete(ctx, "exists"))
	_, err = r.Now(ctx)
	check("Now", err)
	if _, ok := list(t, r, time.Time{})["cancelled"]; ok {
		t.Errorf("List after Create with a cancelled context: got %q listed, want it absent", "cancelled")
	}
}

func testCancelDuringCreate(t *testing.T, r drivesync.Remote) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const name = "2026/11/22/cancelled"
	content := &cancellingReader{r: bytes.NewReader(make([]byte, 3<<20)), cancel: cancel}
	if err := r.Create(ctx, name, content); !errors.Is(err, context.Canceled) {
		t.Errorf("Create cancelled while reading content: got %v, want context.Canceled", err)
	}
	if got := list(t, r, time.Time{}); len(got) != 0 {
		t.Errorf("List after a cancelled Create: got %v, want nothing", sortedNames(got))
	}
}

// cancellingReader cancels its context on the first Read, as if the user gave
// up while a large file was uploading.
type cancellingReader struct {
	r      io.Reader
	cancel context.CancelFunc
}

func (c *cancellingReader) Read(p []byte) (int, error) {
	c.cancel()
	return c.r.Read(p)
}

func testInvalidNames(t *testing.T, r drivesync.Remote) {
	ctx := context.Background()
	create(t, r, "b", []byte("b"))
	invalid := []string{"", "/abs", "a/../b", "../b", "a//b", "a/", "./b", ".hidden", "a/.tmp", `a\b`, "a\x00b"}
	for _, name := range invalid {
		if err := r.Create(ctx, name, bytes.NewReader([]byte("bad"))); err == nil {
			t.Errorf("Create(%q): got nil error, want an invalid name error", name)
		}
		rc, err := r.Open(ctx, name)
		if err == nil {
			rc.Close()
			t.Errorf("Open(%q): got nil error, want an invalid name error", name)
		}
		// Delete may reject the name or ignore it, but must not reach
		// outside the name space, for example to delete "b" for "a/../b".
		r.Delete(ctx, name)
	}
	got := list(t, r, time.Time{})
	if size, ok := got["b"]; len(got) != 1 || !ok || size != 1 && size != -1 {
		t.Errorf("List after invalid Creates and Deletes: got %v, want only [b]", sortedNames(got))
	}
}

func create(t *testing.T, r drivesync.Remote, name string, content []byte) {
	t.Helper()
	if err := r.Create(context.Background(), name, bytes.NewReader(content)); err != nil {
		t.Fatalf("Create(%q): %v", name, err)
	}
}

func read(t *testing.T, r drivesync.Remote, name string) []byte {
	t.Helper()
	rc, err := r.Open(context.Background(), name)
	if err != nil {
		t.Fatalf("Open(%q): %v", name, err)
	}
	b, err := io.ReadAll(rc)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("reading %q: %v", name, err)
	}
	return b
}

// list returns List's result as a map of name to size, failing on duplicates.
func list(t *testing.T, r drivesync.Remote, since time.Time) map[string]int64 {
	t.Helper()
	files, err := r.List(context.Background(), since)
	if err != nil {
		t.Fatalf("List(%v): %v", since, err)
	}
	m := make(map[string]int64, len(files))
	for _, f := range files {
		if _, dup := m[f.Name]; dup {
			t.Errorf("List(%v): got %q twice, want each file once", since, f.Name)
		}
		m[f.Name] = f.Size
	}
	return m
}

func sortedNames[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// preview shows the start of content, which is enough to tell contents apart
// without printing megabytes.
func preview(b []byte) string {
	if len(b) > 16 {
		return fmt.Sprintf("%q...", b[:16])
	}
	return fmt.Sprintf("%q", b)
}

// testIdentity checks the optional IdentifiedRemote: a non-empty identity
// that does not change while the Remote reaches the same storage, and a
// cancelled context honoured.
func testIdentity(t *testing.T, r drivesync.Remote) {
	ir, ok := r.(drivesync.IdentifiedRemote)
	if !ok {
		t.Skip("the Remote does not implement IdentifiedRemote")
	}
	ctx := context.Background()
	first, err := ir.Identity(ctx)
	if err != nil || first == "" {
		t.Fatalf("Identity = %q, %v; want a non-empty identity", first, err)
	}
	create(t, r, "2026/11/22/a", []byte("a"))
	if again, err := ir.Identity(ctx); err != nil || again != first {
		t.Errorf("Identity = %q, %v after a Create; want %q again", again, err, first)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := ir.Identity(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Identity with a cancelled context: %v, want context.Canceled", err)
	}
}
