package drivesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3" // a second driver for some devices
	"pgregory.net/rapid"

	"github.com/drivesync/drivesync/internal/drivefake"
	"github.com/drivesync/drivesync/internal/merge"
	"github.com/drivesync/drivesync/internal/seal"
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
// The schedules also compact: a device calls Engine.Snapshot (crashing at
// a sync step, after uploading the snapshot, or in the middle of
// compaction's deletes), the shared remote clock jumps ahead by minutes to
// days or into the next month (so that snapshots grow older than
// ListOverlap, patch files older than the short Retention every device
// uses, and the monthly snapshot falls due), brand-new devices join
// mid-schedule (some with rows of their own) and bootstrap from the
// newest snapshot, and a device stays offline with pending writes (some
// held in its outbox) across two compactions before it syncs again.
// After quiescence one more new device joins and must match the others.
//
// A failing schedule prints a rapid seed; replay it with
//
//	go test -run 'TestSchedules/<subtest>' -rapid.seed=<seed> .

var (
	schedules      = flag.Int("schedules", 0, "randomized schedules for TestSchedules, in batches of -rapid.checks (0: 2000, or 50 with -race)")
	driveSchedules = flag.Int("drive-schedules", 0, "randomized schedules for TestSchedulesOverDrive, in batches of 100 (0: 200, or none with -race)")
	maxSkew        = flag.Duration("max-skew", 2*time.Hour, "how far a device's clock may be off in the schedules whose devices' clocks disagree")
)

// counters count, across a run, each injected fault and crash point.
var counters sync.Map // string -> *atomic.Int64

func count(kind string) { countN(kind, 1) }

// CountHarness counts, in the harness's table, a condition that a backend
// of the external test package generated.
func CountHarness(kind string) { count(kind) }

func countN(kind string, n int) {
	c, _ := counters.LoadOrStore(kind, new(atomic.Int64))
	c.(*atomic.Int64).Add(int64(n))
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
	runSchedules(t, *schedules, 2000, 50, backend{})
}

// TestSchedulesOverDrive runs the schedules with every device on its own
// DriveRemote, over one fake Drive server that also fails HTTP requests
// (rate limits, server errors, connections reset mid-body).
func TestSchedulesOverDrive(t *testing.T) {
	if *driveSchedules == 0 && raceEnabled {
		t.Skip("schedules over Drive run without -race (CI's harness step); under -race, ask for them with -drive-schedules")
	}
	runSchedules(t, *driveSchedules, 200, 0, backend{drive: true})
}

// HarnessBackend is a remote that the schedules can run over from the
// external test package, which may import remotes that import this
// package (s3remote): RunSchedulesOver.
type HarnessBackend struct {
	Name string // counted as "schedules over <Name>"
	// NewStore makes an empty store for one schedule.
	NewStore func() (HarnessStore, error)
}

// HarnessStore is one schedule's store on a HarnessBackend. Its server
// keeps its own clock, which the harness cannot set: the devices see it
// shifted to the schedule's clock (see harnessRemote.shift).
type HarnessStore interface {
	// Open returns a new device's Remote on the store.
	Open() (Remote, error)
	// Fault, called before each step while faults are on, may inject a
	// fault into the devices' requests (drawing from rng), and names it.
	Fault(rng *rand.Rand) string
	// ClearFaults ends the injected faults, for quiescence.
	ClearFaults()
}

// HarnessServerStore is a HarnessStore on a sync server: its devices
// sync through a Server, not a Remote (Open is not called).
type HarnessServerStore interface {
	HarnessStore
	// OpenServer returns a new device's Server on the store.
	OpenServer() (Server, error)
	// SmallLimits moves the store to a server whose limits on a write
	// and a push are small, before any device opens it: the schedule
	// writes for a store with small limits.
	SmallLimits()
}

// harnessServer is a device's Server in a schedule over a sync server: it
// fails pushes before and after the server applies them, crashes the
// device right after a push the server applied, and runs another
// device's sync in the middle of a pull, and just before or after a
// push (another write between the device's pull and its push, or right
// after its push: the push's cursor must not skip it).
type harnessServer struct {
	r    *harnessRemote // the device's crash point, counters and world
	base Server
}

func (s *harnessServer) Push(ctx context.Context, b *PushBatch) (*PushResult, error) {
	if s.r.w.roll("push fails before the server", 0.05) {
		return nil, errFault
	}
	if s.r.w.roll("another device syncs before a push", 0.05) {
		s.r.w.interleave(s.r.device)
	}
	res, err := s.base.Push(ctx, b)
	if err != nil {
		return nil, err
	}
	s.r.patches.Add(1)
	if s.r.w.roll("another device syncs after a push", 0.05) {
		s.r.w.interleave(s.r.device)
	}
	if s.r.w.roll("crash after a push the server applied", 0.03) {
		panic(errCrash{"pushed"})
	}
	if s.r.w.roll("push applied, the device hears a failure", 0.05) {
		return nil, errFault
	}
	return res, nil
}

func (s *harnessServer) Pull(ctx context.Context, store, cursor string) (*PullPage, error) {
	if s.r.w.roll("pull fails", 0.03) {
		return nil, errFault
	}
	if cursor != "" && s.r.w.roll("another device syncs during a pull", 0.1) {
		s.r.w.interleave(s.r.device)
	}
	return s.base.Pull(ctx, store, cursor)
}

// RunSchedulesOver runs n schedules (0: 100, or none under -race) over
// an external backend.
func RunSchedulesOver(t *testing.T, n int, b *HarnessBackend) {
	if n == 0 && raceEnabled {
		t.Skipf("schedules over %s run without -race (CI's harness step); under -race, ask for them with a count", b.Name)
	}
	runSchedules(t, n, 100, 100, backend{ext: b})
}

// backend is the remote of a run's schedules: the MemoryRemote (shared
// by the devices, with a virtual clock), the fake Drive server, or an
// external one.
type backend struct {
	drive bool
	ext   *HarnessBackend
}

