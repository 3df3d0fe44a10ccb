package drivesync

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// goroutineID returns the id of the calling goroutine.
func review30GoroutineID() int64 {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseInt(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// review30SlowRemote serves files through a reader that pauses now and
// then, as a slow network does: progress updates are paced by time, so
// a download that takes a while reports its bytes as it goes.
type review30SlowRemote struct{ Remote }

func (s review30SlowRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	rc, err := s.Remote.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	return &review30SlowReader{ReadCloser: rc}, nil
}

type review30SlowReader struct {
	io.ReadCloser
	reads int
}

func (r *review30SlowReader) Read(p []byte) (int, error) {
	if r.reads++; r.reads%8 == 0 {
		time.Sleep(100 * time.Millisecond)
	}
	return r.ReadCloser.Read(p)
}

// TestReview30ProgressOnSyncingGoroutine: Config.Progress "runs on the
// syncing goroutine" (engine.go). A download's bytes are counted by
// progressReader as the decoder reads them; jsonStream.elements now reads
// a patch file's changes on a goroutine of its own, so the app's Progress
// callback is called from that goroutine during a download.
func TestReview30ProgressOnSyncingGoroutine(t *testing.T) {
	folder, err := NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := newDevice(t, "dev-a", folder)
	rnd := rand.New(rand.NewSource(30))
	for i := range 200 {
		body := make([]byte, 1000)
		rnd.Read(body)
		a.put(fmt.Sprint("n", i), fmt.Sprintf(`{"v":%d,"body":%q}`, i, hex.EncodeToString(body)))
	}
	a.sync()

	b := newDevice(t, "dev-b", review30SlowRemote{folder})
	me := review30GoroutineID()
	var mu sync.Mutex // only so that the test itself is race-free
	var calls, elsewhere, midDownload int
	var example Progress
	b.eng.cfg.Progress = func(p Progress) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if p.Step == "download" && p.Bytes > 0 && p.Bytes < p.TotalBytes {
			midDownload++
		}
		if review30GoroutineID() != me {
			elsewhere++
			example = p
		}
	}
	r := b.sync()
	if r.ChangesReceived != 200 {
		t.Fatalf("b received %d changes, want 200", r.ChangesReceived)
	}
	mu.Lock()
	defer mu.Unlock()
	if midDownload == 0 {
		t.Fatalf("none of %d Progress calls came during the download: the test shows nothing", calls)
	}
	if elsewhere > 0 {
		t.Fatalf("%d of %d Progress calls ran on a goroutine other than the one syncing (e.g. %+v); Config.Progress says it runs on the syncing goroutine", elsewhere, calls, example)
	}
}
