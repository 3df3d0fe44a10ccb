package remotetest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"testing"
	"testing/iotest"
	"time"

	"github.com/drivesync/drivesync"
)

// The subtests in this file check that no one sees a file half-written.
// The engine reads every file it lists; half a patch file is a corrupt one
// to it, which it reports and reads again later at best, and a store's
// marker or snapshot read half-written can stop every device's sync.

// testHiddenWhileWriting starts a Create whose content stops half way, and
// looks for the file while the Create waits for the rest. A Remote that
// writes under the final name as the content arrives shows half a file.
func testHiddenWhileWriting(t *testing.T, r drivesync.Remote) {
	ctx := context.Background()
	const name = "2026/11/22/growing"
	content := bytes.Repeat([]byte("0123456789abcdef"), 1<<17) // 2 MiB
	src := &pausingReader{data: content, pauseAt: len(content) / 2, paused: make(chan struct{}), resume: make(chan struct{})}
	created := make(chan error, 1)
	go func() { created <- r.Create(ctx, name, src) }()
	select {
	case <-src.paused:
	case err := <-created:
		t.Fatalf("Create(%q) returned %v before reading its content to the end; want it to read the content until io.EOF", name, err)
	case <-time.After(time.Minute):
		t.Fatalf("Create(%q) has not read half of its %d bytes of content after a minute", name, len(content))
	}

	// Look while the Create waits. A Remote that serialises its calls
	// makes Open and List wait for the Create instead, so give up waiting
	// after a while and let the Create finish: they must then show the
	// whole file.
	var seen struct {
		opened  []byte
		openErr error
		listed  map[string]int64
		listErr error
	}
	looked := make(chan struct{})
	go func() {
		defer close(looked)
		seen.opened, seen.openErr = readAll(ctx, r, name)
		var files []drivesync.RemoteFile
		files, seen.listErr = r.List(ctx, time.Time{})
		seen.listed = make(map[string]int64)
		for _, f := range files {
			seen.listed[f.Name] = f.Size
		}
	}()
	select {
	case <-looked:
	case <-time.After(5 * time.Second):
	}
	close(src.resume)
	if err := <-created; err != nil {
		t.Fatalf("Create(%q): %v", name, err)
	}
	select {
	case <-looked:
	case <-time.After(time.Minute):
		t.Fatalf("Open or List, called while Create(%q) was reading its content, has not returned a minute after the Create did", name)
	}

	const while = "while Create was still reading the content"
	switch {
	case errors.Is(seen.openErr, fs.ErrNotExist):
	case seen.openErr != nil:
		t.Errorf("Open(%q) %s: got %v, want fs.ErrNotExist", name, while, seen.openErr)
	case !bytes.Equal(seen.opened, content):
		t.Errorf("Open(%q) %s: read %d bytes %s, want fs.ErrNotExist: write the content under a temporary name (or buffer it) and publish the file only after the content reached io.EOF", name, while, len(seen.opened), preview(seen.opened))
	}
	if seen.listErr != nil {
		t.Errorf("List %s: %v", while, seen.listErr)
	} else if size, ok := seen.listed[name]; ok && size != int64(len(content)) && size != -1 {
		t.Errorf("List %s: got %q of %d bytes, want it not listed until it is whole (%d bytes)", while, name, size, len(content))
	}
	if got := read(t, r, name); !bytes.Equal(got, content) {
		t.Errorf("Open(%q) after Create: got %d bytes %s, want %d bytes %s", name, len(got), preview(got), len(content), preview(content))
	}
}

// pausingReader gives out data up to pauseAt, then closes paused and waits
// for resume before giving out the rest.
type pausingReader struct {
	data           []byte
	off, pauseAt   int
	waited         bool
	paused, resume chan struct{}
}

func (p *pausingReader) Read(b []byte) (int, error) {
	if p.off == p.pauseAt && !p.waited {
		p.waited = true
		close(p.paused)
		<-p.resume
	}
	end := len(p.data)
	if !p.waited {
		end = p.pauseAt
	}
	if p.off == end {
		return 0, io.EOF
	}
	n := copy(b, p.data[p.off:end])
	p.off += n
	return n, nil
}

