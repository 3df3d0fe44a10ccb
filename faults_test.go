package drivesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// TestWritesDuringSync writes on the app's own pool while a sync is
// between reading the pending rows and committing: the writes stay
// pending, nothing another device changed is lost, and the next sync
// sends just the app's edits.
func TestWritesDuringSync(t *testing.T) {
	for _, point := range []string{"fetched", "planned", "uploaded"} {
		t.Run(point, func(t *testing.T) {
			remote := NewMemoryRemote()
			a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
			a.put("n1", `{"title":"t","body":"b"}`)
			a.put("n2", `{"title":"t","body":"b"}`)
			syncAll(t, a, b)
			// b changes both records' titles and syncs.
			b.put("n1", `{"title":"from b","body":"b"}`)
			b.put("n2", `{"title":"from b","body":"b"}`)
			b.sync()
			// a has a pending edit of n1's body; during its sync the app
			// edits n1 again (already pending) and n2 (not pending), and
			// creates n3.
			a.put("n1", `{"title":"t","body":"a1"}`)
			hooks(a.eng).step = func(p string) error {
				if p == point {
					a.put("n1", `{"title":"t","body":"a2"}`)
					a.put("n2", `{"title":"t","body":"a-during"}`)
					a.put("n3", `{"new":true}`)
				}
				return nil
			}
			a.sync()
			hooks(a.eng).step = nil
			// Nothing lost: b's titles are in, a's during-sync edits are on top.
			if got, want := a.get("n1"), `{"body":"a2","title":"from b"}`; got != want {
				t.Errorf("n1 = %s, want %s", got, want)
			}
			if got, want := a.get("n2"), `{"body":"a-during","title":"from b"}`; got != want {
				t.Errorf("n2 = %s, want %s", got, want)
			}
			// Writes before the pending rows are read go out in this sync;
			// later ones stay pending for the next.
			if wantPending := point != "fetched"; (a.pendingCount() > 0) != wantPending {
				t.Errorf("pending = %d after writes at %q", a.pendingCount(), point)
			}
			syncAll(t, a, b)
			assertConverged(t, a, b)
			for id, want := range map[string]string{"n1": `{"body":"a2","title":"from b"}`, "n2": `{"body":"a-during","title":"from b"}`, "n3": `{"new":true}`} {
				if got := b.get(id); got != want {
					t.Errorf("b: %s = %s, want %s", id, got, want)
				}
			}
		})
	}
}