// runSchedules runs n schedules (rounded up to whole batches of rapid's
// checks), batches in parallel.
func runSchedules(t *testing.T, n, full, underRace int, b backend) {
	if n == 0 {
		n = full
		if raceEnabled {
			n = underRace // the race detector slows SQLite ~10x; CI runs the full count without it
		}
	}
	// A batch is one rapid.Check: as many schedules as -rapid.checks
	// (100 unless set).
	size := 100
	if f := flag.Lookup("rapid.checks"); f != nil {
		if c, err := strconv.Atoi(f.Value.String()); err == nil && c > 0 {
			size = c
		}
	}
	if testing.Short() {
		size /= 5 // as rapid does
		if size == 0 {
			t.Fatal("-short leaves rapid no checks: set -rapid.checks to 5 or more")
		}
	}
	// A small run still takes two batches, for two cores; a batch whose
	// share is under rapid's checks lets the rest of them pass at once
	// (a failure found within its share still fails, though its
	// shrinking may then say the failure did not reproduce: replay it).
	per := size
	if n < 2*size {
		per = min(size, max(1, (n+1)/2))
	}
	for batch := 0; batch*per < n; batch++ {
		share := int32(min(per, n-batch*per))
		t.Run(fmt.Sprint("batch", batch), func(t *testing.T) {
			t.Parallel()
			var ran atomic.Int32
			rapid.Check(t, func(rt *rapid.T) {
				if share < int32(size) && ran.Add(1) > share {
					return
				}
				runSchedule(t, rt, b)
			})
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
	// crashAt, during one sync, names a remote crash point: the process
	// dies right after storing a snapshot ("snapshot uploaded"), or right
	// after compaction deleted a file ("compacting").
	crashAt string
	// failPatches makes every patch upload fail before storing it, so
	// that the sync leaves its file in the outbox.
	failPatches bool
	heldUploads int          // patch uploads failPatches failed
	patches     atomic.Int64 // patch files stored
}

type world struct {
	// keys are the devices' Config.Encryption and PreviousKeys in a
	// schedule of an encrypted store (nil otherwise); rotateAt is the
	// step at which every device changes to a new key, -1 for none.
	keys     []Key
	rotateAt int
	// rotating is set between one device's key change and the others
	// catching up (catchUpAt): their syncs may stop with ErrWrongKey.
	rotating  bool
	catchUpAt int
	mem       *MemoryRemote
	drive     *drivefake.Server // set when the devices use Drive
	ext       HarnessStore      // set when the devices use an external backend
	server    bool              // ext is a HarnessServerStore: the devices sync through a Server
	rng       *rand.Rand
	mu        sync.Mutex
	faults    bool
	folder    bool // devices' clocks disagree; List ignores since
	// hidden[device][name]: the file stays invisible to that device's
	// next few listings, within maxLag of its creation.
	hidden map[string]map[string]hiddenFile
	devs   []string
	// The remote clock: start, plus the jumps ahead (offset, in
	// nanoseconds), plus the time elapsed since the schedule began. Over
	// a MemoryRemote that is a millisecond per reading (ticks), so that
	// a replayed schedule names its files the same; the DriveRemote
	// estimates Drive's clock from the real one, so over Drive it is the
	// real time elapsed.
	start   time.Time
	began   time.Time
	virtual bool
	ticks   atomic.Int64
	// tick is how far the virtual clock moves per reading: a millisecond,
	// or, as on a fast machine where a whole sync takes less than one,
	// a microsecond.
	tick      time.Duration
	offset    atomic.Int64
	retention time.Duration // every device's Config.Retention
	limits    Limits        // every device's Config.Limits: the store's
	strict    bool          // notes is strictNotesSchema
	ordinary  bool          // notes is an ordinary table (see notesSchema)
	// nocase: the ordinary notes' key column grp is declared COLLATE
	// NOCASE, its key index BINARY: the records r0 and r1, whose keys
	// differ only in case, are two rows.
	nocase bool
	// gens[device][id]: the value of gens id that device showed after its
	// last sync that succeeded (see checkGens).
	gens map[string]map[string]int64
	// checked: dev-0's strict table also CHECKs b, refusing some values
	// the other devices write (an app version with a stricter rule):
	// its rows stay as they were, reported unwritten, until dev-0 writes
	// the record itself.
	checked bool
	// damaged[device][name]: until the remote time given, that device
	// reads the file truncated (a folder-sync tool still writing it) or
	// as of a newer format (the device runs an older app until then).
	damaged map[string]map[string]damage
	// hostile names the files of no device that every device must reject
	// for their versions; they stay rejected after quiescence.
	hostile       map[string]bool
	hostileJumped bool // a hostile file within the version bound was written
	// interleave, while faults are on, runs another device's sync or
	// Snapshot in the middle of this device's sync: while it reads a
	// snapshot (a compaction that deletes files this sync listed but
	// has not read), or, through a server, during a pull and around a
	// push.
	interleave func(reader string)
	// noSnapshots: the store's remote refuses every snapshot (a sync
	// server's small file limit), so no file may vanish. compacted: a
	// compaction deleted files in this schedule.
	noSnapshots, compacted bool
	vanished               bool // a file vanished in this schedule
}

// damage is how one device reads one file for a while.
type damage struct {
	// how: the file reads as of a newer format, or the remote refuses
	// this device access to it (fs.ErrPermission, as a shared folder
	// whose sharing is being changed does), else it reads truncated.
	how   damageKind
	until time.Time
}

type damageKind int

const (
	damageTruncated damageKind = iota
	damageNewer
	damageDenied
)

// hiddenFile is a file a device's listings miss for a while.
type hiddenFile struct {
	listings int
	created  time.Time // by the remote clock
}

// maxLag bounds how long a listing lags a new file, by the remote clock.
// The engine's ListOverlap (the default, 15 minutes) assumes listings lag
// less than it; with the clock jumping ahead, a lag counted in listings
// alone could last days.
const maxLag = DefaultListOverlap / 2

// now is the remote's clock (the MemoryRemote's and the fake Drive's).
func (w *world) now() time.Time {
	elapsed := time.Since(w.began)
	if w.virtual {
		elapsed = time.Duration(w.ticks.Add(1)) * w.tick
	}
	return w.start.Add(time.Duration(w.offset.Load()) + elapsed)
}

func (w *world) advance(d time.Duration) { w.offset.Add(int64(d)) }

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
	if !since.IsZero() {
		since = since.Add(-r.w.shift())
	}
	files, err := r.base.List(ctx, since)
	if err != nil {
		return nil, err
	}
	// In name order before the faults draw from the generator: the
	// MemoryRemote lists in map order, which a replay would not repeat.
	slices.SortFunc(files, func(a, b RemoteFile) int { return strings.Compare(a.Name, b.Name) })
	w := r.w
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []RemoteFile
	for _, f := range files {
		if h, ok := w.hidden[r.device][f.Name]; ok {
			if h.listings > 0 && now.Sub(h.created) < maxLag {
				h.listings--
				w.hidden[r.device][f.Name] = h
				count("fault listing lags")
				continue
			}
			delete(w.hidden[r.device], f.Name)
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
	if strings.Contains(name, "/snapshot_") && r.w.interleave != nil && r.w.roll("another device syncs while this one reads a snapshot", 0.1) {
		r.w.interleave(r.device)
	}
	rc, err := r.base.Open(ctx, name)
	if err != nil {
		return rc, err
	}
	w := r.w
	now := w.now()
	w.mu.Lock()
	dm, ok := w.damaged[r.device][name]
	w.mu.Unlock()
	if !ok || !now.Before(dm.until) {
		if w.roll("file read in small pieces", 0.3) {
			// As a slow network delivers it: the decoders read ahead
			// of the sync many times per file.
			return smallReads{rc}, nil
		}
		return rc, nil
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, err
	}
	switch dm.how {
	case damageNewer:
		if w.keys != nil {
			// An encrypted file changed by one byte.
			count("fault file read with a byte changed (encrypted)")
			b[len(b)/2] ^= 0x20
			return io.NopCloser(bytes.NewReader(b)), nil
		}
		count("fault file read as a newer format")
		return io.NopCloser(bytes.NewReader(newerFormat(b))), nil
	case damageDenied:
		count("fault file access refused")
		return nil, fmt.Errorf("%w: injected: this device may not read %s for now", fs.ErrPermission, name)
	}
	count("fault file read truncated")
	return io.NopCloser(bytes.NewReader(b[:len(b)/2])), nil
}

// newerFormat rewrites a remote file's format number to one no engine
// reads yet.
func newerFormat(b []byte) []byte {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return b
	}
	plain, err := io.ReadAll(zr)
	if err != nil {
		return b
	}
	plain = formatRE.ReplaceAll(plain, []byte(`"format":999`))
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(plain)
	zw.Close()
	return out.Bytes()
}

var formatRE = regexp.MustCompile(`^\{"format":[0-9]+`)

func (r *harnessRemote) Create(ctx context.Context, name string, content io.Reader) error {
	if r.failPatches && strings.Contains(name, "/patch_") {
		r.heldUploads++
		count("fault upload held in outbox")
		return errFault
	}
	if r.w.roll("create fails before", 0.05) {
		return errFault
	}
	counted := &countingReader{r: content}
	if err := r.base.Create(ctx, name, counted); err != nil {
		return err
	}
	if strings.Contains(name, "/patch_") {
		r.patches.Add(1)
		if lim := r.w.limits.MaxFileSize; lim > 0 && counted.n > lim*3/4 {
			count("patch file filled past 3/4 of a small MaxFileSize")
		}
	}
	r.w.damage(r.device, name)
	if strings.Contains(name, "/snapshot_") {
		r.crash("snapshot uploaded")
	}
	if r.w.roll("create fails after", 0.05) {
		return errFault // stored, but the device hears a failure
	}
	w := r.w
	created := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range w.devs {
		if d != r.device && w.faults && w.rng.Float64() < 0.3 {
			w.hidden[d][name] = hiddenFile{listings: 1 + w.rng.IntN(3), created: created}
		}
	}
	return nil
}

// damage makes the other devices read a new file damaged for a while:
// snapshots often, patch and merge files now and then; for minutes to
// hours, sometimes past the retention, so that compaction deletes what a
// device could not read yet.
func (w *world) damage(writer, name string) {
	p := 0.05
	if strings.Contains(name, "/snapshot_") {
		p = 0.3
	}
	created := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.faults || name == markerName {
		return
	}
	for _, d := range w.devs {
		if d == writer || w.rng.Float64() >= p {
			continue
		}
		dm := damage{how: []damageKind{damageTruncated, damageTruncated, damageTruncated, damageNewer, damageNewer, damageDenied}[w.rng.IntN(6)],
			until: created.Add(time.Duration(10+w.rng.IntN([]int{8, 8, 8, 36}[w.rng.IntN(4)]*60)) * time.Minute)}
		w.damaged[d][name] = dm
		count("damage: a device reads a new file " + map[damageKind]string{damageTruncated: "truncated", damageNewer: "as a newer format", damageDenied: "refused access"}[dm.how])
	}
}

func (r *harnessRemote) Delete(ctx context.Context, name string) error {
	if r.w.roll("delete fails before", 0.1) {
		return errFault
	}
	if err := r.base.Delete(ctx, name); err != nil {
		return err
	}
	r.crash("compacting")
	if r.w.roll("delete fails after", 0.1) {
		return errFault
	}
	return nil
}

// crash dies at a remote crash point if this sync is to die there.
func (r *harnessRemote) crash(point string) {
	if r.crashAt == point {
		r.crashAt = ""
		count("crash at " + point)
		panic(errCrash{point})
	}
}

func (r *harnessRemote) Now(ctx context.Context) (time.Time, error) {
	now, err := r.base.Now(ctx)
	return now.Add(r.skew + r.w.shift()), err
}

// shift is how far the schedule's clock is ahead of an external server's
// (zero for the other backends, whose clocks are the schedule's). The
// devices read the server's clock shifted, and List's since is shifted
// back; w.start is never before the real time, so the shift is never
// negative, and the file names (by the shifted clock) sort no earlier
// than the server's own times of the files.
func (w *world) shift() time.Duration {
	if w.ext == nil {
		return 0
	}
	return w.start.Sub(w.began) + time.Duration(w.offset.Load())
}

// hdevice is one simulated device of a schedule.
type hdevice struct {
	name   string
	path   string
	db     *sql.DB
	eng    *Engine
	cfg    Config
	remote *harnessRemote
	seq    int
	seen   map[string]bool // every value that has appeared in this device's rows
	// mattn: the device opens its database with mattn/go-sqlite3, not
	// modernc.org/sqlite. detached: notes is not registered for now.
	mattn, detached bool
	// dropTriggers: its syncs drop the capture triggers while they write,
	// however few their writes (see beginQuiet).
	dropTriggers bool
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
	// The creates' own keys (see modelCreate).
	if d.remote.w.ordinary {
		return
	}
	rows, err := d.db.Query(`SELECT j.value FROM notes, json_each(json(notes.content), '$.k') AS j`)
	if err != nil {
		rt.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			rt.Fatal(err)
		}
		d.seen[v] = true
	}
}

func (d *hdevice) open(rt *rapid.T) {
	d.openDB(rt)
	d.openEngine(rt)
}

// openDB opens the app's database, without the engine.
func (d *hdevice) openDB(rt *rapid.T) {
	driver, dsn := "sqlite", testDSN(d.path)
	if d.mattn {
		driver, dsn = "sqlite3", "file:"+d.path+"?_journal_mode=WAL&_busy_timeout=10000&_synchronous=NORMAL&_txlock=immediate"
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		rt.Fatal(err)
	}
	for _, schema := range []string{d.remote.w.notesSchema(d.name), miscSchema, extraSchema} {
		if _, err := db.Exec(schema); err != nil {
			rt.Fatal(err)
		}
	}
	d.db = db
}

// strictNotesSchema is the notes table of a third of the schedules: a
// STRICT table whose projections a and b are NOT NULL, as the original
// design's tables have them. A record re-created in part could never be
// written to it.
const strictNotesSchema = `CREATE TABLE IF NOT EXISTS notes (
	id TEXT PRIMARY KEY,
	content BLOB NOT NULL,
	a TEXT NOT NULL,
	b TEXT NOT NULL,
	title TEXT,
	display_order INTEGER
) STRICT`

// checkedStrictNotesSchema is the strict table with a CHECK that refuses
// the values of b that other devices wrote at a sequence number ending in
// 3, 5 or 7 (a harness value is device#seq, with a suffix for a whole
// row).
const checkedStrictNotesSchema = `CREATE TABLE IF NOT EXISTS notes (
	id TEXT PRIMARY KEY,
	content BLOB NOT NULL,
	a TEXT NOT NULL,
	b TEXT NOT NULL CHECK (b NOT GLOB 'dev-[1-9]#*[357]' AND b NOT GLOB 'dev-[1-9]#*[357]b'),
	title TEXT,
	display_order INTEGER
) STRICT`

// Statements of the app's writes to notes; on the strict table the app
// keeps its projections in step with content, as such an app does.
func (d *hdevice) putNote(rt *rapid.T, id, content string) {
	q := `INSERT INTO notes (id, content) VALUES (?1, jsonb(?2)) ON CONFLICT (id) DO UPDATE SET content = excluded.content`
	if d.remote.w.strict {
		q = `INSERT INTO notes (id, content, a, b) VALUES (?1, jsonb(?2), ?2 ->> '$.a', ?2 ->> '$.b')
ON CONFLICT (id) DO UPDATE SET content = excluded.content, a = excluded.a, b = excluded.b`
	}
	if _, err := d.db.Exec(q, id, content); err != nil {
		rt.Fatal(err)
	}
}

func (d *hdevice) setNotePath(rt *rapid.T, id, path, val string) {
	q := `UPDATE notes SET content = jsonb_set(content, ?2, ?3) WHERE id = ?1`
	if d.remote.w.strict {
		q = `UPDATE notes SET content = jsonb_set(content, ?2, ?3), a = jsonb_set(content, ?2, ?3) ->> '$.a', b = jsonb_set(content, ?2, ?3) ->> '$.b' WHERE id = ?1`
	}
	if _, err := d.db.Exec(q, id, path, val); err != nil {
		rt.Fatal(err)
	}
}

// setDetached unregisters the notes table on d (the app syncs only misc
// for a while: notes changes go to sync_states, and the app's writes to
// notes are not captured), or registers it again.
func (d *hdevice) setDetached(rt *rapid.T, detached bool) {
	if !detached {
		// Take in what others wrote meanwhile, into sync_states only,
		// before the table is registered again.
		d.sync(rt, "", "", nil)
	}
	d.detached = detached
	d.cfg.Tables = harnessTables(detached)
	d.openEngine(rt)
	if detached {
		count("table unregistered")
	} else {
		count("table registered again")
	}
	rt.Logf("%s: notes registered: %v", d.name, !detached)
}

func harnessTables(detached bool) []Table {
	if detached {
		return append([]Table{{Name: "misc"}}, extraTables...)
	}
	return append([]Table{{Name: "notes"}, {Name: "misc"}}, extraTables...)
}

func (d *hdevice) openEngine(rt *rapid.T) {
	eng, err := Open(context.Background(), d.db, d.cfg)
	if err != nil {
		rt.Fatalf("%s: Open: %v", d.name, err)
	}
	if d.dropTriggers {
		eng.quietDropAt = 1
	}
	d.eng = eng
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
	// An upload stored while the device sees its connection cut: the
	// DriveRemote sends it again, and the name has two files.
	{Method: "POST", PathPrefix: "/upload/drive/v3/files", ResetMidBody: true, Times: 1},
}

var harnessPoints = []string{"fetched", "planned", "uploaded", "applied", "committed"}

// snapshotPoints adds, to a sync's crash points, the remote ones of the
// snapshot it writes and of the compaction after it.
var snapshotPoints = append(slices.Clip(harnessPoints), "snapshot uploaded", "compacting")

// sync runs one sync, possibly crashing at a point or letting the app
// write at one. Errors are expected while faults are on.
func (d *hdevice) sync(rt *rapid.T, crashAt, writeAt string, write func()) error {
	_, err := d.run(rt, false, crashAt, writeAt, write)
	return err
}

// run runs one Sync, or with snapshot one Engine.Snapshot, possibly
// crashing at a point (a sync step or a remote crash point) or letting
// the app write at a sync step, and counts what it did. Errors are
// expected while faults are on.
func (d *hdevice) run(rt *rapid.T, snapshot bool, crashAt, writeAt string, write func()) (Report, error) {
	patches := d.remote.patches.Load()
	hooks(d.eng).step = func(p string) error {
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
	d.remote.crashAt = crashAt
	defer func() { hooks(d.eng).step, d.remote.crashAt = nil, "" }()
	if snapshot {
		count("Snapshot calls")
	}
	var fresh bool // no synced state yet: the sync bootstraps
	if err := d.db.QueryRow(`SELECT NOT EXISTS (SELECT 1 FROM sync_states)`).Scan(&fresh); err != nil {
		rt.Fatal(err)
	}
	crashed := false
	var r Report
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(errCrash); !ok {
					panic(r)
				}
				crashed = true
			}
		}()
		if snapshot {
			r, err = d.eng.Snapshot(context.Background())
		} else {
			r, err = d.eng.Sync(context.Background())
		}
		return err
	}()
	if n := meterAway.Swap(0); n > 0 {
		rt.Fatalf("%d progress updates (Config.Progress) were made on a goroutine other than the syncing one", n)
	}
	op := "sync"
	if snapshot {
		op = "Snapshot"
	}
	if writeAt != "" {
		op += ", write at " + writeAt
	}
	at := d.remote.w.now().Format("01-02T15:04")
	if crashed {
		rt.Logf("%s %s: %s, crashed at %s", at, d.name, op, crashAt)
		d.crash(rt)
		d.observe(rt)
		return Report{}, nil
	}
	var rejected []string
	for _, f := range r.Rejected {
		rejected = append(rejected, f.Name)
	}
	rt.Logf("%s %s: %s -> downloaded %v, rejected %v, uploaded %q, recovered %q, snapshot %q, deleted %d, skipped %v, err %v",
		at, d.name, op, r.Downloaded, rejected, r.Uploaded, r.Recovered, r.Snapshot, r.Deleted, r.Skipped, err)
	d.observe(rt)
	if err == nil {
		d.checkGens(rt)
	}
	countReport(r, snapshot, fresh)
	if r.Deleted > 0 {
		d.remote.w.compacted = true
	}
	for _, u := range r.Unwritten {
		if strings.Contains(u.Err.Error(), "CHECK constraint failed") {
			count("rows dev-0's CHECK refused")
		}
	}
	if d.remote.patches.Load()-patches > 1 {
		count("syncs whose changes took several files")
	}
	if r.Snapshot != "" && d.cfg.Limits.MaxRecordSize > 0 {
		var over int
		d.db.QueryRow(`SELECT count(*) FROM sync_states WHERE length(record_data) > ?1 OR length(clock) > 2 * ?1`, d.cfg.Limits.MaxRecordSize).Scan(&over)
		if over > 0 {
			count("snapshots holding a record in parts")
		}
	}
	if errors.Is(err, ErrFileTooLarge) {
		count("snapshots refused over a sync server's file limit")
	}
	if err != nil && strings.Contains(err.Error(), "deleted while this sync ran") {
		count("sync stopped: a listed file was compacted, no snapshot listed holds it")
	}
	if errors.Is(err, errUnreadableState) {
		// A state the merge rules built must always read back, and a
		// record over the record limit goes in parts: no value the
		// harness writes is near a limit no part can meet, nor any
		// snapshot near MaxSnapshotSize.
		rt.Fatalf("%s: a snapshot was refused: %v", d.name, err)
	}
	if errors.Is(err, ErrWrongKey) && d.remote.w.rotating {
		count("sync stopped: another device changed the key")
		return r, err
	}
	if err != nil && !errors.Is(err, errFault) && !errors.Is(err, ErrRemote) {
		rt.Fatalf("%s: sync failed with an error that is not an injected fault: %v", d.name, err)
	}
	return r, err
}

