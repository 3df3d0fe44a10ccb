package drivesync

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"
)

// slowRemote takes delay to open each file.
type slowRemote struct {
	Remote
	delay time.Duration
}

func (s *slowRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	time.Sleep(s.delay)
	return s.Remote.Open(ctx, name)
}

// TestProgress: a sync reports the bytes of its downloads and uploads
// against their totals and the records it applies, starting and ending
// each step, and never more than about 20 times a second.
func TestProgress(t *testing.T) {
	folder, err := NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := newDevice(t, "dev-a", folder)
	for i := range 120 {
		a.put(fmt.Sprint("n", i), fmt.Sprintf(`{"v":%d,"body":"%0200d"}`, i, i))
		a.sync()
	}
	b := newDevice(t, "dev-b", &slowRemote{Remote: folder, delay: 15 * time.Millisecond})
	for i := range 50 {
		b.put(fmt.Sprint("b", i), fmt.Sprintf(`{"v":%d}`, i))
	}
	var events []Progress
	var at []time.Time
	b.eng.cfg.Progress = func(p Progress) {
		events = append(events, p)
		at = append(at, time.Now())
	}
	r := b.sync()
	last := map[string]Progress{}
	for _, p := range events {
		if prev, ok := last[p.Step]; ok && (p.Bytes < prev.Bytes || p.Done < prev.Done || p.Records < prev.Records) {
			t.Fatalf("%s went back: %+v after %+v", p.Step, p, prev)
		}
		last[p.Step] = p
	}
	if d := last["download"]; d.Done != 120 || d.Total != 120 || d.TotalBytes == 0 || d.Bytes != d.TotalBytes {
		t.Fatalf("download ended at %+v", d)
	}
	if u := last["upload"]; u.Done != 1 || u.TotalBytes == 0 || u.Bytes != u.TotalBytes {
		t.Fatalf("upload ended at %+v", u)
	}
	if ap := last["apply"]; ap.Records != r.ChangesReceived || ap.Records != 120 {
		t.Fatalf("apply ended at %+v, report %d", ap, r.ChangesReceived)
	}
	mid := 0
	for _, p := range events {
		if p.Step == "download" && p.Done > 0 && p.Done < p.Total {
			mid++
		}
	}
	if took := at[len(at)-1].Sub(at[0]); took < 1500*time.Millisecond || mid < 10 {
		t.Fatalf("the sync took %v with %d updates in the download: the test needs a longer one", took, mid)
	}
	for i := range at {
		n := 0
		for j := i; j < len(at) && at[j].Sub(at[i]) < time.Second; j++ {
			n++
		}
		if n > 30 { // 20 a second, a burst of 5, and the steps' starts and ends
			t.Fatalf("%d updates within a second from update %d", n, i)
		}
	}
}
