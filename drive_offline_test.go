package drivesync

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/api/drive/v3"
	"google.golang.org/api/option"

	"github.com/drivesync/drivesync/internal/drivefake"
)

// closedAddr returns an address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// unpluggable sends requests to the fake Drive, or, while unplugged, to
// a port nothing listens on: a laptop that lost its network.
type unpluggable struct {
	mu        sync.Mutex
	unplugged bool
	online    http.RoundTripper
	dead      string
}

func (u *unpluggable) set(unplugged bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.unplugged = unplugged
}

func (u *unpluggable) RoundTrip(req *http.Request) (*http.Response, error) {
	u.mu.Lock()
	unplugged := u.unplugged
	u.mu.Unlock()
	if !unplugged {
		return u.online.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	req.URL.Host = u.dead
	return http.DefaultTransport.RoundTrip(req)
}

// TestDriveOffline: an offline device builds its Drive remote, opens the
// engine and uses its own data; only Sync needs Drive, fails with a clear
// ErrRemote, and works once the network is back.
func TestDriveOffline(t *testing.T) {
	ctx := context.Background()
	for _, folder := range []string{"", "My Notes"} {
		t.Run("folder="+folder, func(t *testing.T) {
			srv := drivefake.New(t)
			link := &unpluggable{unplugged: true, online: srv.Client().Transport, dead: closedAddr(t)}
			svc, err := drive.NewService(ctx, option.WithEndpoint(srv.URL+"/drive/v3/"),
				option.WithHTTPClient(&http.Client{Transport: link}), option.WithoutAuthentication())
			if err != nil {
				t.Fatal(err)
			}
			r, err := NewDriveRemote(ctx, svc, DriveOptions{Folder: folder, MinSleep: time.Millisecond, MaxSleep: 5 * time.Millisecond, MaxAttempts: 2})
			if err != nil {
				t.Fatalf("NewDriveRemote offline: %v", err)
			}
			if n := srv.Requests(); n != 0 {
				t.Fatalf("NewDriveRemote made %d requests", n)
			}
			a := newDevice(t, "dev-a", r)
			a.put("n", `{"v":"offline"}`)
			if got := a.get("n"); got != `{"v":"offline"}` {
				t.Fatalf("got %q", got)
			}
			_, err = a.eng.Sync(ctx)
			if !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "cannot reach Google Drive") {
				t.Fatalf("offline sync: %v; want ErrRemote saying Drive cannot be reached", err)
			}
			if _, err := r.List(ctx, time.Time{}); err == nil || !strings.Contains(err.Error(), "cannot reach Google Drive") {
				t.Fatalf("offline List: %v; want an error saying Drive cannot be reached", err)
			}

			link.set(false)
			if rep := a.sync(); rep.Uploaded == "" {
				t.Fatalf("online sync: %+v, want the offline change sent", rep)
			}
			rb, err := NewDriveRemote(ctx, srv.Service(ctx, t), DriveOptions{Folder: folder, MinSleep: time.Millisecond, MaxSleep: 5 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			b := newDevice(t, "dev-b", rb)
			b.sync()
			if got := b.get("n"); got != `{"v":"offline"}` {
				t.Fatalf("the other device got %q", got)
			}
		})
	}
}