// rotate changes one device's key, or two devices' to two different keys
// at once; the others keep the old key until catchUp.
func rotate(rt *rapid.T, w *world, devs []*hdevice) {
	w.mu.Lock()
	defer w.mu.Unlock()
	old := w.keys[0]
	n := 1
	if len(devs) > 2 && rapid.Bool().Draw(rt, "concurrentRotation") {
		n = 2
		count("key changed on two devices at once, to different keys")
	} else {
		count("key changed on one device")
	}
	for j, d := range devs[:n] {
		d.cfg.Encryption, d.cfg.PreviousKeys = Passphrase(fmt.Sprint("harness key 2", "abc"[j:j+1])), []Key{old}
		if d.eng != nil {
			d.openEngine(rt)
		}
	}
	// Devices that join meanwhile get the old key, as a user who has not
	// heard of the change would.
	w.keys = []Key{Passphrase("harness key 2a"), Passphrase("harness key 2b"), old}
	w.rotating = true
	rt.Logf("%d device(s) change the key", n)
}

// catchUp gives every device every key: the first new one current, the
// others to read what was encrypted with them.
func catchUp(rt *rapid.T, w *world, devs []*hdevice) {
	if !w.rotating {
		return
	}
	w.mu.Lock()
	w.rotating = false
	keys := w.keys
	w.mu.Unlock()
	for _, d := range devs {
		d.cfg.Encryption, d.cfg.PreviousKeys = keys[0], keys[1:]
		if d.eng != nil {
			d.openEngine(rt)
		}
	}
	count("every device given the new keys")
	rt.Logf("every device gets the new keys")
}

// removalRun adds a batch of keys to a record and removes it again,
// syncing in between, several times over: each removal leaves tombstones
// in the record's clock, which in a store with a small record limit
// outgrows what a snapshot may hold.
func removalRun(rt *rapid.T, m *model, d *hdevice, label string) {
	id := rapid.SampledFrom(harnessRecords).Draw(rt, label+"runRecord")
	if _, exists := d.local(rt, id); !exists {
		return
	}
	count("write: a long run of key removals")
	// Half the runs write their batches to every record the device
	// shows: in a store with small limits, one sync's changes then take
	// several patch files.
	ids := []string{id}
	if rapid.Bool().Draw(rt, "runAll") {
		for _, other := range harnessRecords {
			if _, exists := d.local(rt, other); exists && other != id {
				ids = append(ids, other)
			}
		}
	}
	for range rapid.IntRange(4, 8).Draw(rt, "rounds") {
		for _, add := range []bool{true, false} {
			d.seq++
			for _, id := range ids {
				m.batch(rt, d, id, fmt.Sprintf("%s#%d", d.name, d.seq), add)
			}
			d.sync(rt, "", "", nil)
		}
	}
	// A snapshot now: a clock that outgrew the record limit goes in
	// parts, which every device must read back to the same state.
	d.run(rt, true, "", "", nil)
}

