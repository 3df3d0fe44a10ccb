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
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/drivesync/drivesync"
)

// Options relax the contract for remotes that cannot keep all of it. The
// zero value checks everything.
type Options struct {
	// CreateMayRace is for stores that allow several files of one name
	// (Google Drive): Create refuses an existing name, but concurrent
	// Creates of one name may all succeed. Each file must still be whole.
	// The engine reads such a name's files in one order on every device,
	// so it copes. Set it only for a store that cannot refuse a name
	// atomically.
	CreateMayRace bool
}

// Run tests the Remote that newRemote returns against the contract documented
// on drivesync.Remote and drivesync.IdentifiedRemote, one subtest per
// property (see the package documentation). Each subtest calls newRemote
// once and expects an empty Remote that no one else is using, so that List's
// result can be checked exactly. At most one Options is expected; if several
// are given, the last one counts.
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
		{"CreateReaders", testCreateReaders},
		{"NestedNames", testNestedNames},
		{"CreateExisting", testCreateExisting},
		{"ConcurrentCreate", func(t *testing.T, r drivesync.Remote) { testConcurrentCreate(t, r, opt.CreateMayRace) }},
		{"HiddenWhileWriting", testHiddenWhileWriting},
		{"CreateReaderFails", testCreateReaderFails},
		{"CreateSeekerFails", testCreateSeekerFails},
		{"OpenMissing", testOpenMissing},
		{"Delete", testDelete},
		{"DeleteMissing", testDeleteMissing},
		{"ListAll", testListAll},
		{"ListSince", testListSince},
		{"Now", testNow},
		{"CancelledContext", testCancelledContext},
		{"DeadlineExceeded", testDeadlineExceeded},
		{"CancelDuringCreate", testCancelDuringCreate},
		{"InvalidNames", testInvalidNames},
		{"Concurrent", testConcurrent},
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

// testCreateReaders stores content that comes through readers other than a
// bytes.Reader. The engine's readers cannot seek, so a Remote that seeks to
// retry an upload must manage without; and io.Reader allows short reads and
// data returned together with io.EOF, which a hand-written copy loop may
// drop.
func testCreateReaders(t *testing.T, r drivesync.Remote) {
	ctx := context.Background()
	content := make([]byte, 200<<10+7)
	rand.NewChaCha8([32]byte{2}).Read(content)
	small := content[:9<<10]
	for _, tt := range []struct {
		name    string
		how     string
		content []byte
		src     io.Reader
	}{
		{"readers/unseekable", "a reader that cannot seek", content, struct{ io.Reader }{bytes.NewReader(content)}},
		{"readers/half", "a reader that fills half of each buffer", content, iotest.HalfReader(bytes.NewReader(content))},
		{"readers/data-eof", "a reader that returns its last data with io.EOF", content, iotest.DataErrReader(bytes.NewReader(content))},
		{"readers/bytewise", "a reader that returns one byte per Read", small, iotest.OneByteReader(bytes.NewReader(small))},
	} {
		if err := r.Create(ctx, tt.name, tt.src); err != nil {
			t.Errorf("Create(%q) from %s: %v", tt.name, tt.how, err)
			continue
		}
		if got := read(t, r, tt.name); !bytes.Equal(got, tt.content) {
			t.Errorf("Create(%q) from %s, then Open: got %d bytes %s, want %d bytes %s", tt.name, tt.how, len(got), preview(got), len(tt.content), preview(tt.content))
		}
	}
}

