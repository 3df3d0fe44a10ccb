package drivesync

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/drivesync/drivesync/internal/drivefake"
)

// The reliability harness: random multi-device schedules of app writes
// and syncs over one remote, with injected remote faults, crashes at every
// step boundary of a sync, and writes during syncs. After each schedule
// every device syncs to quiescence without faults, and the harness checks
// that all devices are byte-identical, nothing is left pending, SQLite's
// integrity check passes, and no update was lost: every field whose last
// write was made by a device that had seen the previous value holds that
// write's value.
//
// A failing schedule prints a rapid seed; replay it with
//
//	go test -run 'TestSchedules/<subtest>' -rapid.seed=<seed> .

var (
	schedules      = flag.Int("schedules", 0, "randomized schedules for TestSchedules (0: 2000, or 200 with -race)")
	driveSchedules = flag.Int("drive-schedules", 0, "randomized schedules for TestSchedulesOverDrive (0: 200, or 100 with -race)")
)

// counters count, across a run, each injected fault and crash point.
var counters sync.Map // string -> *atomic.Int64

func count(kind string) {
	c, _ := counters.LoadOrStore(kind, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
}

func TestMain(m *testing.M) {
	code := m.Run()
	var lines []string
	counters.Range(func(k, v any) bool {
		lines = append(lines, fmt.Sprintf("  %-26s %d", k, v.(*atomic.Int64).Load()))
		return true
	})
	if len(lines) > 0 {
		sort.Strings(lines)
		fmt.Fprintf(os.Stderr, "reliability harness counts:\n%s\n", strings.Join(lines, "\n"))
	}
	os.Exit(code)
}

func TestSchedules(t *testing.T) {
	runSchedules(t, *schedules, 2000, 200, false)
}

// TestSchedulesOverDrive runs the schedules with every device on its own
// DriveRemote, over one fake Drive server that also fails HTTP requests
// (rate limits, server errors, connections reset mid-body).
func TestSchedulesOverDrive(t *testing.T) {
	runSchedules(t, *driveSchedules, 200, 100, true)
}

// runSchedules runs n schedules (rounded up to whole batches of rapid's
// 100 checks), batches in parallel.
func runSchedules(t *testing.T, n, full, underRace int, overDrive bool) {
	if n == 0 {
		n = full
		if raceEnabled {
			n = underRace // the race detector slows SQLite ~10x; CI runs the full count without it
		}
	}
	for batch := 0; batch*100 < n; batch++ {
		t.Run(fmt.Sprint("batch", batch), func(t *testing.T) {
			t.Parallel()
			rapid.Check(t, func(rt *rapid.T) { runSchedule(t, rt, overDrive) })
		})
	}
}

// errCrash is panicked by a crash point: the process "dies" there.
type errCrash struct{ point string }

// harnessRemote is one device's view of the shared remote: it injects
// faults, hides new files for a few listings, and may run on a skewed
// clock (then, like FolderRemote, it lists everything).
type harnessRemote struct {
	w      *world
	base   Remote // the shared MemoryRemote, or this device's DriveRemote
	device string
	skew   time.Duration
}

type world struct {
	mem    *MemoryRemote
	drive  *drivefake.Server // set when the devices use Drive
	rng    *rand.Rand
	mu     sync.Mutex
	faults bool
	folder bool // devices' clocks disagree; List ignores since
	// hidden[device][name] is how many more listings the file stays
	// invisible to that device.
	hidden map[string]map[string]int
	devs   []string
}

func (w *world) roll(kind string, p float64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.faults && w.rng.Float64() < p {
		count("fault " + kind)
		return true
	}
	return false
}

var errFault = errors.New("injected remote fault")

func (r *harnessRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	if r.w.roll("list fails", 0.05) {
		return nil, errFault
	}
	if r.w.folder {
		since = time.Time{}
	}
	files, err := r.base.List(ctx, since)
	if err != nil {
		return nil, err
	}
	w := r.w
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []RemoteFile
	for _, f := range files {
		if k := w.hidden[r.device][f.Name]; k > 0 {
			w.hidden[r.device][f.Name] = k - 1
			count("fault listing lags")
			continue
		}
		out = append(out, f)
		if w.faults && w.rng.Float64() < 0.05 {
			out = append(out, f)
			count("fault listed twice")
		}
	}
	if w.faults && w.rng.Float64() < 0.3 {
		w.rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		count("fault listing out of order")
	}
	return out, nil
}

func (r *harnessRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if r.w.roll("open fails", 0.05) {
		return nil, errFault
	}
	return r.base.Open(ctx, name)
}

func (r *harnessRemote) Create(ctx context.Context, name string, content io.Reader) error {
	if r.w.roll("create fails before", 0.05) {
		return errFault
	}
	if err := r.base.Create(ctx, name, content); err != nil {
		return err
	}
	if r.w.roll("create fails after", 0.05) {
		return errFault // stored, but the device hears a failure
	}
	w := r.w
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range w.devs {
		if d != r.device && w.faults && w.rng.Float64() < 0.3 {
			w.hidden[d][name] = 1 + w.rng.IntN(3)
		}
	}
	return nil
}

func (r *harnessRemote) Delete(ctx context.Context, name string) error {
	if r.w.roll("delete fails before", 0.05) {
		return errFault
	}
	if err := r.base.Delete(ctx, name); err != nil {
		return err
	}
	if r.w.roll("delete fails after", 0.05) {
		return errFault
	}
	return nil
}

func (r *harnessRemote) Now(ctx context.Context) (time.Time, error) {
	now, err := r.base.Now(ctx)
	return now.Add(r.skew), err
}

// hdevice is one simulated device of a schedule.
type hdevice struct {
	name string
	path string
	db   *sql.DB
	eng  *Engine
	cfg  Config
	seq  int
	seen map[string]bool // every value that has appeared in this device's rows
}

// observe adds the values in the device's rows to what it has seen.
func (d *hdevice) observe(rt *rapid.T) {
	for _, id := range harnessRecords {
		vals, _ := d.local(rt, id)
		for _, v := range vals {
			if v != "" {
				d.seen[v] = true
			}
		}
	}
}

func (d *hdevice) open(rt *rapid.T) {
	db, err := sql.Open("sqlite", testDSN(d.path))
	if err != nil {
		rt.Fatal(err)
	}
	if _, err := db.Exec(notesSchema); err != nil {
		rt.Fatal(err)
	}
	eng, err := Open(context.Background(), db, d.cfg)
	if err != nil {
		rt.Fatalf("%s: Open: %v", d.name, err)
	}
	d.db, d.eng = db, eng
}

// crash abandons the engine and the database as a dying process would,
// and opens them again.
func (d *hdevice) crash(rt *rapid.T) {
	d.db.Close()
	d.open(rt)
}

// driveFaults are the HTTP failures the fake Drive injects; the
// DriveRemote retries them, and a sync fails only when they outlast the
// retries.
var driveFaults = []drivefake.Fault{
	{Status: http.StatusForbidden, Reason: "userRateLimitExceeded", Times: 2},
	{Status: http.StatusTooManyRequests, RetryAfter: "0", Times: 1},
	{Status: http.StatusServiceUnavailable, Times: 5},
	{Status: http.StatusInternalServerError, Times: 1},
	{Method: "GET", PathPrefix: "/drive/v3/files/", ResetMidBody: true, Times: 1},
}

var harnessPoints = []string{"fetched", "planned", "uploaded", "applied", "committed"}

// sync runs one sync, possibly crashing at a point or letting the app
// write at one. Errors are expected while faults are on.
func (d *hdevice) sync(rt *rapid.T, crashAt, writeAt string, write func()) error {
	d.eng.testHook = func(p string) error {
		if p == writeAt {
			count("write during sync at " + p)
			write()
		}
		if p == crashAt {
			count("crash at " + p)
			panic(errCrash{p})
		}
		return nil
	}
	defer func() { d.eng.testHook = nil }()
	crashed := false
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(errCrash); !ok {
					panic(r)
				}
				crashed = true
			}
		}()
		_, err = d.eng.Sync(context.Background())
		return err
	}()
	if crashed {
		d.crash(rt)
		d.observe(rt)
		return nil
	}
	d.observe(rt)
	if err != nil && !errors.Is(err, errFault) && !errors.Is(err, ErrRemote) {
		rt.Fatalf("%s: sync failed with an error that is not an injected fault: %v", d.name, err)
	}
	return err
}