// hostileFile writes a patch file of no device stamped with an extreme
// version: at or beyond the stamping limit, or far above what its time
// allows (every device must reject it, and keep stamping), or once per
// schedule right at the bound its time allows (every device must take it,
// at once or when its clock gets there, and keep stamping above it).
func hostileFile(rt *rapid.T, w *world, devs []*hdevice, label string) {
	now := w.now().Truncate(time.Millisecond) // the time its name carries
	kind := rapid.IntRange(0, 3).Draw(rt, "hostileKind")
	var v int64
	switch {
	case kind == 0:
		v = merge.MaxVersion
	case kind == 1:
		v = merge.MaxVersion + 1
	case kind == 2 || w.hostileJumped:
		v = merge.VersionsAllowed(now) + 1<<45 + rapid.Int64Range(0, 1<<40).Draw(rt, "far") // a year ahead
		kind = 2
	default:
		v = merge.VersionsAllowed(now) - rapid.Int64Range(0, 1<<20).Draw(rt, "belowBound")
		w.hostileJumped = true
	}
	dev := "hostile-" + label
	name := patchFileName(now, dev)
	record := "h" + label
	if w.ordinary {
		record = encodeKey([]any{record, int64(0)})
	}
	changes := fmt.Sprintf(`{"table_name":"notes","record_id":%q,"patch":{"a":"hostile","b":"hostile"},"is_deleted":false,"sync_version":%d}`, record, v)
	if kind == 3 {
		// A second write of the record under the same stamp, over the
		// same paths (no device writes one, but a file may hold it):
		// the first applied wins, so every device must apply a file's
		// changes in its order, whether it writes new records in
		// batches or one at a time (while the app writes).
		changes += fmt.Sprintf(`,{"table_name":"notes","record_id":%q,"patch":{"a":null,"b":"hostile too"},"is_deleted":false,"sync_version":%d}`, record, v)
		count("hostile file: two writes of one record under one stamp")
	}
	if kind == 3 && w.ordinary {
		// A key no row may hold (TEXT with a NUL character, which the
		// capture triggers refuse): every device keeps the record
		// unwritten alike, whether its sync drops the triggers or not.
		nul, _ := json.Marshal(encodeKey([]any{record + "\x00", int64(0)}))
		changes += fmt.Sprintf(`,{"table_name":"notes","record_id":%s,"patch":{"a":"hostile","b":"hostile"},"is_deleted":false,"sync_version":%d}`, nul, v)
		count("hostile file: a key with a NUL character")
	}
	body := fmt.Sprintf(`{"format":1,"device":%q,"changes":[%s]}`, dev, changes)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte(body))
	zw.Close()
	content := buf.Bytes()
	if w.keys != nil {
		// The writer holds the store's key: what it writes is as valid
		// as a device's file but for its versions.
		var store string
		devs[0].db.QueryRow(`SELECT value FROM sync_meta WHERE key = 'store'`).Scan(&store)
		if store == "" {
			return
		}
		w.mu.Lock()
		pass := string(w.keys[0].(passphraseKey))
		w.mu.Unlock()
		id, err := seal.PassphraseIdentity(pass, store, passphraseWork)
		if err != nil {
			rt.Fatal(err)
		}
		sealed, err := seal.Encrypt(bytes.NewReader(content), name, id.Recipient())
		if err != nil {
			rt.Fatal(err)
		}
		if content, err = io.ReadAll(sealed); err != nil {
			rt.Fatal(err)
		}
	}
	var err error
	for range 10 { // past the fake Drive's injected faults
		if err = devs[0].remote.base.Create(context.Background(), name, bytes.NewReader(content)); err == nil || errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		rt.Fatal(err)
	}
	if kind == 3 {
		count("hostile file: versions right at the bound")
	} else {
		count("hostile file: versions every device must reject")
		w.mu.Lock()
		w.hostile[name] = true
		w.mu.Unlock()
	}
	rt.Logf("hostile file %s at version %d", name, v)
}

// vanishFile removes a file of the store from the remote behind the
// devices' backs, as a sync tool that loses it or a user cleaning the
// folder does: half the time the newest patch file (which other devices
// have mostly not read yet), else any patch, merge or snapshot file,
// before or after compaction took what a snapshot holds. The devices
// that hold it must find it gone and heal the others from a snapshot.
func vanishFile(rt *rapid.T, w *world, devs []*hdevice) {
	ctx := context.Background()
	base := devs[0].remote.base
	var files []RemoteFile
	var err error
	for range 10 { // past the fake Drive's injected faults
		if files, err = base.List(ctx, time.Time{}); err == nil {
			break
		}
	}
	if err != nil {
		rt.Fatal(err)
	}
	var names, patches []string
	for _, f := range files {
		kind, _, device, ok := parseFileName(f.Name)
		if !ok || strings.HasPrefix(device, "hostile-") {
			// The marker, key checks, and files of no device: those
			// carry no number, which only files of engines that did not
			// number theirs lack, and no device holds them as its own.
			continue
		}
		names = append(names, f.Name)
		if kind == kindPatch {
			patches = append(patches, f.Name)
		}
	}
	if len(names) == 0 {
		return
	}
	slices.Sort(names)
	slices.Sort(patches)
	name := names[rapid.IntRange(0, len(names)-1).Draw(rt, "vanish")]
	if len(patches) > 0 && rapid.Bool().Draw(rt, "vanishNewest") {
		name = patches[len(patches)-1]
		count("vanish: the newest patch file")
	}
	for range 10 {
		if err = base.Delete(ctx, name); err == nil {
			break
		}
	}
	if err != nil {
		rt.Fatal(err)
	}
	w.vanished = true
	kind, _, _, _ := parseFileName(name)
	count("vanish: a " + strings.TrimSuffix(kindPrefixes[kind], "_") + " file")
	if w.compacted {
		count("vanish: after a compaction")
	}
	unread := 0
	for _, d := range devs {
		var held bool
		if d.db != nil {
			d.db.QueryRow(`SELECT EXISTS (SELECT 1 FROM sync_files WHERE name = ?1 AND status IN ('applied', 'checked'))`, name).Scan(&held)
		}
		if !held {
			unread++
		}
	}
	if unread > 0 {
		count("vanish: a file some device had not read")
	} else {
		count("vanish: a file every device had read")
	}
	rt.Logf("%s vanishes from the remote (%d devices had not read it)", name, unread)
}

// rejectedUnexpectedly returns the rejections that are not of the
// schedule's hostile files.
func (w *world) rejectedUnexpectedly(r Report) []FileError {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []FileError
	for _, f := range r.Rejected {
		if !w.hostile[f.Name] {
			out = append(out, f)
		}
	}
	return out
}

// countReport counts the snapshots and compactions a sync did.
func countReport(r Report, snapshot, fresh bool) {
	switch {
	case r.Snapshot != "" && snapshot:
		count("snapshot written by Snapshot")
	case r.Snapshot != "":
		count("snapshot written monthly")
	}
	if r.Deleted > 0 {
		count("compactions that deleted")
		countN("files compacted away", r.Deleted)
	}
	if len(r.Vanished) > 0 {
		count("syncs that found files vanished")
		if r.Snapshot != "" {
			count("snapshots written for vanished files")
		}
	}
	if len(r.Missing) > 0 {
		count("syncs that reported files missing")
	}
	for _, name := range r.Downloaded {
		switch {
		case !strings.Contains(name, "/snapshot_"):
		case fresh:
			count("snapshot bootstrapped new device")
		default:
			count("snapshot loaded to catch up")
		}
	}
}

// model records, per record and member path, every write, to find lost
// updates. Values are unique per write, so a device has seen another
// device's write exactly when that value has appeared in its rows.
type model struct {
	seq  int
	hist map[string]map[string][]modelWrite // record -> path -> writes in order
	// batches: writes also add many keys to a record at once, or remove
	// every such key, so that removed keys pile up in its clock.
	batches bool
	// creates: per record, the creates whose own key (k.<value>, which
	// only that create writes) must hold at quiescence; see checkCreates.
	creates map[string][]*modelCreate
	devs    *[]*hdevice // the schedule's devices
	extra   extraModel
}

// modelCreate is a create of a record by a device that had received the
// record's last delete. Its key k.<value> is written by no other write,
// so it must survive every later create or edit by devices that had not
// seen it: they merge with it, as concurrent creates do. spoiled: a later
// delete, or a write by a device that had seen the create, may have
// removed the key legitimately.
type modelCreate struct {
	device, key, value string
	spoiled            bool
}

// receivedLastDelete reports whether device d, whose row of record id is
// gone, received the record's last delete: it had seen the last value
// written before that delete, and no other delete came after that value.
// A create by d is then stamped after every delete of the record so far.
func (m *model) receivedLastDelete(d *hdevice, id string) bool {
	dels := m.hist[id][""]
	if len(dels) == 0 {
		return true
	}
	last := dels[len(dels)-1].seq
	var w modelWrite
	for p, h := range m.hist[id] {
		for _, x := range h {
			if p != "" && x.value != "" && x.seq < last && x.seq > w.seq {
				w = x
			}
		}
	}
	after := 0
	for _, x := range dels {
		if x.seq > w.seq {
			after++
		}
	}
	return w.value != "" && after == 1 && d.seen[w.value]
}

// deleteUnsent reports whether a device other than d may hold a delete of
// record id that it has not sent yet: its row is gone and the record is
// pending there, or an upload waits in its outbox, or its table is
// unregistered. Such a delete is stamped when it is sent, above what its
// device received by then, so it may end a create made after it: the two
// are concurrent, and the later stamp wins, as for any write.
func (m *model) deleteUnsent(rt *rapid.T, d *hdevice, id string) bool {
	for _, o := range *m.devs {
		if o == d || o.db == nil {
			continue
		}
		if _, exists := o.local(rt, id); exists {
			continue
		}
		var unsent bool
		if err := o.db.QueryRow(`SELECT EXISTS (SELECT 1 FROM `+pendingUnion+` WHERE table_name = 'notes' AND record_id = ?) OR EXISTS (SELECT 1 FROM sync_outbox)`, o.remote.w.recordID(id)).Scan(&unsent); err != nil {
			rt.Fatal(err)
		}
		if unsent || o.detached {
			return true
		}
	}
	return false
}

// noteEvent records a write or delete of record id by d for checkCreates:
// it spoils the creates it may legitimately end.
func (m *model) noteEvent(d *hdevice, id string, deleted bool) {
	for _, c := range m.creates[id] {
		if deleted || d.seen[c.value] {
			c.spoiled = true
		}
	}
}