// testNestedNames stores files under names shaped like the engine's, in
// folders that do not exist yet, and checks that List gives each name back
// as Create was given it.
func testNestedNames(t *testing.T, r drivesync.Remote) {
	ctx := context.Background()
	const device = "0b7e3c1a-5d2f-4c8e-9a61-3f2b8d7e4c10"
	const deep, again = "a/b/c/d/e/f/deep", "a/b/c/d/e/f/again"
	names := []string{
		"drivesync.json",
		"2026/11/22/patch_20261122T101500.123Z_" + device + ".json.gz",
		"2026/11/22/snapshot_20261122T101501.000Z_" + device + ".json.gz",
		"2026/12/01/merge_20261201T000000.000Z_" + device + ".json.gz",
		deep,
		"a/b/beside",
		"a/file",
	}
	for _, name := range names {
		if err := r.Create(ctx, name, strings.NewReader(name)); err != nil {
			t.Fatalf("Create(%q): %v; want Create to make the folders the name needs", name, err)
		}
	}
	for _, name := range names {
		if got := read(t, r, name); string(got) != name {
			t.Errorf("Open(%q): got %q, want %q", name, got, name)
		}
	}
	checkNames := func(when string, want []string) {
		t.Helper()
		if got := sortedNames(list(t, r, time.Time{})); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			t.Errorf("List(zero) %s: got %q, want %q: each name as Create was given it, slash-separated and relative to the root", when, got, slices.Sorted(slices.Values(want)))
		}
	}
	checkNames("after Creates in new folders", names)

	// Deleting a folder's last file may remove the folder (FolderRemote
	// does); a Remote that remembers folders must not trip over that.
	if err := r.Delete(ctx, deep); err != nil {
		t.Fatalf("Delete(%q): %v", deep, err)
	}
	if err := r.Create(ctx, again, strings.NewReader(again)); err != nil {
		t.Fatalf("Create(%q) after deleting the only file of its folder: %v; want the folder made again if need be", again, err)
	}
	if got := read(t, r, again); string(got) != again {
		t.Errorf("Open(%q): got %q, want %q", again, got, again)
	}
	names[slices.Index(names, deep)] = again
	checkNames("after a Delete and a Create in the emptied folder", names)
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
	got := list(t, r, time.Time{})
	if size, ok := got["a/b"]; len(got) != 1 || !ok || size != int64(len("first")) && size != -1 {
		t.Errorf("List after a refused Create: got %v, want only %q, of %d bytes: a refused Create must store nothing", got, "a/b", len("first"))
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

// testConcurrent calls every method from several goroutines at once, as
// several engines sharing one Remote do, and checks what is left. Run under
// -race, it also finds unguarded state.
func testConcurrent(t *testing.T, r drivesync.Remote) {
	ctx := context.Background()
	ir, identified := r.(drivesync.IdentifiedRemote)
	var identity string
	if identified {
		var err error
		if identity, err = ir.Identity(ctx); err != nil {
			t.Fatalf("Identity: %v", err)
		}
	}
	const workers, perWorker = 4, 6
	var mu sync.Mutex
	kept := map[string]int64{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			checkIdentity := identified
			for i := range perWorker {
				// Even files share a folder that every goroutine needs at
				// once; odd ones get folders of their own.
				name := fmt.Sprintf("2026/11/22/w%d-%d", w, i)
				if i%2 == 1 {
					name = fmt.Sprintf("w%d/%d/f", w, i)
				}
				content := bytes.Repeat([]byte(name), 100*(i+1))
				if err := r.Create(ctx, name, bytes.NewReader(content)); err != nil {
					t.Errorf("Create(%q) while other goroutines use the Remote: %v", name, err)
					return
				}
				if got, err := readAll(ctx, r, name); err != nil || !bytes.Equal(got, content) {
					t.Errorf("Open(%q) while other goroutines use the Remote: got %d bytes %s, %v; want the %d bytes just created", name, len(got), preview(got), err, len(content))
				}
				files, err := r.List(ctx, time.Time{})
				if err != nil {
					t.Errorf("List while other goroutines use the Remote: %v", err)
				} else if !slices.ContainsFunc(files, func(f drivesync.RemoteFile) bool { return f.Name == name }) {
					t.Errorf("List while other goroutines use the Remote: %q is missing, want it listed: it was created before the List", name)
				}
				if _, err := r.Now(ctx); err != nil {
					t.Errorf("Now while other goroutines use the Remote: %v", err)
				}
				if checkIdentity {
					if id, err := ir.Identity(ctx); err != nil || id != identity {
						t.Errorf("Identity = %q, %v while other goroutines use the Remote; want %q", id, err, identity)
						checkIdentity = false // once is enough to tell
					}
				}
				if i%3 == 2 {
					if err := r.Delete(ctx, name); err != nil {
						t.Errorf("Delete(%q) while other goroutines use the Remote: %v", name, err)
					}
					continue
				}
				mu.Lock()
				kept[name] = int64(len(content))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	got := list(t, r, time.Time{})
	if !maps.EqualFunc(got, kept, func(got, want int64) bool { return got == want || got == -1 }) {
		t.Errorf("List after concurrent Creates and Deletes: got %v, want %v", got, kept)
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
	// Deleted for good means the name is free again: a Remote that only
	// hides a deleted file, keeping its name taken, fails here.
	if err := r.Create(ctx, name, bytes.NewReader([]byte("again"))); err != nil {
		t.Fatalf("Create(%q) after Delete: got %v, want success: a deleted file must not keep its name taken", name, err)
	}
	if got, want := read(t, r, name), "again"; string(got) != want {
		t.Errorf("Open(%q) after Delete and Create: got %q, want %q", name, got, want)
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
	now := func() time.Time {
		t.Helper()
		at, err := r.Now(ctx)
		if err != nil {
			t.Fatalf("Now: %v", err)
		}
		return at
	}
	beforeAll := now()
	create(t, r, "2026/11/21/old", []byte("2026/11/21/old"))
	since := now()
	newer := []string{"2026/11/22/new1", "2026/11/22/new2", "new3"}
	for _, name := range newer {
		create(t, r, name, []byte(name))
	}
	// Files created before since may or may not be listed; later ones must.
	// since is an instant: its time zone must not change what is listed.
	for _, tt := range []struct {
		what  string
		since time.Time
		want  []string
	}{
		{"since", since, newer},
		{"since in another time zone", since.In(time.FixedZone("UTC+05:30", 5*3600+1800)), newer},
		{"since in another time zone", since.In(time.FixedZone("UTC-08:00", -8*3600)), newer},
		{"since before every file", beforeAll, append([]string{"2026/11/21/old"}, newer...)},
	} {
		got := list(t, r, tt.since)
		for _, name := range tt.want {
			if size, ok := got[name]; !ok {
				t.Errorf("List(%v), %s: missing %q, created after Now returned that time; got %v, want at least %v", tt.since, tt.what, name, sortedNames(got), tt.want)
			} else if want := int64(len(name)); size != want && size != -1 {
				t.Errorf("List(%v): %q: got size %d, want %d", tt.since, name, size, want)
			}
		}
	}
}

// maxClockSkew bounds how far the remote's clock may be from this machine's.
// The engine copes with clocks minutes or hours apart; a day apart means a
// bug, such as seconds read as milliseconds or a clock that never started.
const maxClockSkew = 24 * time.Hour

func testNow(t *testing.T, r drivesync.Remote) {
	// The remote's clock may differ from ours, so check only that it is a
	// real time near ours that does not go back. It is read twice in a row,
	// then after calls that do I/O, because a Remote that estimates the
	// server's clock from its responses (as DriveRemote does) corrects the
	// estimate as they come.
	ctx := context.Background()
	var prev time.Time
	for i := range 8 {
		at, err := r.Now(ctx)
		if err != nil {
			t.Fatalf("Now: %v", err)
		}
		local := time.Now().Round(0) // no monotonic reading in messages
		switch {
		case at.IsZero():
			t.Fatalf("Now: got the zero time, want a real time")
		case at.Sub(local).Abs() > maxClockSkew:
			t.Fatalf("Now: got %v, this machine's clock says %v; want the remote's clock within %v of it (check units, and that Now returns an instant such as time.Now().UTC())", at, local, maxClockSkew)
		case i > 0 && at.Before(prev.Add(-time.Second)):
			t.Errorf("Now went backwards: got %v then %v, want the second no more than 1s before the first", prev, at)
		}
		prev = at
		if i%2 == 1 {
			create(t, r, fmt.Sprintf("2026/11/22/clock%d", i), []byte("x"))
			list(t, r, time.Time{})
		}
	}
}

// promptly bounds how long a call with a context that is already done may
// take. It needs no I/O at all, so this is generous, for slow test machines.
const promptly = 5 * time.Second

func testCancelledContext(t *testing.T, r drivesync.Remote) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	testDoneContext(t, r, ctx, "a cancelled context")
}

// testDeadlineExceeded catches a Remote that checks for cancellation but
// not for deadlines, or that reports every done context as cancelled. The
// engine reports an error matching the context's as the sync's end rather
// than as a failing remote, and the app tells a user who gave up from a sync
// that ran out of time by which one the error matches.
func testDeadlineExceeded(t *testing.T, r drivesync.Remote) {
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	testDoneContext(t, r, ctx, "a context past its deadline")
}

// testDoneContext calls every method with ctx, which is done, and expects
// each to return at once with an error matching ctx.Err(), having changed
// nothing.
func testDoneContext(t *testing.T, r drivesync.Remote, ctx context.Context, how string) {
	create(t, r, "exists", []byte("x"))
	want := ctx.Err()
	check := func(op string, call func() error) {
		t.Helper()
		start := time.Now()
		err := call()
		if took := time.Since(start); took > promptly {
			t.Errorf("%s with %s took %v, want it to return at once: check ctx.Err() before any I/O", op, how, took.Round(time.Millisecond))
		}
		if !errors.Is(err, want) {
			t.Errorf("%s with %s: got %v, want an error matching %v", op, how, err, want)
		}
	}
	check("List", func() error {
		_, err := r.List(ctx, time.Time{})
		return err
	})
	check("Open", func() error {
		rc, err := r.Open(ctx, "exists")
		if err == nil {
			rc.Close()
		}
		return err
	})
	check("Create", func() error { return r.Create(ctx, "cancelled", bytes.NewReader([]byte("x"))) })
	check("Delete", func() error { return r.Delete(ctx, "exists") })
	check("Now", func() error {
		_, err := r.Now(ctx)
		return err
	})
	if ir, ok := r.(drivesync.IdentifiedRemote); ok {
		check("Identity", func() error {
			_, err := ir.Identity(ctx)
			return err
		})
	}
	got := list(t, r, time.Time{})
	if _, ok := got["cancelled"]; ok {
		t.Errorf("List after Create with %s: got %q listed, want it absent", how, "cancelled")
	}
	if _, ok := got["exists"]; !ok {
		t.Errorf("List after Delete with %s: %q is gone, want it kept: a call that returns an error must not have done its work", how, "exists")
	}
}

func testInvalidNames(t *testing.T, r drivesync.Remote) {
	ctx := context.Background()
	create(t, r, "b", []byte("b"))
	invalid := []string{
		"", "/", "/abs", "/b", // empty or absolute
		".", "..", "a/../b", "../b", "a/..", "a/./b", "a/.", // dot elements
		"a//b", "a/", "b/", // empty elements
		"./b", ".hidden", "a/.tmp", "..b", // elements kept for temp files
		`a\b`, `\b`, "a\x00b", // not portable
	}
	for _, name := range invalid {
		if err := r.Create(ctx, name, bytes.NewReader([]byte("bad"))); err == nil {
			t.Errorf("Create(%q): got nil error, want an invalid name error (%s)", name, invalidName(name))
		}
		rc, err := r.Open(ctx, name)
		if err == nil {
			rc.Close()
			t.Errorf("Open(%q): got nil error, want an invalid name error (%s)", name, invalidName(name))
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

// readAll reads the named file whole, for goroutines, which must not call
// t.Fatal.
func readAll(ctx context.Context, r drivesync.Remote, name string) ([]byte, error) {
	rc, err := r.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(rc)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	return b, err
}

// list returns List's result as a map of name to size, failing on duplicates.
func list(t *testing.T, r drivesync.Remote, since time.Time) map[string]int64 {
	t.Helper()
	call := fmt.Sprintf("List(%v)", since)
	if since.IsZero() {
		call = "List(zero)"
	}
	files, err := r.List(context.Background(), since)
	if err != nil {
		t.Fatalf("%s: %v", call, err)
	}
	m := make(map[string]int64, len(files))
	for _, f := range files {
		if _, dup := m[f.Name]; dup {
			t.Errorf("%s: got %q twice, want each file once", call, f.Name)
		}
		if why := invalidName(f.Name); why != "" {
			t.Errorf("%s: got the name %q, which %s; want each name as Create was given it, slash-separated and relative to the root", call, f.Name, why)
		}
		if f.Size < -1 {
			t.Errorf("%s: %q: got size %d, want the size in bytes, or -1 if unknown", call, f.Name, f.Size)
		}
		m[f.Name] = f.Size
	}
	return m
}

// invalidName says why name breaks the rules every Remote applies to names,
// or returns "" for a valid name. The rules are those of the strictest
// store, a shared folder: a name stays inside the root, means the same path
// on every OS, and starts no element with ".", which a Remote may use for
// its temp files and sync tools use for their state.
func invalidName(name string) string {
	switch {
	case name == "":
		return "is empty"
	case name[0] == '/':
		return "is absolute"
	case strings.ContainsRune(name, '\\'):
		return "contains a backslash"
	case strings.ContainsRune(name, 0):
		return "contains NUL"
	}
	for elem := range strings.SplitSeq(name, "/") {
		switch {
		case elem == "":
			return "has an empty element"
		case elem == "." || elem == "..":
			return `has a "." or ".." element`
		case elem[0] == '.':
			return `has an element starting with "."`
		}
	}
	return ""
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
	if again, err := ir.Identity(ctx); err != nil || again != first {
		t.Errorf("Identity = %q, %v when asked again; want %q again", again, err, first)
	}
	create(t, r, "2026/11/22/a", []byte("a"))
	if again, err := ir.Identity(ctx); err != nil || again != first {
		t.Errorf("Identity = %q, %v after a Create; want %q again", again, err, first)
	}
	// The engine records the identity once and compares it at later
	// syncs: anything that changes it (the files stored, the clock, a
	// cache) would make the same storage look like another.
	list(t, r, time.Time{})
	if err := r.Delete(ctx, "2026/11/22/a"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := r.Now(ctx); err != nil {
		t.Fatalf("Now: %v", err)
	}
	if again, err := ir.Identity(ctx); err != nil || again != first {
		t.Errorf("Identity = %q, %v after List, Delete and Now; want %q again: the identity must depend only on the storage", again, err, first)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := ir.Identity(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Identity with a cancelled context: %v, want context.Canceled", err)
	}
}