// model records, per record and member path, every write, to find lost
// updates. Values are unique per write, so a device has seen another
// device's write exactly when that value has appeared in its rows.
type model struct {
	hist map[string]map[string][]modelWrite // record -> path -> writes in order
}

type modelWrite struct {
	device string
	value  string // "" for absent
	// sawAll: when writing, the device had seen every earlier write to
	// this path by other devices, so nothing conflicts with this write.
	sawAll bool
}

var harnessRecords = []string{"r0", "r1", "r2", "r3"}
var harnessPaths = []string{"a", "b", "n.x", "n.y", "deleted_at"}

// local reads a device's value of every path of a record ("" if absent).
func (d *hdevice) local(rt *rapid.T, id string) (map[string]string, bool) {
	var content string
	err := d.db.QueryRow(`SELECT json(content) FROM notes WHERE id = ?`, id).Scan(&content)
	out := map[string]string{}
	if errors.Is(err, sql.ErrNoRows) {
		return out, false
	}
	if err != nil {
		rt.Fatal(err)
	}
	for _, p := range harnessPaths {
		var v sql.NullString
		d.db.QueryRow(`SELECT json_extract(?, ?)`, content, "$."+p).Scan(&v)
		out[p] = v.String
	}
	return out, true
}

// write performs one random app write on d and records it in m.
func (m *model) write(rt *rapid.T, d *hdevice, label string) {
	id := rapid.SampledFrom(harnessRecords).Draw(rt, label+"record")
	d.observe(rt)
	cur, exists := d.local(rt, id)
	d.seq++
	val := fmt.Sprintf("%s#%d", d.name, d.seq)
	written := map[string]string{}
	switch op := rapid.IntRange(0, 9).Draw(rt, label+"op"); {
	case op == 0 && exists: // physical delete
		if _, err := d.db.Exec(`DELETE FROM notes WHERE id = ?`, id); err != nil {
			rt.Fatal(err)
		}
		for _, p := range harnessPaths {
			written[p] = ""
		}
	case op <= 2 || !exists: // create or replace whole
		content := fmt.Sprintf(`{"a":%q,"b":%q,"n":{"x":%q}}`, val+"a", val+"b", val+"x")
		if _, err := d.db.Exec(`INSERT INTO notes (id, content) VALUES (?, jsonb(?)) ON CONFLICT (id) DO UPDATE SET content = excluded.content`, id, content); err != nil {
			rt.Fatal(err)
		}
		written = map[string]string{"a": val + "a", "b": val + "b", "n.x": val + "x", "n.y": "", "deleted_at": ""}
	default: // one field
		p := rapid.SampledFrom(harnessPaths).Draw(rt, label+"path")
		if _, err := d.db.Exec(`UPDATE notes SET content = jsonb_set(content, ?, ?) WHERE id = ?`, "$."+p, val, id); err != nil {
			rt.Fatal(err)
		}
		written[p] = val
	}
	rt.Logf("%s: write %s %v (had %v, exists %v)", d.name, id, written, cur, exists)
	if m.hist[id] == nil {
		m.hist[id] = map[string][]modelWrite{}
	}
	for p, v := range written {
		saw := true
		for _, x := range m.hist[id][p] {
			if x.device != d.name && (x.value == "" || !d.seen[x.value]) {
				saw = false // a delete leaves no value to observe: treat as unseen
			}
		}
		m.hist[id][p] = append(m.hist[id][p], modelWrite{device: d.name, value: v, sawAll: saw})
		if v != "" {
			d.seen[v] = true
		}
	}
}