// batch adds 10-20 keys to record id, or removes every key a batch added.
// The model does not track them: they exist to grow the record's clock
// with removals, and the convergence check covers them.
func (m *model) batch(rt *rapid.T, d *hdevice, id, val string, add bool) {
	var patch []string
	var present []string
	rows, err := d.db.Query(`SELECT j.key FROM notes, json_each(notes.content) AS j WHERE notes.id = ? AND j.key LIKE 'z%'`, id)
	if err != nil {
		rt.Fatal(err)
	}
	for rows.Next() {
		var k string
		rows.Scan(&k)
		present = append(present, k)
	}
	rows.Close()
	// One batch at a time per record, so that one change stays within
	// the store's smallest record limit (a larger one is not sent).
	if add && len(present) == 0 {
		for i := range rapid.IntRange(8, 14).Draw(rt, "batchKeys") {
			patch = append(patch, fmt.Sprintf(`"z%03d_%02d_%s_a_key_that_is_removed":%q`, d.seq, i, d.name, val))
		}
		count("write: a batch of keys added")
	} else {
		for _, k := range present {
			patch = append(patch, fmt.Sprintf(`%q:null`, k))
		}
		if len(patch) == 0 {
			return
		}
		countN("write: batch keys removed", len(patch))
	}
	if _, err := d.db.Exec(`UPDATE notes SET content = jsonb_patch(content, ?) WHERE id = ?`, "{"+strings.Join(patch, ",")+"}", id); err != nil {
		rt.Fatal(err)
	}
	rt.Logf("%s: batch on %s: %d keys (add %v)", d.name, id, len(patch), add)
	m.noteEvent(d, id, false)
	// Not a write of a checked path, but a write of the record: a delete
	// that did not see it does not decide whether the record is shown.
	if m.hist[id] == nil {
		m.hist[id] = map[string][]modelWrite{}
	}
	m.seq++
	m.hist[id]["z"] = append(m.hist[id]["z"], modelWrite{seq: m.seq, device: d.name})
}

type modelWrite struct {
	seq    int // order of the writes in the schedule
	device string
	value  string // "" for absent
	// sawAll: when writing, the device had seen every earlier write to
	// this path by other devices, so nothing conflicts with this write.
	sawAll bool
}

// A physical delete hides a record and keeps its fields: it is not a write
// of any path, and the model records it under the path "", seen as a
// whole (sawAll: the device had seen every earlier write to the record).

// lastEvent returns the last write or delete of record id in the model.
func (m *model) lastEvent(id string) (last struct {
	device  string
	deleted bool
}) {
	seq := 0
	for p, h := range m.hist[id] {
		if w := h[len(h)-1]; w.seq > seq {
			seq, last.device, last.deleted = w.seq, w.device, p == ""
		}
	}
	return last
}

var harnessRecords = []string{"r0", "r1", "r2", "r3"}
var harnessPaths = []string{"a", "b", "n.x", "n.y", "deleted_at"}

// write performs one random app write on d and records it in m.
func (m *model) write(rt *rapid.T, d *hdevice, label string) {
	switch k := rapid.IntRange(0, 8).Draw(rt, label+"table"); k {
	case 0, 1:
		m.extraWrite(rt, d, label, k == 1)
		return
	case 2, 3:
		slotWrite(rt, d, label)
		return
	}
	m.writeOp(rt, d, label, rapid.SampledFrom(harnessRecords).Draw(rt, label+"record"), -1)
}

// writeOp performs app write op (as write draws it, or -1 to draw it) on
// record id, and returns the content it wrote if it wrote a whole record.
func (m *model) writeOp(rt *rapid.T, d *hdevice, label, id string, op int) (content string) {
	d.observe(rt)
	cur, exists := d.local(rt, id)
	d.seq++
	val := fmt.Sprintf("%s#%d", d.name, d.seq)
	if l := d.remote.w.limits; l.MaxFileSize > 0 && l.MaxFileSize < l.MaxExpandedSize {
		// Values that barely compress fill files up to the compressed
		// limit.
		sum := sha512.Sum512([]byte(val))
		val += "~" + hex.EncodeToString(sum[:48])
	}
	written := map[string]string{}
	ops := 9
	if exists && m.batches {
		ops = 15 // long runs of key additions and removals
	}
	if op < 0 {
		op = rapid.IntRange(0, ops).Draw(rt, label+"op")
	}
	switch {
	case op >= 10:
		m.batch(rt, d, id, val, op%2 == 0)
		return ""
	case op == 0 && exists: // physical delete
		d.remove(rt, id)
		written[""] = ""
		// The device's own writes to the record that it had not sent yet
		// go with its row: if another device's edit brings the record
		// back, it comes back as the others last had it.
		for p, h := range m.hist[id] {
			if p != "" && h[len(h)-1].device == d.name {
				h[len(h)-1].sawAll = false
			}
		}
	case op <= 2 || !exists: // create or replace whole
		content = d.create(rt, id, val)
		if !exists && !d.remote.w.ordinary && m.receivedLastDelete(d, id) && !m.deleteUnsent(rt, d, id) {
			m.creates[id] = append(m.creates[id], &modelCreate{device: d.name, key: val, value: val + "k"})
		}
		written = map[string]string{"a": val + "a", "b": val + "b", "n.x": val + "x", "n.y": "", "deleted_at": ""}
	default: // one field
		p := rapid.SampledFrom(harnessPaths).Draw(rt, label+"path")
		if d.remote.w.limits == (Limits{}) && rapid.IntRange(0, 24).Draw(rt, label+"large") == 0 {
			// Larger than the 64 KiB a decoder allows around a value:
			// a device's own file, decoded again when it recovers its
			// outbox, once failed on such a value for good.
			val += strings.Repeat("~", 80<<10)
			count("write: a value over 64 KiB")
		}
		d.setPath(rt, id, p, val)
		written[p] = val
		if m.lastEvent(id).device != d.name && m.lastEvent(id).deleted {
			count("write: an edit of a record another device deleted")
		}
	}
	rt.Logf("%s: write %s %v (had %v, exists %v)", d.name, id, written, cur, exists)
	m.noteEvent(d, id, op == 0 && exists)
	if content != "" && !d.remote.w.ordinary {
		d.seen[val+"k"] = true
	}
	if m.hist[id] == nil {
		m.hist[id] = map[string][]modelWrite{}
	}
	for p, v := range written {
		saw := true
		for q, h := range m.hist[id] {
			if p != "" && q != p {
				continue // a write conflicts with earlier writes of its path, a delete with any
			}
			for _, x := range h {
				if x.device != d.name && (x.value == "" || !d.seen[x.value]) {
					saw = false // a removal or delete leaves no value to observe: treat as unseen
				}
			}
		}
		m.seq++
		m.hist[id][p] = append(m.hist[id][p], modelWrite{seq: m.seq, device: d.name, value: v, sawAll: saw})
		if v != "" {
			d.seen[v] = true
		}
	}
	return content
}

// checkCreates checks, on a device at quiescence, that every create that
// no later delete or informed write may have ended kept its own key.
func (m *model) checkCreates(rt *rapid.T, d *hdevice) {
	for _, id := range slices.Sorted(maps.Keys(m.creates)) {
		for _, c := range m.creates[id] {
			if c.spoiled {
				continue
			}
			count("creates checked against later creates that had not seen them")
			var got sql.NullString
			err := d.db.QueryRow(`SELECT j.value FROM notes, json_each(json(notes.content), '$.k') AS j WHERE notes.id = ? AND j.key = ?`, id, c.key).Scan(&got)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				rt.Fatal(err)
			}
			if got.String != c.value {
				rt.Fatalf("lost create: %s.k.%s = %q, want %q: %s created the record after its last delete, and no later write had seen that create", id, c.key, got.String, c.value, c.device)
			}
		}
	}
}

