package s3remote

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/internal/miniotest"
)

// proxy is a TCP proxy on loopback in front of the S3 server that slows
// or cuts connections, as a bad network does.
type proxy struct {
	l      net.Listener
	target string

	mu       sync.Mutex
	conns    map[net.Conn]bool
	cuts     int   // connections still to cut
	cutAfter int64 // bytes of a request let through before a cut
	delay    time.Duration
}

func newProxy(t *testing.T, target string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() {
		l.Close()
		p.set(0, 0, 0)
	})
	go p.serve()
	return p
}

func (p *proxy) endpoint() string { return "http://" + p.l.Addr().String() }

// set makes the next cuts connections end after cutAfter bytes from the
// client, and delays every chunk either way by delay. It closes the
// connections open now, so that the client's next request takes a new one.
func (p *proxy) set(cuts int, cutAfter int64, delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts, p.cutAfter, p.delay = cuts, cutAfter, delay
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *proxy) handle(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	limit := int64(-1)
	if p.cuts > 0 {
		p.cuts--
		limit = p.cutAfter
	}
	p.mu.Unlock()
	done := func() {
		c.Close()
		up.Close()
		p.mu.Lock()
		delete(p.conns, c)
		delete(p.conns, up)
		p.mu.Unlock()
	}
	go func() {
		p.copy(c, up, -1)
		done()
	}()
	p.copy(up, c, limit)
	done()
}

// copy forwards src to dst, at most limit bytes (unless limit < 0).
func (p *proxy) copy(dst, src net.Conn, limit int64) {
	buf := make([]byte, 16<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			delay := p.delay
			p.mu.Unlock()
			time.Sleep(delay)
			if limit >= 0 && int64(n) > limit {
				n = int(limit)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if limit >= 0 {
				if limit -= int64(n); limit == 0 {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// Connections cut mid-upload are retried; cut past the retries, the sync
// fails with ErrRemote and keeps its change; slowed past the app's
// deadline, the sync fails with the context's error. Every time, the next
// sync on a good network delivers the change.
func TestNetworkCutAndSlowed(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	p := newProxy(t, server.Endpoint[len("http://"):])
	opts := Options{MinSleep: time.Millisecond, MaxSleep: 5 * time.Millisecond, MaxAttempts: 4}
	const schema = `CREATE TABLE items (id TEXT PRIMARY KEY, data BLOB)`
	a, ea := openDevice(t, miniotest.ClientAt(p.endpoint(), nil), bucket, opts, "dev-a", schema)
	b, eb := openDevice(t, newClient(), bucket, opts, "dev-b", schema)
	write := func(id string) {
		t.Helper()
		blob := make([]byte, 256<<10) // random: the patch file stays as large
		rand.Read(blob)
		if _, err := a.Exec(`INSERT INTO items VALUES (?, ?)`, id, blob); err != nil {
			t.Fatal(err)
		}
	}
	arrives := func(id string) {
		t.Helper()
		p.set(0, 0, 0)
		if _, err := ea.Sync(ctx); err != nil {
			t.Fatalf("sync on a good network: %v", err)
		}
		if _, err := eb.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := b.QueryRow(`SELECT length(data) FROM items WHERE id = ?`, id).Scan(&n); err != nil || n != 256<<10 {
			t.Errorf("%s on the other device: %d bytes (%v), want %d", id, n, err, 256<<10)
		}
	}

	// Two connections cut 64 KiB into the request: within the retries.
	write("cut twice")
	p.set(2, 64<<10, 0)
	if _, err := ea.Sync(ctx); err != nil {
		t.Errorf("sync with two connections cut: %v, want it retried to success", err)
	}
	p.mu.Lock()
	if p.cuts != 0 {
		t.Errorf("%d of the 2 cuts left: the sync did not meet them, and the test did not test", p.cuts)
	}
	p.mu.Unlock()
	arrives("cut twice")

	// Every connection cut: the retries run out.
	write("cut always")
	p.set(1000, 64<<10, 0)
	if _, err := ea.Sync(ctx); !errors.Is(err, drivesync.ErrRemote) {
		t.Errorf("sync with every connection cut: %v, want ErrRemote", err)
	}
	arrives("cut always")

	// Slowed past the app's deadline.
	write("slowed")
	p.set(0, 0, 50*time.Millisecond)
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := ea.Sync(dctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("sync slowed past its deadline: %v, want context.DeadlineExceeded", err)
	}
	arrives("slowed")

	// Slowed within it: the sync completes.
	write("slow")
	p.set(0, 0, 2*time.Millisecond)
	if _, err := ea.Sync(ctx); err != nil {
		t.Errorf("slowed sync: %v", err)
	}
	arrives("slow")
}