// TestDeleteDuringSync: the app deletes a record during a sync that
// downloads an edit of it: the delete wins locally and goes out next.
func TestDeleteDuringSync(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("n", `{"v":1}`)
	syncAll(t, a, b)
	b.put("n", `{"v":2}`)
	b.sync()
	hooks(a.eng).step = func(p string) error {
		if p == "planned" {
			a.exec(`DELETE FROM notes WHERE id = 'n'`)
		}
		return nil
	}
	a.sync()
	hooks(a.eng).step = nil
	if got := a.get("n"); got != "" {
		t.Fatalf("a's row came back during the sync: %s", got)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := b.get("n"); got != "" {
		t.Fatalf("b: the delete did not arrive: %s", got)
	}
}

// failingRemote lets a test break one Remote operation.
type failingRemote struct {
	Remote
	createThenFail bool // store the file, then report failure (a crash after upload)
	failCreate     bool
	failList       bool
}

var errInjected = errors.New("injected failure")

func (f *failingRemote) Create(ctx context.Context, name string, r io.Reader) error {
	if f.failCreate {
		return errInjected
	}
	if err := f.Remote.Create(ctx, name, r); err != nil {
		return err
	}
	if f.createThenFail {
		return errInjected
	}
	return nil
}

func (f *failingRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	if f.failList {
		return nil, errInjected
	}
	return f.Remote.List(ctx, since)
}

// TestCrashBetweenUploadAndCommit: the file reached the remote but the
// device never committed. The next sync adopts the file from the outbox
// (it is never downloaded again or re-sent), and every device converges.
func TestCrashBetweenUploadAndCommit(t *testing.T) {
	mem := NewMemoryRemote()
	fr := &failingRemote{Remote: mem}
	a, b := newDevice(t, "dev-a", fr), newDevice(t, "dev-b", mem)
	a.sync() // binds the store
	a.put("n", `{"v":1}`)
	fr.createThenFail = true
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, ErrRemote) {
		t.Fatalf("got %v, want ErrRemote", err)
	}
	fr.createThenFail = false
	if a.pendingCount() != 1 {
		t.Fatal("pending change lost after a failed upload")
	}
	b.put("n", `{"v":2}`) // b edits concurrently and syncs after a's file landed
	b.sync()
	r := a.sync()
	if r.Recovered == "" || len(r.Downloaded) != 1 || r.Uploaded != "" {
		t.Fatalf("a: %+v, want its upload recovered, b's file applied, nothing re-sent", r)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	// a published v:1 first; b synced later, so b's v:2 wins.
	if got := a.get("n"); got != `{"v":2}` {
		t.Fatalf("got %s, want b's later change", got)
	}
	files, _ := mem.List(context.Background(), time.Time{})
	if len(files) != 3 {
		t.Fatalf("remote has %d files, want the marker and 2 patch files (nothing duplicated)", len(files))
	}
}

// TestOrphanThenRevert: after a crash between upload and commit, the app
// reverts the change. The revert must win: diffs are taken against the
// state including the device's own published file.
func TestOrphanThenRevert(t *testing.T) {
	mem := NewMemoryRemote()
	fr := &failingRemote{Remote: mem}
	a, b := newDevice(t, "dev-a", fr), newDevice(t, "dev-b", mem)
	a.put("n", `{"v":1}`)
	a.put("gone", `{"x":1}`)
	syncAll(t, a, b)
	a.put("n", `{"v":2}`)
	a.put("new", `{"y":1}`)
	fr.createThenFail = true
	a.eng.Sync(context.Background())
	fr.createThenFail = false
	a.put("n", `{"v":1}`)                        // revert
	a.exec(`DELETE FROM notes WHERE id = 'new'`) // and undo the creation
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := b.get("n"); got != `{"v":1}` {
		t.Errorf("n = %s, want the revert", got)
	}
	if got := b.get("new"); got != "" {
		t.Errorf("new = %s, want it deleted", got)
	}
}

// TestFailedCommitKeepsUpload: when the transaction fails after the
// upload, local state is untouched and the file stays published; another
// device that applied it in between does not diverge.
func TestFailedCommitKeepsUpload(t *testing.T) {
	for _, point := range []string{"uploaded", "applied"} {
		t.Run(point, func(t *testing.T) {
			remote := NewMemoryRemote()
			a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
			a.put("n", `{"v":1}`)
			syncAll(t, a, b)
			a.put("n", `{"v":1,"tag":"x"}`)
			before := a.dump()
			hooks(a.eng).step = func(p string) error {
				if p == point {
					b.sync() // b applies a's file before a's commit fails
					return errInjected
				}
				return nil
			}
			_, err := a.eng.Sync(context.Background())
			hooks(a.eng).step = nil
			if !errors.Is(err, errInjected) {
				t.Fatalf("got %v, want the injected failure", err)
			}
			if got := a.dump(); got != before {
				t.Fatalf("a half-applied a failed sync:\n%s\nwant\n%s", got, before)
			}
			if a.pendingCount() != 1 {
				t.Fatal("pending change lost")
			}
			if got := b.get("n"); got != `{"tag":"x","v":1}` {
				t.Fatalf("b = %s", got)
			}
			a.put("n", `{"v":1}`) // the app takes the tag back
			syncAll(t, a, b)
			assertConverged(t, a, b)
			if got := b.get("n"); got != `{"v":1}` {
				t.Fatalf("b = %s, want the tag removed", got)
			}
		})
	}
}

func TestUploadFailureKeepsEverything(t *testing.T) {
	mem := NewMemoryRemote()
	fr := &failingRemote{Remote: mem}
	a, b := newDevice(t, "dev-a", fr), newDevice(t, "dev-b", mem)
	a.sync() // binds the store
	fr.failCreate = true
	a.put("n", `{"v":1}`)
	before := a.dump()
	_, err := a.eng.Sync(context.Background())
	var de *Error
	if !errors.Is(err, ErrRemote) || !errors.As(err, &de) || de.Op != "upload" {
		t.Fatalf("got %v, want an upload *Error wrapping ErrRemote", err)
	}
	if a.dump() != before || a.pendingCount() != 1 {
		t.Fatal("a failed upload changed local state")
	}
	// Still failing: the stored upload cannot be published; nothing moves.
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, ErrRemote) {
		t.Fatalf("got %v, want ErrRemote again", err)
	}
	fr.failCreate = false
	if r := a.sync(); r.Recovered == "" {
		t.Fatalf("the stored upload was not published: %+v", r)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if b.get("n") != `{"v":1}` {
		t.Fatal("the change never arrived")
	}
}

func TestReopen(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	a.put("n", `{"v":1}`)
	id := a.eng.DeviceID()
	// Open again on the same db (a crash leaves is_syncing set: reset).
	a.exec(`UPDATE sync_control SET is_syncing = 1`)
	a.cfg.DeviceID = ""
	a.open()
	a.open()
	if a.eng.DeviceID() != id {
		t.Fatalf("device id changed on reopen: %s -> %s", id, a.eng.DeviceID())
	}
	var syncing int
	a.db.QueryRow(`SELECT is_syncing FROM sync_control`).Scan(&syncing)
	if syncing != 0 {
		t.Fatal("is_syncing not reset by Open")
	}
	a.put("n2", `{"v":2}`) // triggers still capture, exactly once
	if n := a.pendingCount(); n != 2 {
		t.Fatalf("pending = %d, want 2", n)
	}
	var triggers int
	a.db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'trigger'`).Scan(&triggers)
	if want := len(triggerSQL(&tableInfo{name: "notes"})); triggers != want {
		t.Fatalf("%d triggers, want %d", triggers, want)
	}
	// A new Config.DeviceID is this database's new id (a copy needs
	// one); what it had pending stays pending.
	a.cfg.DeviceID = "someone-else"
	a.open()
	if got := a.eng.DeviceID(); got != "someone-else" {
		t.Fatalf("opened with a new Config.DeviceID as %s", got)
	}
	if n := a.pendingCount(); n != 2 {
		t.Fatalf("pending = %d after a new id, want 2", n)
	}
}

func TestChangingTables(t *testing.T) {
	remote := NewMemoryRemote()
	tagSchema := `CREATE TABLE IF NOT EXISTS tags (id TEXT PRIMARY KEY, content TEXT NOT NULL)`
	a := newDevice(t, "dev-a", remote, notesSchema, tagSchema)
	b := newDevice(t, "dev-b", remote, notesSchema, tagSchema)
	// b's app version does not know tags yet; a's does.
	a.cfg.Tables = append(a.cfg.Tables, Table{Name: "tags"})
	a.open()
	a.exec(`INSERT INTO tags (id, content) VALUES ('t1', '{"name":"red"}')`)
	b.exec(`INSERT INTO tags (id, content) VALUES ('t-local', '{"name":"mine"}')`) // written before b registers tags
	syncAll(t, a, b)
	if r := b.sync(); r.Unregistered != 0 {
		t.Fatalf("report %+v", r)
	}
	var n int
	b.db.QueryRow(`SELECT count(*) FROM tags`).Scan(&n)
	if n != 1 {
		t.Fatalf("b wrote an unregistered table: %d rows", n)
	}
	// b upgrades and registers tags: the synced record appears, its own
	// row is sent.
	b.cfg.Tables = append(b.cfg.Tables, Table{Name: "tags"})
	b.open()
	var content string
	if err := b.db.QueryRow(`SELECT content FROM tags WHERE id = 't1'`).Scan(&content); err != nil || content != `{"name":"red"}` {
		t.Fatalf("t1 after registering: %q %v", content, err)
	}
	syncAll(t, a, b)
	a.db.QueryRow(`SELECT count(*) FROM tags`).Scan(&n)
	if n != 2 {
		t.Fatalf("a has %d tags, want 2", n)
	}
	// Unregistering drops the triggers.
	b.cfg.Tables = b.cfg.Tables[:1]
	b.open()
	b.exec(`UPDATE tags SET content = '{"name":"x"}' WHERE id = 't1'`)
	if b.pendingCount() != 0 {
		t.Fatal("an unregistered table is still captured")
	}
}

func TestOpenRejectsUnsuitableTables(t *testing.T) {
	remote := NewMemoryRemote()
	d := newDevice(t, "dev-a", remote,
		notesSchema,
		`CREATE TABLE intkey (id INTEGER PRIMARY KEY, content TEXT)`,
		`CREATE TABLE nokey (id TEXT, body TEXT)`,
		`CREATE TABLE composite (id TEXT, k TEXT, content TEXT, PRIMARY KEY (id, k))`)
	for name, want := range map[string]string{
		"missing":                 "does not exist",
		"intkey":                  "TEXT PRIMARY KEY",
		"nokey":                   "no PRIMARY KEY",
		"composite":               "composite primary key",
		"notes; DROP TABLE notes": "not a plain identifier",
		"sqlite_master":           "reserved by SQLite",
		"sync_states":             "drivesync's own",
	} {
		cfg := d.cfg
		cfg.Tables = []Table{{Name: name}}
		_, err := Open(context.Background(), d.db, cfg)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open with table %q: got %v, want an error saying %q", name, err, want)
		}
	}
	var n int
	d.db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'notes'`).Scan(&n)
	if n != 1 {
		t.Fatal("the notes table is gone after Opens with hostile table names")
	}
}