func runSchedule(t *testing.T, rt *rapid.T, b backend) {
	count("schedules")
	dir, err := os.MkdirTemp("", "drivesync-harness")
	if err != nil {
		rt.Fatal(err)
	}
	defer os.RemoveAll(dir)
	w := &world{
		mem:     NewMemoryRemote(),
		rng:     rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 1)),
		hidden:  map[string]map[string]hiddenFile{},
		damaged: map[string]map[string]damage{},
		hostile: map[string]bool{},
		gens:    map[string]map[string]int64{},
	}
	// The remote clock starts within a month of a month's end, and every
	// device compacts with a retention of hours.
	monthEnd := time.Date(2026, time.Month(rapid.IntRange(1, 12).Draw(rt, "month")+1), 1, 0, 0, 0, 0, time.UTC)
	w.start = monthEnd.Add(-time.Duration(rapid.IntRange(1, 30*24).Draw(rt, "hoursToMonthEnd")) * time.Hour)
	w.began, w.virtual = time.Now(), !b.drive && b.ext == nil
	if b.ext != nil {
		// An external server's clock is the real one: the schedule's
		// starts after it (see shift).
		for w.start.Before(w.began) {
			w.start = w.start.AddDate(1, 0, 0)
		}
	}
	w.tick = time.Millisecond
	if rapid.IntRange(0, 3).Draw(rt, "fastClock") == 0 {
		w.tick = time.Microsecond
		count("schedules whose remote clock moves a microsecond per reading")
	}
	w.mem.SetClock(w.now)
	w.retention = time.Duration(rapid.IntRange(1, 24).Draw(rt, "retentionHours")) * time.Hour
	rt.Logf("remote clock starts at %v; retention %v", w.start.Format(time.RFC3339), w.retention)
	// A quarter of the schedules run a store with small limits, and
	// write batches of keys that they later remove: clocks outgrow the
	// record limit, and snapshots must be refused, not compacted on; a
	// sync's changes outgrow a patch file and go out in several.
	smallLimits := rapid.IntRange(0, 3).Draw(rt, "smallLimits") == 0
	if smallLimits {
		w.limits = Limits{MaxRecordSize: 1024, MaxExpandedSize: 1536, MaxFileSize: 1536}
		if rapid.Bool().Draw(rt, "compressedLimit") {
			// The compressed size binds: files fill up to it, and an
			// encrypted file is larger than what it holds.
			w.limits.MaxExpandedSize, w.limits.MaxFileSize = 64<<10, 1024
			count("schedules whose compressed file limit binds")
		}
		count("schedules with a small record limit")
		rt.Logf("store record limit %d", w.limits.MaxRecordSize)
	}
	if w.ordinary = rapid.IntRange(0, 2).Draw(rt, "ordinary") == 0; w.ordinary {
		count("schedules with an ordinary table (composite key, BLOBs, NULLs)")
		if w.nocase = rapid.Bool().Draw(rt, "nocase"); w.nocase {
			count("schedules whose ordinary key column is declared COLLATE NOCASE")
		}
	}
	if w.strict = rapid.IntRange(0, 2).Draw(rt, "strict") == 0; w.strict {
		count("schedules with a strict table, NOT NULL projections")
		if w.checked = rapid.Bool().Draw(rt, "checked"); w.checked {
			count("schedules where dev-0's table CHECKs values of others")
		}
	}
	switch {
	case b.drive:
		count("schedules over Drive")
		w.drive = drivefake.New(t) // Drive's clock is shared: no skew
		w.drive.SetClock(w.now)
	case b.ext != nil:
		count("schedules over " + b.ext.Name)
		if w.ext, err = b.ext.NewStore(); err != nil {
			rt.Fatal(err)
		}
		var ss HarnessServerStore
		if ss, w.server = w.ext.(HarnessServerStore); w.server && smallLimits {
			ss.SmallLimits()
			count("schedules on a server with small limits")
		}
	default:
		w.folder = rapid.Bool().Draw(rt, "folder")
	}
	// A quarter of the schedules run an encrypted store; half of those
	// change its key in the middle. On a sync server an encrypted store
	// keeps files, which the devices merge: its schedules are file
	// schedules, through the server's Remote.
	w.rotateAt = -1
	if rapid.IntRange(0, 3).Draw(rt, "encrypted") == 0 {
		if w.server {
			w.server = false
			count("schedules of an encrypted store on a sync server's files")
			if smallLimits {
				count("schedules of an encrypted store on a sync server's files, with small limits")
				// Its file limit refuses every snapshot: a file that
				// vanishes has nothing to be healed from.
				w.noSnapshots = true
			}
		}
		w.keys = []Key{Passphrase("harness key 1")}
		count("schedules of an encrypted store")
		if rapid.Bool().Draw(rt, "rotate") {
			w.rotateAt = rapid.IntRange(0, 30).Draw(rt, "rotateAt")
			w.catchUpAt = w.rotateAt + rapid.IntRange(0, 8).Draw(rt, "catchUpAfter")
		}
	}
	var devs []*hdevice
	defer func() {
		for _, d := range devs {
			if d.db != nil {
				d.db.Close()
			}
		}
	}()
	// addDevice adds a device that has not opened its database yet.
	addDevice := func() *hdevice {
		name := fmt.Sprintf("dev-%d", len(devs))
		w.mu.Lock()
		w.devs = append(w.devs, name)
		w.hidden[name] = map[string]hiddenFile{}
		w.damaged[name] = map[string]damage{}
		w.mu.Unlock()
		var skew time.Duration
		if w.folder {
			m := int(maxSkew.Minutes())
			skew = time.Duration(rapid.IntRange(-m, m).Draw(rt, "skew")) * time.Minute
			if skew != 0 {
				count("fault clock skew")
				rt.Logf("%s: clock off by %v", name, skew)
			}
		}
		var base Remote = w.mem
		var srv Server
		if w.server {
			var err error
			for range 10 {
				if srv, err = w.ext.(HarnessServerStore).OpenServer(); err == nil {
					break
				}
			}
			if err != nil {
				rt.Fatal(err)
			}
		} else if b.ext != nil {
			// A device that joins mid-schedule may meet faults queued
			// for the others: it tries again, as an app would.
			var err error
			for range 10 {
				if base, err = w.ext.Open(); err == nil {
					break
				}
			}
			if err != nil {
				rt.Fatal(err)
			}
		}
		if b.drive {
			ctx := context.Background()
			// A device that joins mid-schedule may meet the HTTP faults
			// queued for the others: it tries again, as an app would.
			var dr *DriveRemote
			var err error
			for range 10 {
				if dr, err = NewDriveRemote(ctx, w.drive.Service(ctx, t), DriveOptions{MinSleep: time.Millisecond, MaxSleep: 4 * time.Millisecond, MaxAttempts: 4}); err == nil {
					break
				}
			}
			if err != nil {
				rt.Fatal(err)
			}
			base = dr
		}
		d := &hdevice{name: name, path: filepath.Join(dir, name+".db"), seen: map[string]bool{}}
		d.remote = &harnessRemote{w: w, base: base, device: name, skew: skew}
		d.cfg = Config{Remote: d.remote, Tables: harnessTables(false), DeviceID: name, TempDir: dir, Retention: w.retention, Limits: w.limits}
		d.cfg.Progress = func(Progress) {} // see meterAway
		if w.keys != nil {
			d.cfg.Encryption, d.cfg.PreviousKeys = w.keys[0], w.keys[1:]
			if w.rotating { // the old key only, until catchUp
				d.cfg.Encryption, d.cfg.PreviousKeys = w.keys[len(w.keys)-1], nil
			}
		}
		if srv != nil {
			d.cfg.Remote, d.cfg.Server = nil, &harnessServer{r: d.remote, base: srv}
		}
		// A third of the schedules put their first device on a second
		// SQLite driver.
		if haveCgo && len(devs) == 0 && rapid.IntRange(0, 2).Draw(rt, "mattn") == 0 {
			d.mattn = true
			count("devices on the mattn/go-sqlite3 driver")
		}
		if d.dropTriggers = rapid.Bool().Draw(rt, "dropTriggers"); d.dropTriggers {
			count("devices whose syncs drop the capture triggers while they write")
		}
		devs = append(devs, d)
		return d
	}
	for range rapid.IntRange(2, 5).Draw(rt, "devices") {
		addDevice().open(rt)
	}
	m := &model{hist: map[string]map[string][]modelWrite{}, creates: map[string][]*modelCreate{}, devs: &devs, extra: extraModel{facts: map[factKey]map[string]string{}}, batches: !w.ordinary && (smallLimits || rapid.IntRange(0, 3).Draw(rt, "batches") == 0)}
	// Interleaved syncs run without crashes or app writes: the devices'
	// state during them is the schedule's, which a crash would undo.
	nested := false
	w.interleave = func(reader string) {
		if nested {
			return
		}
		w.mu.Lock()
		i, snapshot := w.rng.IntN(len(devs)), w.rng.IntN(2) == 0
		w.mu.Unlock()
		d := devs[i]
		if d.name == reader || d.eng == nil {
			return
		}
		nested = true
		defer func() { nested = false }()
		var r Report
		var err error
		if snapshot {
			r, err = d.eng.Snapshot(context.Background())
		} else {
			r, err = d.eng.Sync(context.Background())
		}
		rt.Logf("  (while %s syncs) %s: Snapshot %v -> downloaded %v, snapshot %q, deleted %d, err %v", reader, d.name, snapshot, r.Downloaded, r.Snapshot, r.Deleted, err)
		if r.Deleted > 0 {
			count("compactions while another device reads a snapshot")
			w.compacted = true
		}
	}
	w.faults = true
	// A device goes offline across two compactions in about a quarter of
	// the schedules (it takes several syncs), and at most two devices
	// join mid-schedule.
	joined, offlineDone := 0, rapid.IntRange(0, 2).Draw(rt, "offlineSchedule") != 0
	steps := rapid.IntRange(5, 40).Draw(rt, "steps")
	for i := range steps {
		if i == w.rotateAt {
			rotate(rt, w, devs)
		}
		if i == w.catchUpAt {
			catchUp(rt, w, devs)
		}
		d := devs[rapid.IntRange(0, len(devs)-1).Draw(rt, "device")]
		label := fmt.Sprint(i)
		if w.drive != nil && w.rng.Float64() < 0.3 {
			w.drive.Fail(driveFaults[w.rng.IntN(len(driveFaults))])
			count("fault drive http")
		}
		if w.ext != nil {
			w.mu.Lock()
			kind := w.ext.Fault(w.rng)
			w.mu.Unlock()
			if kind != "" {
				count("fault " + kind)
			}
		}
		switch rapid.IntRange(0, 19).Draw(rt, "action") {
		case 0, 1, 2, 3:
			m.write(rt, d, label)
		case 4, 5:
			if !w.ordinary && !d.detached && rapid.IntRange(0, 7).Draw(rt, "badID") == 0 {
				// A row whose id no reader takes is not sent, and the
				// sync's other changes go out without it; the app then
				// deletes the row.
				bad := []string{"", strings.Repeat("x", merge.MaxRecordIDLen+1), "r\xff"}[rapid.IntRange(0, 2).Draw(rt, "badIDKind")]
				ins := `INSERT OR IGNORE INTO notes (id, content) VALUES (?, jsonb('{}'))`
				if w.strict {
					ins = `INSERT OR IGNORE INTO notes (id, content, a, b) VALUES (?, jsonb('{"a":"a","b":"b"}'), 'a', 'b')`
				}
				if _, err := d.db.Exec(ins, bad); err == nil {
					count("write: a row with an id no reader takes")
					d.sync(rt, "", "", nil)
					if _, err := d.db.Exec(`DELETE FROM notes WHERE id = ?`, bad); err != nil {
						rt.Fatal(err)
					}
					break
				}
			}
			d.sync(rt, "", "", nil)
		case 6, 7:
			p := rapid.SampledFrom(harnessPoints).Draw(rt, "crash")
			d.sync(rt, p, "", nil)
		case 8:
			// Before the transaction: inside it, the engine holds the
			// write lock and this goroutine would wait on itself.
			// Concurrent writers are TestConcurrentWritersDuringSync's.
			p := rapid.SampledFrom(harnessPoints[:3]).Draw(rt, "writeAt")
			id := rapid.SampledFrom(harnessRecords).Draw(rt, "writeRecord")
			if _, exists := d.local(rt, id); exists && rapid.Bool().Draw(rt, "deleteFirst") {
				// The app deletes a record and creates it again while
				// the sync that sends the delete runs. If the record was
				// synced and the sync had planned the delete, it is
				// stamped above everything the sync receives, and the
				// row ends exactly as written. Otherwise another device's
				// record of the same id may merge into it, as two
				// creations of one id do, and a creation the plan sees is
				// an edit of the synced record, which keeps the fields
				// other devices added that this one never saw. A synced
				// record the app's row never showed (received while the
				// table was unregistered, over a row the app had created
				// itself) is one of those: the app deletes its own row,
				// not that record.
				count("write during sync: a record deleted and created again")
				var synced bool
				d.db.QueryRow(`SELECT NOT s.is_deleted AND coalesce((SELECT u.base IS NOT NULL FROM sync_unwritten u WHERE u.table_name = s.table_name AND u.record_id = s.record_id), 1)
FROM sync_states s WHERE s.table_name = 'notes' AND s.record_id = ?`, w.recordID(id)).Scan(&synced)
				synced = synced && p != "fetched"
				m.writeOp(rt, d, label+"d", id, 0)
				var created string
				d.sync(rt, "", p, func() { created = m.writeOp(rt, d, label+"w", id, 1) })
				// Whatever the sync did, the app's row is what it wrote
				// (none if the sync failed before the write): no field of
				// the deleted record returns.
				row, exists := d.row(rt, id)
				if synced && (created == "" && exists || created != "" && row != created) {
					rt.Fatalf("%s: %s created again during a sync as %q, holds %q (row: %v)", d.name, id, created, row, exists)
				}
				break
			}
			d.sync(rt, "", p, func() { m.writeOp(rt, d, label+"w", id, -1) })
		case 9:
			if w.server {
				// The device forgets where its pulls stand: the server's
				// records come again, and merging them again changes
				// nothing.
				if _, err := d.db.Exec(`UPDATE sync_meta SET value = '' WHERE key = 'server_cursor'`); err != nil {
					rt.Fatal(err)
				}
				count("fault server cursor forgotten")
				break
			}
			// A file delivered again after it was applied: the device
			// forgets having applied one, or checked a snapshot (chosen
			// by the schedule's generator, so that a replay forgets the
			// same). A rejection is never forgotten: the device must
			// read that file again, and nothing but finding it gone
			// ends that.
			var k int
			if err := d.db.QueryRow(`SELECT count(*) FROM sync_files WHERE status <> 'rejected'`).Scan(&k); err != nil {
				rt.Fatal(err)
			}
			if k > 0 {
				if _, err := d.db.Exec(`DELETE FROM sync_files WHERE name = (SELECT name FROM sync_files WHERE status <> 'rejected' ORDER BY name LIMIT 1 OFFSET ?)`, w.rng.IntN(k)); err != nil {
					rt.Fatal(err)
				}
				count("fault file delivered again")
			}
		case 10, 11:
			var crashAt, writeAt string
			switch rapid.IntRange(0, 3).Draw(rt, "snapshotMode") {
			case 1:
				crashAt = rapid.SampledFrom(snapshotPoints).Draw(rt, "crash")
			case 2:
				writeAt = rapid.SampledFrom(harnessPoints[:3]).Draw(rt, "writeAt")
			}
			d.run(rt, true, crashAt, writeAt, func() { m.write(rt, d, label+"w") })
		case 12, 13:
			advanceClock(rt, w)
		case 14:
			if joined == 2 {
				m.write(rt, d, label)
				break
			}
			joined++
			joinDevice(rt, m, addDevice(), label)
		case 15:
			if offlineDone || w.server { // a server keeps every record: nothing is compacted
				d.sync(rt, "", "", nil)
				break
			}
			offlineDone = true
			offlineAcrossCompactions(rt, w, m, devs, d, label)
		case 16:
			if w.server { // no files: a server stamps its own
				d.sync(rt, "", "", nil)
				break
			}
			hostileFile(rt, w, devs, label)
		case 17:
			if !m.batches {
				d.sync(rt, "", "", nil)
				break
			}
			removalRun(rt, m, d, label)
		case 18:
			if !d.detached && rapid.Bool().Draw(rt, "createDeleteFirst") {
				// A record this device never held, created and deleted
				// before it synced: nothing to send, and once the table
				// is registered again, no delete of what others created
				// meanwhile.
				id := rapid.SampledFrom(harnessRecords).Draw(rt, "createDeleteRecord")
				var held bool
				d.db.QueryRow(`SELECT EXISTS (SELECT 1 FROM sync_states WHERE table_name = 'notes' AND record_id = ?)`, w.recordID(id)).Scan(&held)
				if _, exists := d.local(rt, id); !held && !exists {
					m.writeOp(rt, d, label+"c", id, 1)
					m.writeOp(rt, d, label+"d", id, 0)
					count("table unregistered over a record created and deleted unsynced")
				}
			}
			d.setDetached(rt, !d.detached)
		case 19:
			if w.server || w.noSnapshots {
				d.sync(rt, "", "", nil)
				break
			}
			vanishFile(rt, w, devs)
		}
	}
	// Quiescence: no faults, every file visible, sync until nothing moves.
	if w.drive != nil {
		w.drive.ClearFaults()
	}
	if w.ext != nil {
		w.ext.ClearFaults()
	}
	w.mu.Lock()
	w.faults = false
	for _, h := range w.hidden {
		clear(h)
	}
	for _, dm := range w.damaged {
		clear(dm)
	}
	w.mu.Unlock()
	for _, d := range devs {
		if d.detached {
			d.setDetached(rt, false)
		}
	}
	// Every device has the keys by now, and every rejected file is due
	// to be read again.
	catchUp(rt, w, devs)
	w.advance(rejectRetryMax + time.Hour)
	quiesce(rt, w, devs, true)
	if fixed := fixRefused(rt, m, devs); fixSlots(rt, devs) || fixed {
		quiesce(rt, w, devs, false)
	}
	if !w.server {
		checkLedgers(rt, w, devs)
	}
	quiesce(rt, w, devs, false)
	// One more device joins now: it starts from the newest snapshot and
	// the files after it, and must hold exactly what the others hold.
	late := addDevice()
	late.open(rt)
	rt.Logf("%s: joins after quiescence", late.name)
	r, err := late.run(rt, false, "", "", nil)
	if err != nil || r.ChangesSent > 0 || len(w.rejectedUnexpectedly(r)) > 0 {
		rt.Fatalf("%s: joining after quiescence: %+v, %v", late.name, r, err)
	}
	checkConverged(rt, devs, m)
}

