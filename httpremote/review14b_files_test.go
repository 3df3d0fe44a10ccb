package httpremote_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/httpremote"
	"github.com/drivesync/drivesync/syncserver"
)

// gatedPuts holds the body of the next PUT /sync/file, once armed, until
// released: the server has begun the request (and read its clock) but
// the upload has not finished, as with a large file on a slow link.
type gatedPuts struct {
	h       http.Handler
	armed   atomic.Bool
	reading chan string   // the name of the held PUT, once the server reads its body
	release chan struct{} // closed to let it go on
}

func (g *gatedPuts) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPut && r.URL.Path == "/sync/file" && g.armed.CompareAndSwap(true, false) {
		r.Body = &gatedBody{ReadCloser: r.Body, g: g, name: r.URL.Query().Get("name")}
	}
	g.h.ServeHTTP(w, r)
}

type gatedBody struct {
	io.ReadCloser
	g    *gatedPuts
	name string
	once sync.Once
}

func (b *gatedBody) Read(p []byte) (int, error) {
	b.once.Do(func() {
		b.g.reading <- b.name
		<-b.g.release
	})
	return b.ReadCloser.Read(p)
}

// TestReview14bSlowUploadNeverListed: the server stamps a file's
// created_us with the time its PUT began (files.go putFile: now is read
// before the upload), not the time the file became visible. A device that
// listed while the upload was under way keeps that listing's server_time
// as its cursor and next lists from it less ListOverlap (15 min): a file
// whose upload took longer than that is never listed by that device, so
// it never applies the patch file in it.
func TestReview14bSlowUploadNeverListed(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC).UnixMicro())
	st, err := syncserver.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := syncserver.NewHandler(st, syncserver.Options{Tokens: map[string]string{aliceToken: "alice"},
		Now: func() time.Time { return time.UnixMicro(clock.Add(1000)) }})
	g := &gatedPuts{h: h, reading: make(chan string, 1), release: make(chan struct{})}
	ts := httptest.NewServer(g)
	t.Cleanup(ts.Close)

	key := x25519Key(t)
	cfg := func(c *drivesync.Config) { c.Encryption = key }
	a := openDevice(t, "dev-a", httpremote.New(ts.URL, aliceToken, httpremote.Options{Store: "enc"}), cfg)
	b := openDevice(t, "dev-b", httpremote.New(ts.URL, aliceToken, httpremote.Options{Store: "enc"}), cfg)
	a.exec(`INSERT INTO notes VALUES ('n1', '{"t":1}')`)
	a.sync()
	b.sync()

	// a's next patch file uploads slowly: 20 minutes.
	a.exec(`INSERT INTO notes VALUES ('n2', '{"t":2}')`)
	g.armed.Store(true)
	done := make(chan error, 1)
	go func() { _, err := a.eng.Sync(context.Background()); done <- err }()
	name := <-g.reading
	t.Logf("held upload of %s", name)
	clock.Add((20 * time.Minute).Microseconds())
	b.sync() // lists while the upload is under way
	close(g.release)
	if err := <-done; err != nil {
		t.Fatalf("a's sync: %v", err)
	}
	clock.Add(time.Minute.Microseconds())
	for range 3 {
		b.sync()
		clock.Add(time.Minute.Microseconds())
	}
	if got := b.dump(); !strings.Contains(got, "n2") {
		t.Fatalf("b never got a's n2, whose file %s took 20 min to upload (b synced during the upload and 3 times after): b shows\n%sa shows\n%s", name, got, a.dump())
	}
}