// testCreateReaderFails gives Create content that fails half way, as the
// engine's does when reading the upload from its database fails. The
// Create must fail and leave nothing that Open reads, and the name free:
// the engine uploads the same file under the same name at its next sync.
func testCreateReaderFails(t *testing.T, r drivesync.Remote) {
	content := bytes.Repeat([]byte("fedcba9876543210"), 1<<17) // 2 MiB
	errContent := errors.New("remotetest: the content failed half way")
	createFails(t, r, content, io.MultiReader(bytes.NewReader(content[:len(content)/2]), iotest.ErrReader(errContent)))
}

// testCreateSeekerFails is testCreateReaderFails with content that can
// seek, as the engine's always can: a Remote may learn its size by seeking
// to its end, or read it again from the start to retry, and must still
// store nothing when a read fails half way (when another process takes
// the upload out of the database, say).
func testCreateSeekerFails(t *testing.T, r drivesync.Remote) {
	content := bytes.Repeat([]byte("0123fedcba456789"), 1<<17) // 2 MiB
	createFails(t, r, content, &failingSeeker{data: content, failAt: int64(len(content) / 2)})
}

// failingSeeker reads data, and fails every read that reaches failAt.
type failingSeeker struct {
	data   []byte
	failAt int64
	off    int64
}

func (f *failingSeeker) Read(p []byte) (int, error) {
	if f.off >= f.failAt {
		return 0, errors.New("remotetest: the content failed half way")
	}
	n := copy(p[:min(int64(len(p)), f.failAt-f.off)], f.data[f.off:])
	f.off += int64(n)
	return n, nil
}

func (f *failingSeeker) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		offset += f.off
	case io.SeekEnd:
		offset += int64(len(f.data))
	}
	if offset < 0 {
		return 0, errors.New("remotetest: seek to a negative position")
	}
	f.off = offset
	return offset, nil
}

// createFails creates a file from src, which fails half way through
// content, and checks that nothing was stored and the name is free.
func createFails(t *testing.T, r drivesync.Remote, content []byte, src io.Reader) {
	ctx := context.Background()
	const name = "2026/11/22/broken"
	err := r.Create(ctx, name, src)
	switch {
	case err == nil:
		t.Errorf("Create(%q) with content that failed half way: got nil error, want the content's error: Create must store nothing unless it read the whole content", name)
	case errors.Is(err, fs.ErrExist):
		t.Errorf("Create(%q) with content that failed half way: got %v, which matches fs.ErrExist; want the content's error: fs.ErrExist tells the engine that a file of that name is there", name, err)
	}
	got, openErr := readAll(ctx, r, name)
	switch {
	case openErr == nil:
		t.Errorf("Open(%q) after a Create whose content failed: read %d of its %d bytes, want fs.ErrNotExist: a failed Create must leave nothing readable", name, len(got), len(content))
	case !errors.Is(openErr, fs.ErrNotExist):
		t.Errorf("Open(%q) after a Create whose content failed: got %v, want fs.ErrNotExist", name, openErr)
	}
	if err == nil || openErr == nil {
		return // a file is there; trying the name again would only say so
	}

	if err := r.Create(ctx, name, bytes.NewReader(content)); err != nil {
		t.Fatalf("Create(%q) again after a Create whose content failed: %v; want success: a failed Create must leave the name free", name, err)
	}
	switch got := read(t, r, name); {
	case bytes.Equal(got, content[:len(content)/2]):
		t.Errorf("Open(%q) after a failed Create and a good one: got the %d bytes the failed Create had read, want the good one's %d: the failed Create stored them, perhaps only after it returned (as a client does that ends the request body well-formed before it passes on the content's error)", name, len(got), len(content))
	case !bytes.Equal(got, content):
		t.Errorf("Open(%q) after the second Create: got %d bytes %s, want %d bytes %s", name, len(got), preview(got), len(content), preview(content))
	}
	listed := list(t, r, time.Time{})
	if size, ok := listed[name]; len(listed) != 1 || !ok || size != int64(len(content)) && size != -1 {
		t.Errorf("List after a failed Create and a good one: got %v, want only %q of %d bytes: a failed Create must leave nothing behind", listed, name, len(content))
	}
}

// testCancelDuringCreate cancels the context while Create reads its
// content, as a user who quits during a large upload does: the Create must
// end with the context's error and store nothing.
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