// checkLedgers checks that each device's record of applied files stays
// bounded by what the remote holds: in a new month, each device syncs once
// and must then remember no file the remote had already lost before.
func checkLedgers(rt *rapid.T, w *world, devs []*hdevice) {
	list := func() map[string]bool {
		files, err := devs[0].remote.base.List(context.Background(), time.Time{})
		for range 10 {
			if err == nil {
				break
			}
			files, err = devs[0].remote.base.List(context.Background(), time.Time{})
		}
		if err != nil {
			rt.Fatal(err)
		}
		names := map[string]bool{}
		for _, f := range files {
			names[f.Name] = true
		}
		return names
	}
	// A month no device has reached by its own clock (one running ahead
	// may be in the next month already, and have pruned for it), and past
	// every device's skew into it.
	y, mo, _ := w.now().Add(*maxSkew).Date()
	w.advance(time.Date(y, mo+1, 1, 1, 0, 0, 0, time.UTC).Add(*maxSkew).Sub(w.now()))
	before := list()
	// Twice: Drive's clock, as a device estimates it, catches up with the
	// jump only on the first answer after it.
	for range 2 {
		for _, d := range devs {
			if _, err := d.eng.Sync(context.Background()); err != nil {
				rt.Fatalf("%s: sync without faults: %v", d.name, err)
			}
		}
	}
	after := list()
	for _, d := range devs {
		rows, err := d.db.Query(`SELECT name FROM sync_files WHERE status IN ('applied', 'checked')`)
		if err != nil {
			rt.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var name string
			rows.Scan(&name)
			n++
			if !before[name] && !after[name] {
				rows.Close()
				rt.Fatalf("%s: remembers %s, which the remote no longer had when the month began", d.name, name)
			}
		}
		rows.Close()
		countN("ledger rows checked against the remote", n)
	}
}

// advanceClock moves the remote's clock ahead: within the list overlap,
// past it, past the retention, by days, or into the next month.
func advanceClock(rt *rapid.T, w *world) {
	minutes := func(lo, hi int) time.Duration {
		return time.Duration(rapid.IntRange(lo, hi).Draw(rt, "minutes")) * time.Minute
	}
	before := w.now()
	var d time.Duration
	switch rapid.IntRange(0, 4).Draw(rt, "advance") {
	case 0:
		d = minutes(1, 14)
		count("clock ahead minutes")
	case 1:
		d = minutes(15, 180)
		count("clock ahead hours")
	case 2:
		d = minutes(3*60, 48*60)
		count("clock ahead hours to days")
	case 3:
		d = minutes(2*24*60, 12*24*60)
		count("clock ahead days")
	case 4:
		y, mo, _ := before.Date()
		d = time.Date(y, mo+1, 1, 0, 0, 0, 0, time.UTC).Add(minutes(0, 90)).Sub(before)
		count("clock ahead to next month")
	}
	w.advance(d)
	after := w.now()
	if after.Month() != before.Month() {
		count("clock crossed a month")
	}
	rt.Logf("clock +%v: %v", d, after.Format(time.RFC3339))
}

// joinDevice opens a brand-new device mid-schedule, sometimes with rows
// of its own written before the engine first opened the database, and
// syncs it: it bootstraps from the newest snapshot, if there is one.
func joinDevice(rt *rapid.T, m *model, d *hdevice, label string) {
	count("devices joined")
	d.openDB(rt)
	own := rapid.IntRange(0, 2).Draw(rt, "ownRows")
	for j := range own {
		m.write(rt, d, fmt.Sprintf("%sj%d", label, j))
	}
	if own > 0 {
		count("devices joined with rows of their own")
	}
	d.openEngine(rt)
	crashAt := ""
	if rapid.IntRange(0, 3).Draw(rt, "joinCrash") == 0 {
		crashAt = rapid.SampledFrom(snapshotPoints).Draw(rt, "crash")
	}
	rt.Logf("%s: joins with %d rows of its own", d.name, own)
	d.sync(rt, crashAt, "", nil)
}

// offlineAcrossCompactions: d writes and goes offline (sometimes with its
// last upload held in its outbox), two compactions run while the clock
// passes the retention, and d syncs again: it must load the newest
// snapshot, and its writes must still reach everyone.
func offlineAcrossCompactions(rt *rapid.T, w *world, m *model, devs []*hdevice, d *hdevice, label string) {
	var others []*hdevice
	for _, o := range devs {
		if o != d {
			others = append(others, o)
		}
	}
	count("devices offline across compactions")
	rt.Logf("%s: goes offline", d.name)
	for j := range rapid.IntRange(1, 3).Draw(rt, "offlineWrites") {
		m.write(rt, d, fmt.Sprintf("%so%d", label, j))
	}
	if rapid.Bool().Draw(rt, "heldUpload") {
		d.remote.failPatches = true
		rt.Logf("%s: its patch uploads fail", d.name)
		d.sync(rt, "", "", nil)
		d.remote.failPatches = false
		for j := range rapid.IntRange(0, 2).Draw(rt, "offlineWrites") {
			m.write(rt, d, fmt.Sprintf("%sp%d", label, j))
		}
	}
	for round := range 2 {
		w.advance(w.retention + time.Duration(rapid.IntRange(1, 48).Draw(rt, "hours"))*time.Hour)
		o := others[rapid.IntRange(0, len(others)-1).Draw(rt, "other")]
		if rapid.Bool().Draw(rt, "otherWrites") {
			m.write(rt, o, fmt.Sprintf("%sr%d", label, round))
		}
		o.run(rt, true, "", "", nil)
		// Once that snapshot is older than ListOverlap, a sync of its
		// writer or anyone's Snapshot compacts with it.
		w.advance(DefaultListOverlap + time.Duration(rapid.IntRange(1, 120).Draw(rt, "minutes"))*time.Minute)
		o = others[rapid.IntRange(0, len(others)-1).Draw(rt, "other")]
		snapshot := rapid.Bool().Draw(rt, "snapshot")
		crashAt := rapid.SampledFrom([]string{"", "", "compacting", "snapshot uploaded"}).Draw(rt, "crash")
		o.run(rt, snapshot, crashAt, "", nil)
	}
	rt.Logf("%s: back online", d.name)
	if w.drive != nil && d.remote.heldUploads > 0 {
		// Its first upload, the held one, meets a 503 and is retried
		// from the outbox's stored bytes.
		w.drive.Fail(drivefake.Fault{Method: "POST", PathPrefix: "/upload/drive/v3/files", Status: http.StatusServiceUnavailable, Times: 1})
		count("fault drive 503 on a held upload's retry")
	}
	d.sync(rt, "", "", nil)
}