func runSchedule(t *testing.T, rt *rapid.T, overDrive bool) {
	count("schedules")
	dir, err := os.MkdirTemp("", "drivesync-harness")
	if err != nil {
		rt.Fatal(err)
	}
	defer os.RemoveAll(dir)
	w := &world{
		mem:    NewMemoryRemote(),
		rng:    rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 1)),
		hidden: map[string]map[string]int{},
	}
	if overDrive {
		count("schedules over Drive")
		w.drive = drivefake.New(t) // Drive's clock is shared: no skew
	} else {
		w.folder = rapid.Bool().Draw(rt, "folder")
	}
	ndev := rapid.IntRange(2, 5).Draw(rt, "devices")
	devs := make([]*hdevice, ndev)
	for i := range devs {
		name := fmt.Sprintf("dev-%d", i)
		w.devs = append(w.devs, name)
		w.hidden[name] = map[string]int{}
		var skew time.Duration
		if w.folder {
			skew = time.Duration(rapid.IntRange(-120, 120).Draw(rt, "skew")) * time.Minute
			if skew != 0 {
				count("fault clock skew")
			}
		}
		var base Remote = w.mem
		if overDrive {
			ctx := context.Background()
			dr, err := NewDriveRemote(ctx, w.drive.Service(ctx, t), DriveOptions{MinSleep: time.Millisecond, MaxSleep: 4 * time.Millisecond, MaxAttempts: 4})
			if err != nil {
				rt.Fatal(err)
			}
			base = dr
		}
		devs[i] = &hdevice{name: name, path: filepath.Join(dir, name+".db"), seen: map[string]bool{}}
		devs[i].cfg = Config{Remote: &harnessRemote{w: w, base: base, device: name, skew: skew}, Tables: []Table{{Name: "notes"}}, DeviceID: name, TempDir: dir}
		devs[i].open(rt)
	}
	defer func() {
		for _, d := range devs {
			d.db.Close()
		}
	}()
	m := &model{hist: map[string]map[string][]modelWrite{}}
	w.faults = true
	steps := rapid.IntRange(5, 40).Draw(rt, "steps")
	for i := range steps {
		d := devs[rapid.IntRange(0, ndev-1).Draw(rt, "device")]
		label := fmt.Sprint(i)
		if w.drive != nil && w.rng.Float64() < 0.3 {
			w.drive.Fail(driveFaults[w.rng.IntN(len(driveFaults))])
			count("fault drive http")
		}
		switch rapid.IntRange(0, 9).Draw(rt, "action") {
		case 0, 1, 2, 3:
			m.write(rt, d, label)
		case 4, 5:
			rt.Logf("%s: sync -> %v", d.name, d.sync(rt, "", "", nil))
		case 6, 7:
			p := rapid.SampledFrom(harnessPoints).Draw(rt, "crash")
			rt.Logf("%s: sync, crash at %s -> %v", d.name, p, d.sync(rt, p, "", nil))
		case 8:
			// Before the transaction: inside it, the engine holds the
			// write lock and this goroutine would wait on itself.
			// Concurrent writers are TestConcurrentWritersDuringSync's.
			p := rapid.SampledFrom(harnessPoints[:3]).Draw(rt, "writeAt")
			rt.Logf("%s: sync, write at %s -> %v", d.name, p, d.sync(rt, "", p, func() { m.write(rt, d, label+"w") }))
		case 9:
			// A file delivered again after it was applied: the device
			// forgets having applied one.
			res, err := d.db.Exec(`DELETE FROM sync_files WHERE name IN (SELECT name FROM sync_files ORDER BY random() LIMIT 1)`)
			if err != nil {
				rt.Fatal(err)
			}
			if k, _ := res.RowsAffected(); k > 0 {
				count("fault file delivered again")
			}
		}
	}
	// Quiescence: no faults, every file visible, sync until nothing moves.
	if w.drive != nil {
		w.drive.ClearFaults()
	}
	w.mu.Lock()
	w.faults = false
	for _, h := range w.hidden {
		clear(h)
	}
	w.mu.Unlock()
	quiesce(rt, devs)
	checkConverged(rt, devs, m)
}

