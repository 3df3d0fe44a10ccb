package drivesync_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drivesync/drivesync"
	_ "modernc.org/sqlite"
)

// A note-taking device for tests of the public API: its own database file
// with a notes table, and an Engine on it.
type notesDevice struct {
	t    *testing.T
	name string
	db   *sql.DB
	eng  *drivesync.Engine
}

func newNotesDevice(t *testing.T, name string, remote drivesync.Remote) *notesDevice {
	t.Helper()
	db, eng := openNotes(t, name, drivesync.Config{Remote: remote})
	return &notesDevice{t: t, name: name, db: db, eng: eng}
}

// openNotes opens a new database with a notes table (id TEXT PRIMARY
// KEY, content JSONB), and an Engine on it that syncs notes as device
// name, with cfg's remote or server and progress.
func openNotes(t *testing.T, name string, cfg drivesync.Config) (*sql.DB, *drivesync.Engine) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cfg.Tables, cfg.DeviceID, cfg.TempDir = []drivesync.Table{{Name: "notes"}}, name, t.TempDir()
	eng, err := drivesync.Open(context.Background(), db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return db, eng
}

func (d *notesDevice) put(id, title string) {
	d.t.Helper()
	if _, err := d.db.Exec(`INSERT OR REPLACE INTO notes (id, content) VALUES (?1, jsonb_object('title', ?2))`, id, title); err != nil {
		d.t.Fatal(err)
	}
}

func (d *notesDevice) sync() drivesync.Report {
	d.t.Helper()
	r, err := d.eng.Sync(context.Background())
	if err != nil {
		d.t.Fatalf("%s: Sync: %v", d.name, err)
	}
	return r
}

// notes returns the device's notes as "id=title", sorted.
func (d *notesDevice) notes() []string {
	d.t.Helper()
	rows, err := d.db.Query(`SELECT id, content ->> 'title' FROM notes ORDER BY id`)
	if err != nil {
		d.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, title string
		if err := rows.Scan(&id, &title); err != nil {
			d.t.Fatal(err)
		}
		out = append(out, id+"="+title)
	}
	return out
}

func (d *notesDevice) wantNotes(want ...string) {
	d.t.Helper()
	if got := d.notes(); !slices.Equal(got, want) {
		d.t.Errorf("%s: notes %v, want %v", d.name, got, want)
	}
}

// removeFromFolder deletes a file from a shared folder behind the
// engines' backs, as a sync tool that loses it or a user cleaning the
// folder does.
func removeFromFolder(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(dir, filepath.FromSlash(name))); err != nil {
		t.Fatal(err)
	}
}

// A patch file that vanishes from a shared folder before another device
// read it reaches that device anyway: its writer finds it gone at its next
// sync, reports it, and writes a snapshot that holds it, which the device
// that missed it loads.
func TestVanishedPatchReachesTheDeviceThatMissedIt(t *testing.T) {
	dir := t.TempDir()
	a := newNotesDevice(t, "laptop", newFolderRemote(t, dir))
	b := newNotesDevice(t, "desktop", newFolderRemote(t, dir))
	a.put("n1", "first")
	a.sync()
	b.sync()
	a.put("n2", "second")
	lost := a.sync().Uploaded
	removeFromFolder(t, dir, lost)
	if r := b.sync(); len(r.Missing) != 0 || len(r.Downloaded) != 0 {
		t.Errorf("desktop before anything said the file was lost: %+v", r)
	}
	r := a.sync()
	if want := []drivesync.FileSpan{{Device: "laptop", First: 2, Last: 2}}; !slices.Equal(r.Vanished, want) || r.Snapshot == "" {
		t.Errorf("laptop's sync after its file vanished: Vanished %v, Snapshot %q; want %v and a snapshot", r.Vanished, r.Snapshot, want)
	}
	if got := b.sync(); !slices.Contains(got.Downloaded, r.Snapshot) {
		t.Errorf("desktop downloaded %v, want the snapshot %s that holds the lost file", got.Downloaded, r.Snapshot)
	}
	b.wantNotes("n1=first", "n2=second")
	// Nothing is reported lost or missing once it healed.
	for _, d := range []*notesDevice{a, b} {
		if r := d.sync(); len(r.Vanished)+len(r.Missing) != 0 || r.Snapshot != "" {
			t.Errorf("%s: after healing: Vanished %v, Missing %v, Snapshot %q", d.name, r.Vanished, r.Missing, r.Snapshot)
		}
	}
}

