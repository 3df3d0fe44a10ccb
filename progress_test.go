package drivesync

import (
	"context"
	"fmt"
	"io"
	"strings"
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
// against their totals and the records it applies, its own and those
// received, starting and ending each step, and never more than about 20
// times a second.
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
	if ap := last["apply"]; ap.Records != r.ChangesReceived+50 || r.ChangesReceived != 120 || ap.TotalRecords != ap.Records {
		t.Fatalf("apply ended at %+v, report %d received, want the 50 changes of its own too", ap, r.ChangesReceived)
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

// ProgressSteps checks the updates one sync gave Config.Progress and
// returns the first update of each step and the last. A step says from
// its first update what its files, bytes and records move to, or 0 for a
// total it does not know yet; a known total never changes and an unknown
// one is told only by the step's last update, where every count has
// reached its total. No count goes back or past its total, and nothing
// is negative. A step comes once, but for a download that starts over
// from 0 right after one that ended (a snapshot's, then the files').
func ProgressSteps(t testing.TB, updates []Progress) (first, last map[string]Progress) {
	t.Helper()
	type measure struct {
		name        string
		done, total func(Progress) int64
	}
	measures := []measure{
		{"files", func(p Progress) int64 { return int64(p.Done) }, func(p Progress) int64 { return int64(p.Total) }},
		{"bytes", func(p Progress) int64 { return p.Bytes }, func(p Progress) int64 { return p.TotalBytes }},
		{"records", func(p Progress) int64 { return int64(p.Records) }, func(p Progress) int64 { return int64(p.TotalRecords) }},
	}
	first, last = map[string]Progress{}, map[string]Progress{}
	for start := 0; start < len(updates); {
		step := updates[start].Step
		end := start + 1
		for end < len(updates) && updates[end].Step == step && !(step == "download" && startsOver(updates[end-1], updates[end])) {
			end++
		}
		if _, again := first[step]; !again {
			first[step] = updates[start]
		} else if updates[start-1].Step != step {
			t.Fatalf("step %s came again after %s (updates %+v)", step, updates[start-1].Step, updates)
		}
		run := updates[start:end]
		last[step] = run[len(run)-1]
		for k, p := range run {
			for _, m := range measures {
				done, total, told := m.done(p), m.total(p), m.total(run[0])
				switch {
				case done < 0 || total < 0:
					t.Fatalf("%s: %s %d of %d in %+v: negative", step, m.name, done, total, p)
				case k == 0 && done != 0:
					t.Fatalf("%s starts with %d %s moved: %+v", step, done, m.name, p)
				case told != 0 && total != told:
					t.Fatalf("%s: the total of %s went from %d to %d: %+v", step, m.name, told, total, p)
				case told == 0 && total != 0 && k < len(run)-1:
					t.Fatalf("%s: the total of %s, unknown at the start, is %d before the step's last update: %+v", step, m.name, total, p)
				case total > 0 && done > total:
					t.Fatalf("%s: %d %s, past the total %d: %+v", step, done, m.name, total, p)
				case k > 0 && done < m.done(run[k-1]):
					t.Fatalf("%s went back: %+v after %+v", step, p, run[k-1])
				case k == len(run)-1 && done != total:
					t.Fatalf("%s ended with %d of %d %s: %+v", step, done, total, m.name, p)
				}
			}
		}
		start = end
	}
	return first, last
}

// startsOver reports whether p, after prev of the same step, begins a run
// of that step again: nothing moved, where prev had moved something.
func startsOver(prev, p Progress) bool {
	return p.Done == 0 && p.Bytes == 0 && p.Records == 0 && (prev.Done > 0 || prev.Bytes > 0 || prev.Records > 0)
}

// TestProgressTotals: a device that receives a few thousand records and
// sends its own knows, from the first update of each step, how far the
// step goes: the apply step the changes it applies, its own and those
// received, the download the files and bytes it reads, the upload the
// files, bytes and changes it sends. Records move toward the apply's
// total as they are applied, and every count reaches its total at the
// step's last update. A new device that starts from a snapshot downloads
// it in a step of its own, with its size told first. Bytes count what
// the remote holds, which its listing measures: an encrypted store's
// sealed files.
func TestProgressTotals(t *testing.T) {
	t.Run("files", func(t *testing.T) { testProgressTotals(t, false, nil) })
	t.Run("snapshot", func(t *testing.T) { testProgressTotals(t, true, nil) })
	t.Run("encrypted", func(t *testing.T) { testProgressTotals(t, false, Passphrase("progress")) })
}

func testProgressTotals(t *testing.T, snapshot bool, key Key) {
	folder, err := NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	device := func(name string) *device {
		if key != nil {
			return secretDevice(t, name, folder, key)
		}
		return newDevice(t, name, folder)
	}
	a := device("dev-a")
	const received, own = 3000, 200
	tx, err := a.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for i := range received {
		if _, err := tx.Exec(`INSERT INTO notes (id, content) VALUES (?, jsonb(?))`, fmt.Sprint("a", i), fmt.Sprintf(`{"v":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	up := a.sync().Uploaded
	if !snapshot {
		// A file the download rejects, read in part: the bar moves
		// past it all the same.
		bad := strings.Replace(up, "_dev-a.", "_dev-x.", 1)
		if err := folder.Create(context.Background(), bad, strings.NewReader(strings.Repeat("not a patch file ", 500))); err != nil {
			t.Fatal(err)
		}
	}
	if snapshot {
		if r, err := a.eng.Snapshot(context.Background()); err != nil || r.Snapshot == "" {
			t.Fatalf("a's snapshot: %+v, %v", r, err)
		}
	}
	b := device("dev-b")
	for i := range own {
		b.put(fmt.Sprint("b", i), fmt.Sprintf(`{"v":%d}`, i))
	}
	// Every update, also those the rate limit keeps from Progress.
	var all, given []Progress
	hook := meterHook
	meterHook = func(e *Engine) {
		if hook != nil {
			hook(e)
		}
		if e == b.eng {
			all = append(all, e.meter.p)
		}
	}
	defer func() { meterHook = hook }()
	b.eng.cfg.Progress = func(p Progress) { given = append(given, p) }
	r := b.sync()
	rejected := 1
	if snapshot {
		rejected = 0
	}
	if r.ChangesReceived < received || r.ChangesSent != own || len(r.Rejected) != rejected {
		t.Fatalf("b received %d changes and sent %d, rejected %v; want %d and %d", r.ChangesReceived, r.ChangesSent, r.Rejected, received, own)
	}
	ProgressSteps(t, all)
	first, _ := ProgressSteps(t, given)
	if ap := first["apply"]; ap.TotalRecords != own+r.ChangesReceived {
		t.Errorf("apply starts at %+v, want a total of %d records (%d own, %d received)", ap, own+r.ChangesReceived, own, r.ChangesReceived)
	}
	if d := first["download"]; d.Total == 0 || d.TotalBytes == 0 {
		t.Errorf("download starts at %+v, want its files and bytes", d)
	}
	if u := first["upload"]; u.Total == 0 || u.TotalBytes == 0 || u.TotalRecords != own {
		t.Errorf("upload starts at %+v, want its files, bytes and %d changes", u, own)
	}
	mid := 0
	for _, p := range all {
		if p.Step == "apply" && p.Records > 0 && p.Records < p.TotalRecords {
			mid++
		}
	}
	if mid < 10 {
		t.Errorf("%d updates moved the apply's records between 0 and the total, want a bar that moves as records are applied", mid)
	}
}
