package drivesync_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/remotetest"
)

func TestMemoryRemote(t *testing.T) {
	remotetest.Run(t, func(t *testing.T) drivesync.Remote {
		return drivesync.NewMemoryRemote()
	})
}

func TestMemoryRemoteZeroValue(t *testing.T) {
	remotetest.Run(t, func(t *testing.T) drivesync.Remote {
		return new(drivesync.MemoryRemote)
	})
}

func TestMemoryRemoteClock(t *testing.T) {
	ctx := context.Background()
	m := drivesync.NewMemoryRemote()
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	m.SetClock(func() time.Time { return now })

	if got, err := m.Now(ctx); err != nil || !got.Equal(now) {
		t.Errorf("Now: got %v, %v, want %v", got, err, now)
	}
	for _, name := range []string{"early", "late"} {
		if err := m.Create(ctx, name, bytes.NewReader(nil)); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Hour)
	}
	// "early" was stamped 10:00 and "late" 11:00; since is inclusive.
	for _, tt := range []struct {
		since time.Time
		want  []string
	}{
		{time.Time{}, []string{"early", "late"}},
		{time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), []string{"early", "late"}},
		{time.Date(2026, 11, 22, 10, 30, 0, 0, time.UTC), []string{"late"}},
		{time.Date(2026, 11, 22, 11, 0, 0, 0, time.UTC), []string{"late"}},
		{time.Date(2026, 11, 22, 11, 0, 0, 1, time.UTC), nil},
	} {
		files, err := m.List(ctx, tt.since)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range files {
			got = append(got, f.Name)
		}
		slices.Sort(got)
		if !slices.Equal(got, tt.want) {
			t.Errorf("List(%v): got %v, want %v", tt.since, got, tt.want)
		}
	}

	m.SetClock(nil)
	if got, err := m.Now(ctx); err != nil || time.Since(got).Abs() > time.Minute {
		t.Errorf("Now after SetClock(nil): got %v, %v, want about %v", got, err, time.Now())
	}
}

func TestMemoryRemoteStoresACopy(t *testing.T) {
	ctx := context.Background()
	m := drivesync.NewMemoryRemote()
	content := []byte("original")
	if err := m.Create(ctx, "a", bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	copy(content, "CHANGED!")
	rc, err := m.Open(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var got bytes.Buffer
	got.ReadFrom(rc)
	if want := "original"; got.String() != want {
		t.Errorf("Open after changing the caller's buffer: got %q, want %q", got.String(), want)
	}
}