// A device that received an earlier and a later file of another device
// but not one between them reports that one missing, in its Report and
// its Status, until a snapshot that holds it arrives.
func TestMissingFileReportedUntilASnapshotHoldsIt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := newNotesDevice(t, "laptop", newFolderRemote(t, dir))
	b := newNotesDevice(t, "desktop", newFolderRemote(t, dir))
	a.put("n0", "zeroth")
	a.sync()
	b.sync()
	a.put("n1", "first")
	lost := a.sync().Uploaded
	a.put("n2", "second")
	a.sync()
	removeFromFolder(t, dir, lost)
	want := []drivesync.FileSpan{{Device: "laptop", First: 2, Last: 2}}
	if r := b.sync(); !slices.Equal(r.Missing, want) {
		t.Errorf("desktop's Report.Missing = %v, want %v", r.Missing, want)
	}
	if st, err := b.eng.Status(ctx); err != nil || !slices.Equal(st.Missing, want) {
		t.Errorf("desktop's Status.Missing = %v (err %v), want %v", st.Missing, err, want)
	}
	b.wantNotes("n0=zeroth", "n2=second")
	a.sync() // finds its file gone: a snapshot
	if r := b.sync(); len(r.Missing) != 0 {
		t.Errorf("desktop still misses %v after the snapshot", r.Missing)
	}
	if st, err := b.eng.Status(ctx); err != nil || len(st.Missing) != 0 {
		t.Errorf("desktop's Status.Missing = %v (err %v) after the snapshot, want none", st.Missing, err)
	}
	b.wantNotes("n0=zeroth", "n1=first", "n2=second")
}

// A device that read a file before it vanished heals it for the others
// when its writer never syncs again.
func TestVanishedFileHealedByAReaderWhenItsWriterIsGone(t *testing.T) {
	dir := t.TempDir()
	a := newNotesDevice(t, "laptop", newFolderRemote(t, dir))
	b := newNotesDevice(t, "desktop", newFolderRemote(t, dir))
	c := newNotesDevice(t, "phone", newFolderRemote(t, dir))
	a.sync()
	b.sync()
	c.sync()
	a.put("n1", "from the laptop")
	lost := a.sync().Uploaded
	c.sync() // reads it
	removeFromFolder(t, dir, lost)
	// The laptop is gone for good; the phone notices.
	if r := c.sync(); len(r.Vanished) != 1 || r.Snapshot == "" {
		t.Errorf("phone: Vanished %v, Snapshot %q; want the laptop's file and a snapshot", r.Vanished, r.Snapshot)
	}
	b.sync()
	b.wantNotes("n1=from the laptop")
}

// A snapshot that vanishes after compaction took the files it held, while
// a device was away, reaches that device anyway: a device that holds
// what it held writes another.
func TestVanishedSnapshotAfterCompaction(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	folder := newFolderRemote(t, dir)
	clock := time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)
	remote := &clockedRemote{Remote: folder, now: &clock}
	a := newNotesDevice(t, "laptop", remote)
	b := newNotesDevice(t, "desktop", remote)
	a.sync()
	b.sync() // then away
	for i := range 3 {
		a.put("n"+string(rune('1'+i)), "written while the desktop was away")
		a.sync()
		clock = clock.Add(time.Hour)
	}
	// Past the retention: a snapshot, then compaction on its authority.
	clock = clock.AddDate(0, 3, 0)
	r, err := a.eng.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap := r.Snapshot
	clock = clock.Add(time.Hour)
	if r, err = a.eng.Snapshot(ctx); err != nil || r.Deleted == 0 {
		t.Fatalf("compaction: %+v, %v; want files deleted", r, err)
	}
	// The newest snapshot knows the first; remove both, as a user
	// cleaning the folder would, leaving the patch files' content on no
	// file at all.
	removeFromFolder(t, dir, r.Snapshot)
	if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(snap))); err == nil {
		removeFromFolder(t, dir, snap)
	}
	// The test's clock hides that a folder lists everything at every
	// sync: the laptop finds the loss at its daily listing of everything.
	clock = clock.Add(24 * time.Hour)
	if r := a.sync(); len(r.Vanished) == 0 || r.Snapshot == "" {
		t.Errorf("laptop after its snapshots vanished: Vanished %v, Snapshot %q; want a snapshot", r.Vanished, r.Snapshot)
	}
	b.sync()
	b.wantNotes("n1=written while the desktop was away", "n2=written while the desktop was away", "n3=written while the desktop was away")
}

// clockedRemote is a Remote whose clock the test sets.
type clockedRemote struct {
	drivesync.Remote
	now *time.Time
}

func (r *clockedRemote) Now(context.Context) (time.Time, error) {
	*r.now = r.now.Add(time.Millisecond)
	return *r.now, nil
}

// On a remote that lists files since a time (Drive, S3), the writer finds
// its own file gone at its next sync, without listing everything: the
// file was named after where that listing starts, so the listing must
// show it.
func TestVanishedFileFoundByItsWriterBetweenFullListings(t *testing.T) {
	ctx := context.Background()
	mem := drivesync.NewMemoryRemote()
	clock := time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)
	mem.SetClock(func() time.Time {
		clock = clock.Add(time.Millisecond)
		return clock
	})
	a := newNotesDevice(t, "laptop", mem)
	b := newNotesDevice(t, "desktop", mem)
	a.sync() // each lists everything once a day: this is the day's
	b.sync()
	clock = clock.Add(time.Hour)
	a.put("n1", "kept")
	lost := a.sync().Uploaded
	if err := mem.Delete(ctx, lost); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Hour)
	if r := a.sync(); len(r.Vanished) != 1 || r.Snapshot == "" {
		t.Errorf("laptop: Vanished %v, Snapshot %q; want its file and a snapshot", r.Vanished, r.Snapshot)
	}
	b.sync()
	b.wantNotes("n1=kept")
}