// fixRefused has dev-0 write again every record its CHECK keeps
// unwritten, as its app would, and reports whether there was any.
func fixRefused(rt *rapid.T, m *model, devs []*hdevice) bool {
	d := devs[0]
	// (A key with a NUL character has no row any app could write.)
	ids := slices.DeleteFunc(d.unwritten(rt, "notes"), func(id string) bool { return strings.Contains(id, "\x00") })
	for _, record := range ids {
		id := d.remote.w.harnessID(record)
		count("quiesce: a row dev-0's CHECK refused, written again by dev-0")
		m.writeOp(rt, d, "fix"+id, id, 1) // the whole row, with dev-0's values
	}
	return len(ids) > 0
}

// unwritten returns the record ids of table that d's table refused, in
// order.
func (d *hdevice) unwritten(rt *rapid.T, table string) []string {
	rows, err := d.db.Query(`SELECT record_id FROM sync_unwritten WHERE table_name = ?1 ORDER BY record_id`, table)
	if err != nil {
		rt.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		rows.Scan(&id)
		ids = append(ids, id)
	}
	return ids
}

// quiesce syncs every device until nothing moves. refusals allows rows
// refused by dev-0's CHECK (fixRefused writes them again), and items of
// slots that concurrent moves put on one place (fixSlots moves them).
func quiesce(rt *rapid.T, w *world, devs []*hdevice, refusals bool) {
	for round := 0; round < 12; round++ {
		moved := false
		for _, d := range devs {
			r, err := d.eng.Sync(context.Background())
			rt.Logf("quiesce: %s: sync -> downloaded %v, uploaded %q, sent %d, recovered %q, snapshot %q, deleted %d, skipped %v", d.name, r.Downloaded, r.Uploaded, r.ChangesSent, r.Recovered, r.Snapshot, r.Deleted, r.Skipped)
			if err != nil {
				rt.Fatalf("%s: sync without faults: %v", d.name, err)
			}
			if r.ChangesSent > 0 || r.Recovered != "" || len(r.Downloaded) > 0 || r.ChangesReceived > 0 || r.Snapshot != "" {
				moved = true
			}
			for _, u := range r.Unwritten {
				// Every file is visible now: no record may be partial,
				// and no table refuse a row, after a first round, but
				// for a row dev-0's CHECK refuses. A file that vanished
				// takes longer: its holder finds it gone in the first or
				// second round (over Drive, a device's estimate of the
				// clock catches up with a jump only at its second sync,
				// and with it the daily listing of everything), and the
				// others load the snapshot it writes in the next.
				// An append-only conflict is reported at every sync
				// (checkExtra checks which).
				if round > 0 && !(w.vanished && round <= 2) && !errors.Is(u.Err, ErrImmutableConflict) && !(refusals && d == devs[0] && strings.Contains(u.Err.Error(), "CHECK constraint failed")) &&
					!(refusals && strings.Contains(u.Err.Error(), "UNIQUE constraint failed: slots.pos")) &&
					!strings.Contains(u.Err.Error(), "holds a NUL character") {
					rt.Fatalf("%s: rows the tables refused: %v", d.name, r.Unwritten)
				}
			}
			for _, f := range w.rejectedUnexpectedly(r) {
				// A file ahead of a device's clock estimate (Drive's,
				// stale for a moment after the clock jumped) is read
				// again once the clock gets there: keep syncing.
				var ahead *versionsAheadError
				if !errors.As(f.Err, &ahead) || round == 11 {
					rt.Fatalf("%s: rejected %v", d.name, f)
				}
				count("quiesce: a file ahead of a device's clock estimate")
				moved = true
			}
		}
		if !moved {
			return
		}
	}
	rt.Fatal("no quiescence after 12 rounds")
}

func checkConverged(rt *rapid.T, devs []*hdevice, m *model) {
	w := devs[0].remote.w
	notesDump := w.notesDump()
	dump := func(d *hdevice) string {
		var b strings.Builder
		for _, q := range []string{
			`SELECT table_name, record_id, record_data, clock, sync_version, device_id, is_deleted FROM sync_states ORDER BY 1, 2`,
			notesDump,
			`SELECT quote(id), quote(pos), quote(moves) FROM slots ORDER BY id`,
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
		// No record is ever partial: every write of the harness keeps a
		// and b, so a record shown without them was re-created in part.
		var partial, unwritten, stray int
		d.db.QueryRow(`SELECT count(*) FROM sync_states WHERE table_name = 'notes' AND NOT is_deleted
	AND (json_extract(record_data, '$.a') IS NULL OR json_extract(record_data, '$.b') IS NULL)`).Scan(&partial)
		d.db.QueryRow(`SELECT count(*) FROM sync_states s WHERE table_name = 'notes' AND NOT is_deleted
	AND instr(s.record_id, char(0)) = 0 AND NOT EXISTS (SELECT 1 FROM notes c WHERE ` + w.keyOf("c") + ` = s.record_id)`).Scan(&unwritten)
		d.db.QueryRow(`SELECT count(*) FROM notes c WHERE NOT EXISTS (SELECT 1 FROM sync_states s
	WHERE s.table_name = 'notes' AND s.record_id = ` + w.keyOf("c") + ` AND NOT s.is_deleted)`).Scan(&stray)
		if partial+unwritten+stray > 0 {
			rt.Fatalf("%s: %d records shown in part, %d synced records missing from the table, %d rows not synced", d.name, partial, unwritten, stray)
		}
		// Every item of slots is where its synced record puts it: the
		// synced places are distinct now, so no order of writes stops
		// a device from showing them all.
		var slots, unlike int
		d.db.QueryRow(`SELECT count(*), count(*) FILTER (WHERE c.pos IS NOT s.record_data ->> '$.pos' OR c.moves IS NOT s.record_data ->> '$.moves')
	FROM sync_states s LEFT JOIN slots c ON quote(c.id) = s.record_id WHERE s.table_name = 'slots' AND NOT s.is_deleted`).Scan(&slots, &unlike)
		d.db.QueryRow(`SELECT count(*) FROM slots c WHERE NOT EXISTS (SELECT 1 FROM sync_states s
	WHERE s.table_name = 'slots' AND s.record_id = quote(c.id) AND NOT s.is_deleted)`).Scan(&stray)
		if unlike+stray > 0 {
			rt.Fatalf("%s: %d of %d items of slots not where their synced records put them, %d not synced", d.name, unlike, slots, stray)
		}
		countN("slots items checked at quiescence", slots)
	}
	for _, d := range devs {
		if got := dump(d); got != want {
			rt.Fatalf("%s diverged from %s:\n%s\nvs\n%s", d.name, devs[0].name, got, want)
		}
		var pending int
		var integrity string
		d.db.QueryRow(`SELECT count(*) FROM ` + pendingUnion).Scan(&pending)
		d.db.QueryRow(`PRAGMA integrity_check`).Scan(&integrity)
		if pending != 0 || integrity != "ok" {
			rt.Fatalf("%s: %d pending, integrity %q", d.name, pending, integrity)
		}
		// Every file a device had not received, vanished or not, was
		// healed by a snapshot.
		if st, err := d.eng.Status(context.Background()); err != nil || len(st.Missing) > 0 {
			rt.Fatalf("%s: files missing after quiescence: %v (Status: %v)", d.name, st.Missing, err)
		}
	}
	checkExtra(rt, devs, m)
	m.checkCreates(rt, devs[0])
	for _, id := range slices.Sorted(maps.Keys(m.hist)) {
		final, present := devs[0].local(rt, id)
		last := 0
		for _, h := range m.hist[id] {
			last = max(last, h[len(h)-1].seq)
		}
		if h := m.hist[id][""]; len(h) > 0 && h[len(h)-1].seq == last && h[len(h)-1].sawAll {
			count("deletes checked")
			if present {
				rt.Fatalf("lost delete: %s = %v, deleted last by %s, who had seen every earlier write", id, final, h[len(h)-1].device)
			}
		}
		if !present {
			continue // hidden under a tombstone: its fields are in sync_states, checked for divergence
		}
		for _, p := range harnessPaths {
			h := m.hist[id][p]
			if len(h) == 0 {
				continue
			}
			// The last write of a path, a value or a removal, by a device
			// that had seen every earlier write of it, holds.
			if wr := h[len(h)-1]; wr.sawAll {
				count("updates checked")
				if final[p] != wr.value {
					rt.Fatalf("lost update: %s.%s = %q, want %q (last written by %s, who had seen every earlier write)", id, p, final[p], wr.value, wr.device)
				}
			}
		}
	}
}

// smallReads returns at most 97 bytes per Read.
type smallReads struct{ io.ReadCloser }

func (r smallReads) Read(p []byte) (int, error) { return r.ReadCloser.Read(p[:min(len(p), 97)]) }

// meterAway counts the progress updates made off the syncing goroutine,
// where Config.Progress promises to run; every one is checked, whether
// the rate limit lets it through to Progress or not. The harness fails a
// schedule that makes one.
var meterAway atomic.Int64

func init() {
	meterHook = func(*Engine) {
		count("progress updates checked to be on the syncing goroutine")
		if !onSyncingGoroutine() {
			meterAway.Add(1)
		}
	}
}

// onSyncingGoroutine reports whether the caller runs on the goroutine of
// an Engine's sync (Sync, Snapshot, JoinRemote...), where Config.Progress
// promises to run: its stack holds Engine.run.
func onSyncingGoroutine() bool {
	buf := make([]byte, 16<<10)
	return bytes.Contains(buf[:runtime.Stack(buf, false)], []byte("drivesync.(*Engine).run("))
}
