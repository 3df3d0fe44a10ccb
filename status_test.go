package drivesync

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func (d *device) status() Status {
	d.t.Helper()
	st, err := d.eng.Status(context.Background())
	if err != nil {
		d.t.Fatal(err)
	}
	return st
}

// downRemote fails every request while fail is set.
type downRemote struct {
	Remote
	fail bool
}

func (f *downRemote) Identity(ctx context.Context) (string, error) {
	return f.Remote.(IdentifiedRemote).Identity(ctx)
}

func (f *downRemote) Now(ctx context.Context) (time.Time, error) {
	if f.fail {
		return time.Time{}, errors.New("injected: the network is down")
	}
	return f.Remote.Now(ctx)
}

// TestStatus: what Status says before, after, and across a failed sync,
// an upload left in the outbox, and a remote whose clock is off.
func TestStatus(t *testing.T) {
	folder, err := NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	remote := &downRemote{Remote: folder}
	a := newDevice(t, "dev-a", remote)
	st := a.status()
	if st.DeviceID != "dev-a" || st.Pending != 0 || !st.LastSync.IsZero() || st.Store != "" || st.RemoteBytes != -1 || st.ClockKnown || st.Encrypted {
		t.Fatalf("before any sync: %+v", st)
	}
	a.put("n1", `{"v":1}`)
	a.put("n2", `{"v":1}`)
	if st := a.status(); st.Pending != 2 {
		t.Fatalf("pending %d, want 2", st.Pending)
	}
	start := time.Now()
	a.sync()
	st = a.status()
	if st.Pending != 0 || st.LastSync.Before(start) || st.LastSuccess != st.LastSync || st.LastError != "" || st.Store == "" || st.Store != a.store() ||
		!strings.Contains(st.Remote, "folder") || st.RemoteBytes <= 0 || !st.ClockKnown || st.ClockWarning != "" || st.OutboxWaiting {
		t.Fatalf("after a sync: %+v", st)
	}

	// A failed sync: its error, and the last success kept.
	ok := st.LastSuccess
	remote.fail = true
	a.put("n3", `{"v":1}`)
	if _, err := a.eng.Sync(context.Background()); err == nil {
		t.Fatal("the sync did not fail")
	}
	st = a.status()
	if !strings.Contains(st.LastError, "network is down") || !st.LastSuccess.Equal(ok) || !st.LastSync.After(ok) || st.Pending != 1 {
		t.Fatalf("after a failed sync: %+v", st)
	}
	remote.fail = false

	// An upload whose sync did not commit waits in the outbox.
	hooks(a.eng).step = func(point string) error {
		if point == "uploaded" {
			return errors.New("crash")
		}
		return nil
	}
	a.eng.Sync(context.Background())
	hooks(a.eng).step = nil
	if st := a.status(); !st.OutboxWaiting {
		t.Fatalf("after a crash past the upload: %+v", st)
	}
	a.sync()
	if st := a.status(); st.OutboxWaiting || st.Pending != 0 || st.LastError != "" {
		t.Fatalf("after the recovery: %+v", st)
	}

	// RemoteSize asks the remote, and Status shows it from then on.
	n, err := a.eng.RemoteSize(context.Background())
	if err != nil || n <= 0 {
		t.Fatalf("RemoteSize: %d, %v", n, err)
	}
	a.put("big", fmt.Sprintf(`{"v":%q}`, strings.Repeat("x", 5000)))
	if st := a.status(); st.RemoteBytes != n {
		t.Fatalf("Status says %d bytes, RemoteSize %d", st.RemoteBytes, n)
	}

	// A remote whose clock is months off this device's.
	mem, _ := clockedRemote()
	b := newDevice(t, "dev-b", mem)
	b.sync()
	if st := b.status(); !st.ClockKnown || st.ClockOffset > -time.Hour || !strings.Contains(st.ClockWarning, "ahead of the remote's") {
		t.Fatalf("a remote in the past: %+v", st)
	}
}