func quiesce(rt *rapid.T, devs []*hdevice) {
	for round := 0; round < 12; round++ {
		moved := false
		for _, d := range devs {
			r, err := d.eng.Sync(context.Background())
			if err != nil {
				rt.Fatalf("%s: sync without faults: %v", d.name, err)
			}
			if r.Uploaded != "" || r.Recovered != "" || len(r.Downloaded) > 0 {
				moved = true
			}
			if len(r.Rejected) > 0 {
				rt.Fatalf("%s: rejected %v", d.name, r.Rejected)
			}
		}
		if !moved {
			return
		}
	}
	rt.Fatal("no quiescence after 12 rounds")
}

func checkConverged(rt *rapid.T, devs []*hdevice, m *model) {
	dump := func(d *hdevice) string {
		var b strings.Builder
		for _, q := range []string{
			`SELECT table_name, record_id, record_data, clock, sync_version, device_id, is_deleted FROM sync_states ORDER BY 1, 2`,
			`SELECT id, hex(content), quote(title), quote(display_order) FROM notes ORDER BY id`,
		} {
			rows, err := d.db.Query(q)
			if err != nil {
				rt.Fatal(err)
			}
			cols, _ := rows.Columns()
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			for rows.Next() {
				rows.Scan(ptrs...)
				fmt.Fprintln(&b, vals...)
			}
			rows.Close()
		}
		return b.String()
	}
	want := dump(devs[0])
	for _, d := range devs {
		if got := dump(d); got != want {
			rt.Fatalf("%s diverged from %s:\n%s\nvs\n%s", d.name, devs[0].name, got, want)
		}
		var pending int
		var integrity string
		d.db.QueryRow(`SELECT count(*) FROM sync_pending_changes`).Scan(&pending)
		d.db.QueryRow(`PRAGMA integrity_check`).Scan(&integrity)
		if pending != 0 || integrity != "ok" {
			rt.Fatalf("%s: %d pending, integrity %q", d.name, pending, integrity)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(m.hist)) {
		final, _ := devs[0].local(rt, id)
		for _, p := range harnessPaths {
			h := m.hist[id][p]
			if len(h) == 0 {
				continue
			}
			if wr := h[len(h)-1]; wr.sawAll && wr.value != "" {
				count("updates checked")
				if final[p] != wr.value {
					rt.Fatalf("lost update: %s.%s = %q, want %q (last written by %s, who had seen every earlier write)", id, p, final[p], wr.value, wr.device)
				}
			}
		}
	}
}