// writeRaw puts a hand-made patch file on the remote.
func writeRaw(t *testing.T, r Remote, name string, gz bool, body string) {
	t.Helper()
	var buf bytes.Buffer
	if gz {
		w := gzip.NewWriter(&buf)
		w.Write([]byte(body))
		w.Close()
	} else {
		buf.WriteString(body)
	}
	if err := r.Create(context.Background(), name, &buf); err != nil {
		t.Fatal(err)
	}
}

func TestHostileFiles(t *testing.T) {
	const dev = "evil-device"
	entry := func(table, record, patch string, version string) string {
		return fmt.Sprintf(`{"format":1,"device":%q,"changes":[{"table_name":%q,"record_id":%q,"patch":%s,"is_deleted":false,"sync_version":%s}]}`, dev, table, record, patch, version)
	}
	tests := []struct {
		name string
		gz   bool
		body string
		want error
	}{
		{"not gzip", false, "hello", ErrCorruptFile},
		{"not json", true, "{{{", ErrCorruptFile},
		{"sql in table name", true, entry("notes; DROP TABLE notes", "x", `{"a":1}`, "5"), ErrCorruptFile},
		{"sqlite_master", true, entry("sqlite_master", "x", `{"a":1}`, "5"), ErrCorruptFile},
		{"engine table", true, entry("sync_states", "x", `{"a":1}`, "5"), ErrCorruptFile},
		{"version as string", true, entry("notes", "x", `{"a":1}`, `"5"`), ErrCorruptFile},
		{"version too large", true, entry("notes", "x", `{"a":1}`, "9223372036854775807"), ErrCorruptFile},
		{"patch as array", true, entry("notes", "x", `[1,2]`, "5"), ErrCorruptFile},
		{"empty record id", true, entry("notes", "", `{"a":1}`, "5"), ErrCorruptFile},
		{"deep nesting", true, entry("notes", "x", strings.Repeat(`{"a":`, 10000)+"1"+strings.Repeat("}", 10000), "5"), ErrCorruptFile},
		{"future format", true, `{"format":99,"device":"evil-device","changes":[]}`, ErrUnsupportedFormat},
		{"lying device", true, `{"format":1,"device":"dev-b","changes":[]}`, ErrCorruptFile},
		{"truncated", true, `{"format":1,"device":"evil-device","changes":[{"table_name":"notes"`, ErrCorruptFile},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			remote := NewMemoryRemote()
			a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
			a.put("good-before", `{"v":1}`)
			a.sync()
			bad := fmt.Sprintf("2026/01/01/patch_20260101T000000.%03dZ_%s.json.gz", i, dev)
			writeRaw(t, remote, bad, tt.gz, tt.body)
			a.put("good-after", `{"v":2}`)
			a.sync()
			b.put("mine", `{"v":3}`)
			before := b.get("mine")
			r := b.sync()
			if len(r.Rejected) != 1 || r.Rejected[0].Name != bad || !errors.Is(r.Rejected[0].Err, tt.want) {
				t.Fatalf("rejected %v, want %s with %v", r.Rejected, bad, tt.want)
			}
			if !strings.Contains(r.Rejected[0].Err.Error(), bad) {
				t.Errorf("error %q does not name the file", r.Rejected[0].Err)
			}
			if r.Uploaded == "" || len(r.Downloaded) != 2 {
				t.Fatalf("a bad file stopped the rest: %+v", r)
			}
			if b.get("good-before") == "" || b.get("good-after") == "" || b.get("mine") != before {
				t.Fatal("good files not applied or local data touched")
			}
			var tables int
			b.db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = 'notes'`).Scan(&tables)
			if tables != 1 {
				t.Fatal("notes table is gone")
			}
			// Rejected once, not downloaded again while unchanged.
			if r := b.sync(); len(r.Rejected) != 0 {
				t.Fatalf("rejected again: %v", r.Rejected)
			}
		})
	}
}

func TestUnregisteredTableInFile(t *testing.T) {
	remote := NewMemoryRemote()
	b := newDevice(t, "dev-b", remote)
	writeRaw(t, remote, "2026/01/01/patch_20260101T000000.000Z_dev-x.json.gz", true,
		`{"format":1,"device":"dev-x","changes":[{"table_name":"future_table","record_id":"r","patch":{"a":1},"sync_version":3},{"table_name":"notes","record_id":"n","patch":{"a":1},"sync_version":4}]}`)
	r := b.sync()
	if r.Unregistered != 1 || r.ChangesReceived != 2 || len(r.Rejected) != 0 {
		t.Fatalf("report %+v", r)
	}
	if b.get("n") != `{"a":1}` {
		t.Fatal("registered change not applied")
	}
}

func TestGzipBomb(t *testing.T) {
	remote := NewMemoryRemote()
	b := newDevice(t, "dev-b", remote)
	b.cfg.Limits.MaxExpandedSize = 1 << 20 // b creates the store: its limits are the store's
	b.open()
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	w.Write([]byte(`{"format":1,"device":"dev-x","changes":[{"table_name":"notes","record_id":"r","patch":{"a":"`))
	filler := bytes.Repeat([]byte("a"), 1<<20)
	for range 64 { // 64 MiB expanded, ~64 KiB compressed
		w.Write(filler)
	}
	w.Close()
	remote.Create(context.Background(), "2026/01/01/patch_20260101T000000.000Z_dev-x.json.gz", &buf)
	r := b.sync()
	if len(r.Rejected) != 1 || !errors.Is(r.Rejected[0].Err, ErrFileTooLarge) {
		t.Fatalf("rejected %v, want ErrFileTooLarge", r.Rejected)
	}
	// A store made with a smaller file limit.
	remote = NewMemoryRemote()
	b = newDevice(t, "dev-c", remote)
	b.cfg.Limits.MaxFileSize = 1024
	b.open()
	buf.Reset()
	w = gzip.NewWriter(&buf)
	noise := make([]byte, 5000)
	rand.Read(noise)
	w.Write(noise)
	w.Close()
	remote.Create(context.Background(), "2026/01/01/patch_20260101T000001.000Z_dev-x.json.gz", &buf)
	r = b.sync()
	if len(r.Rejected) != 1 || !errors.Is(r.Rejected[0].Err, ErrFileTooLarge) {
		t.Fatalf("rejected %v, want the file with ErrFileTooLarge", r.Rejected)
	}
}
