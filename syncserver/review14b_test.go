package syncserver

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestReview14bSweepTakesLiveUpload: an upload's chunks are stamped with
// the time its PUT began (files.go upload: created_us = now for every
// chunk), and sweepChunks deletes chunks older than abandonedAfter (24 h)
// that no file names yet. An upload still under way after 24 h (16 GiB,
// the default MaxFileBytes, at under 1.5 Mbit/s) is no file's until it
// ends: another PUT's sweep (here on a second server process, as behind a
// load balancer) deletes its chunks, and the upload then completes as a
// file that is listed at its full size but whose chunks are gone: every
// GET of it ends short.
//
// Chunks are now stamped as they arrive, and the sweep takes only uploads
// idle for 24 hours; an upload that resumes after its chunks were swept
// is refused, never made a file.
func TestReview14bSweepTakesLiveUpload(t *testing.T) {
	spec := "sqlite:" + filepath.Join(t.TempDir(), "s.db")
	var clock atomic.Int64
	clock.Store(time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC).UnixMicro())
	now := func(o *Options) { o.Now = func() time.Time { return time.UnixMicro(clock.Load()) } }
	// Straight to the handlers: the document's checker reads bodies whole.
	direct := func() (*httptest.Server, *Store) {
		st := openStore(t, spec)
		opts := Options{Tokens: map[string]string{aliceToken: "alice"}}
		now(&opts)
		srv := httptest.NewServer(NewHandler(st, opts))
		t.Cleanup(srv.Close)
		return srv, st
	}
	one, st := direct()
	content := make([]byte, 2*chunkBytes+1000)
	for i := range content {
		content[i] = byte(i * 13)
	}
	stored := func(want int) {
		t.Helper()
		for range 500 {
			var n int
			if err := st.read.QueryRow(`SELECT count(*) FROM sync_server_chunks`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == want {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("chunk %d was not stored", want)
	}
	put := func(name string) (*io.PipeWriter, chan response) {
		pr, pw := io.Pipe()
		done := make(chan response, 1)
		go func() {
			req, _ := http.NewRequest("PUT", one.URL+"/sync/file?store=s&name="+name, pr)
			req.Header.Set("Authorization", "Bearer "+aliceToken)
			req.ContentLength = int64(len(content))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- response{status: -1, body: []byte(err.Error())}
				return
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			done <- response{status: res.StatusCode, body: b}
		}()
		return pw, done
	}
	// An upload that takes 26 hours, a chunk every 13: each other
	// process's sweep (one each) finds it under way.
	pw, done := put("big")
	pw.Write(content[:chunkBytes+10])
	stored(1)
	clock.Add((13 * time.Hour).Microseconds())
	two, _ := direct()
	if r := do(t, "PUT", two.URL+"/sync/file?store=s&name=small", aliceToken, "x"); r.status != 200 {
		t.Fatalf("small PUT: %d %s", r.status, r.body)
	}
	pw.Write(content[chunkBytes+10 : 2*chunkBytes+10])
	stored(3) // with the small file's
	clock.Add((13 * time.Hour).Microseconds())
	three, _ := direct()
	if r := do(t, "PUT", three.URL+"/sync/file?store=s&name=small2", aliceToken, "y"); r.status != 200 {
		t.Fatalf("small PUT: %d %s", r.status, r.body)
	}
	pw.Write(content[2*chunkBytes+10:])
	pw.Close()
	if r := <-done; r.status != 200 {
		t.Fatalf("big PUT: %d %s", r.status, r.body)
	}
	req, _ := http.NewRequest("GET", one.URL+"/sync/file?store=s&name=big", nil)
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || err != nil || !bytes.Equal(got, content) {
		t.Fatalf("the file, accepted with 200, reads back as %d, %d of %d bytes, err %v", res.StatusCode, len(got), len(content), err)
	}

	// An upload idle for 25 hours between two chunks is abandoned: its
	// chunks are swept, and it is refused when it resumes, not made a
	// file that reads short.
	pw, done = put("idle")
	pw.Write(content[:chunkBytes+10])
	stored(6) // big's 3, the two small files', idle's first
	clock.Add((25 * time.Hour).Microseconds())
	four, _ := direct()
	if r := do(t, "PUT", four.URL+"/sync/file?store=s&name=small3", aliceToken, "z"); r.status != 200 {
		t.Fatalf("small PUT: %d %s", r.status, r.body)
	}
	pw.Write(content[chunkBytes+10:])
	pw.Close()
	if r := <-done; r.status == 200 || !strings.Contains(string(r.body), "idle") {
		t.Fatalf("an upload whose chunks were swept: %d %s, want it refused, saying it was idle", r.status, r.body)
	}
	if r := do(t, "GET", one.URL+"/sync/file?store=s&name=idle", aliceToken, ""); r.status != 404 {
		t.Fatalf("the refused upload: GET %d, want 404", r.status)
	}
}