// moveTo points the device at another remote, as an app whose user picks
// another folder does: the engine is opened again on the same database.
func (d *notesDevice) moveTo(remote drivesync.Remote) {
	d.t.Helper()
	if err := d.eng.Close(); err != nil {
		d.t.Fatal(err)
	}
	eng, err := drivesync.Open(context.Background(), d.db, drivesync.Config{
		Remote: remote, Tables: []drivesync.Table{{Name: "notes"}}, DeviceID: d.name, TempDir: d.t.TempDir(),
	})
	if err != nil {
		d.t.Fatal(err)
	}
	d.eng = eng
}

// A device that leaves a store and joins it again numbers its new files
// after those it published there before: a number it used there already
// would name two files, and one of them vanishing would go unnoticed
// while the other is on the remote.
func TestVanishedFileAfterRejoiningAStoreHeals(t *testing.T) {
	ctx := context.Background()
	dirA, dirB := t.TempDir(), t.TempDir()
	a := newNotesDevice(t, "laptop", newFolderRemote(t, dirA))
	b := newNotesDevice(t, "desktop", newFolderRemote(t, dirA))
	a.put("n1", "first")
	a.sync()
	a.put("n2", "second")
	a.sync()
	b.sync()

	a.moveTo(newFolderRemote(t, dirB)) // another, empty folder: a store of its own
	if _, err := a.eng.Sync(ctx); err == nil {
		t.Fatal("laptop synced with an empty folder without StartFresh")
	}
	if _, err := a.eng.StartFresh(ctx); err != nil {
		t.Fatal(err)
	}
	a.put("n3", "written on the other store")
	a.sync()

	a.moveTo(newFolderRemote(t, dirA)) // back to the first store
	if _, err := a.eng.Sync(ctx); err == nil {
		t.Fatal("laptop synced with its old store without JoinRemote")
	}
	if err := a.eng.JoinRemote(ctx); err != nil {
		t.Fatal(err)
	}
	a.sync()
	b.sync()
	a.put("n4", "written after rejoining")
	lost := a.sync().Uploaded
	removeFromFolder(t, dirA, lost)
	if r := a.sync(); len(r.Vanished) == 0 || r.Snapshot == "" {
		t.Errorf("laptop after its file vanished: Vanished %v, Snapshot %q; want its file and a snapshot", r.Vanished, r.Snapshot)
	}
	b.sync()
	b.wantNotes("n1=first", "n2=second", "n3=written on the other store", "n4=written after rejoining")
}

// failingPatches is a Remote whose creates of patch files fail while
// fail is set, as a network that drops does.
type failingPatches struct {
	drivesync.Remote
	fail *bool
}

func (r failingPatches) Create(ctx context.Context, name string, content io.Reader) error {
	if *r.fail && strings.Contains(name, "/patch_") {
		return errors.New("network down")
	}
	return r.Remote.Create(ctx, name, content)
}

// An upload that was not yet published when its device moved to another
// store is published there, numbered as it was under the old count: the
// other devices of that store must not report its device's earlier
// numbers missing for ever.
func TestOutboxPublishedAfterJoiningLeavesNoGap(t *testing.T) {
	ctx := context.Background()
	dirA, dirB := t.TempDir(), t.TempDir()
	fail := false
	a := newNotesDevice(t, "laptop", failingPatches{newFolderRemote(t, dirA), &fail})
	for _, id := range []string{"n0", "n1"} {
		a.put(id, "published on A")
		a.sync()
	}
	a.put("n2", "in the outbox")
	fail = true
	if _, err := a.eng.Sync(ctx); err == nil {
		t.Fatal("the sync published its file with the network down")
	}
	fail = false
	// The other store began days before: not a race to create a store.
	clockB := time.Now().Add(-72 * time.Hour)
	remoteB := &clockedRemote{Remote: newFolderRemote(t, dirB), now: &clockB}
	b := newNotesDevice(t, "desktop", remoteB)
	b.put("m1", "on B")
	b.sync()
	clockB = clockB.Add(48 * time.Hour)
	a.moveTo(remoteB)
	if r, err := a.eng.Sync(ctx); err == nil {
		t.Fatalf("laptop synced with another store without JoinRemote: %+v", r)
	}
	if err := a.eng.JoinRemote(ctx); err != nil {
		t.Fatal(err)
	}
	a.sync()
	a.sync()
	b.sync()
	b.sync()
	b.wantNotes("m1=on B", "n0=published on A", "n1=published on A", "n2=in the outbox")
	for _, d := range []*notesDevice{a, b} {
		st, err := d.eng.Status(ctx)
		if err != nil || len(st.Missing) != 0 {
			t.Errorf("%s: Status.Missing = %v (err %v), want none", d.name, st.Missing, err)
		}
	}
}
