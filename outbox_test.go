package drivesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/api/googleapi"

	"github.com/drivesync/drivesync/internal/drivefake"
)

// TestOutboxRecoveryRetriedOverDrive: an upload whose retries all failed
// stays in the outbox, and the sync's error still names Drive's answer.
// The next sync publishes it from the outbox, and a 503 and a 429 on that
// upload are retried like any other upload's.
func TestOutboxRecoveryRetriedOverDrive(t *testing.T) {
	ctx := context.Background()
	srv := drivefake.New(t)
	a := driveDevice(t, srv, "dev-a")
	a.put("warm", `{"v":0}`)
	a.sync() // the marker and today's folders exist

	a.put("n", `{"v":1}`)
	srv.Fail(drivefake.Fault{Method: "POST", PathPrefix: "/upload", Status: http.StatusServiceUnavailable, Times: 8})
	_, err := a.eng.Sync(ctx)
	var ge *googleapi.Error
	if !errors.Is(err, ErrRemote) || !errors.As(err, &ge) || ge.Code != http.StatusServiceUnavailable {
		t.Fatalf("sync with every upload attempt refused: %v; want ErrRemote carrying Drive's 503", err)
	}
	srv.ClearFaults()

	srv.Fail(
		drivefake.Fault{Method: "POST", PathPrefix: "/upload", Status: http.StatusServiceUnavailable, Times: 1},
		drivefake.Fault{Method: "POST", PathPrefix: "/upload", Status: http.StatusTooManyRequests, RetryAfter: "0", Times: 1},
	)
	r, err := a.eng.Sync(ctx)
	if err != nil || r.Recovered == "" {
		t.Fatalf("recovery sync: %+v, %v; want the outbox published after retries", r, err)
	}
	b := driveDevice(t, srv, "dev-b")
	b.sync()
	if got, want := b.get("n"), `{"v":1}`; got != want {
		t.Fatalf("another device got %q, want %s", got, want)
	}
}

// TestOutboxReaderSeeks: the stored upload reads back the same from any
// position, across chunk boundaries.
func TestOutboxReaderSeeks(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	data := make([]byte, 2*outboxChunk+123)
	for i := range data {
		data[i] = byte(i * 7)
	}
	conn, err := d.db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for seq := 0; seq*outboxChunk < len(data); seq++ {
		chunk := data[seq*outboxChunk : min((seq+1)*outboxChunk, len(data))]
		if _, err := conn.ExecContext(context.Background(), `INSERT INTO sync_outbox (name, seq, data) VALUES ('f', ?, ?)`, seq, chunk); err != nil {
			t.Fatal(err)
		}
	}
	r, err := openOutbox(context.Background(), conn, "f")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := any(r).(io.ReadSeeker)
	if s == nil {
		t.Fatal("the outbox reader cannot seek")
	}
	for _, tc := range []struct {
		offset int64
		whence int
		want   int64
	}{
		{0, io.SeekStart, 0},
		{outboxChunk - 1, io.SeekStart, outboxChunk - 1},
		{-10, io.SeekEnd, int64(len(data)) - 10},
		{5, io.SeekCurrent, int64(len(data)) - 5},
		{outboxChunk + 1, io.SeekStart, outboxChunk + 1},
		{0, io.SeekStart, 0},
	} {
		pos, err := s.Seek(tc.offset, tc.whence)
		if err != nil || pos != tc.want {
			t.Fatalf("Seek(%d, %d) = %d, %v; want %d", tc.offset, tc.whence, pos, err, tc.want)
		}
		got, err := io.ReadAll(s)
		if err != nil || !bytes.Equal(got, data[pos:]) {
			t.Fatalf("after Seek(%d, %d): read %d bytes, %v; want the %d bytes from %d", tc.offset, tc.whence, len(got), err, len(data)-int(pos), pos)
		}
		if _, err := s.Seek(tc.want, io.SeekStart); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Seek(-1, io.SeekStart); err == nil {
		t.Fatal("Seek to a negative position succeeded")
	}
}

// TestOtherEngineAdoptingTheUploadStopsTheCommit: while an Engine's sync
// is between its upload and its commit, a second Engine on the same
// database finds the upload in the outbox, publishes it (it is there,
// the same bytes) and adopts it. The first sync then stops with
// errOtherEngine and commits nothing; the next sync goes on from what the
// second left, and no change is lost.
func TestOtherEngineAdoptingTheUploadStopsTheCommit(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryRemote()
	a := newDevice(t, "dev-a", mem)
	a.put("warm", `{"v":0}`)
	a.sync()
	other, err := Open(ctx, a.db, a.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	a.put("n", `{"v":1}`)
	var adopted Report
	hooks(a.eng).step = func(p string) error {
		if p == "uploaded" {
			var otherErr error
			if adopted, otherErr = other.Sync(ctx); otherErr != nil {
				t.Errorf("the second Engine's sync: %v", otherErr)
			}
		}
		return nil
	}
	r, err := a.eng.Sync(ctx)
	hooks(a.eng).step = nil
	if adopted.Recovered == "" || adopted.Recovered != r.Uploaded {
		t.Fatalf("the second Engine recovered %q, want the first's upload %q", adopted.Recovered, r.Uploaded)
	}
	if !errors.Is(err, errOtherEngine) {
		t.Errorf("the first Engine's sync, its upload adopted by the second: %v; want an error that matches errOtherEngine", err)
	}
	if files := remoteFiles(t, mem, kindPatch); len(files) != 2 {
		t.Errorf("the remote holds %d patch files, want 2 (the warm-up and the one upload)", len(files))
	}

	a.sync()
	if n := a.pendingCount(); n != 0 {
		t.Errorf("%d records still pending after a sync alone", n)
	}
	b := newDevice(t, "dev-b", mem)
	if r := b.sync(); len(r.Rejected) > 0 {
		t.Errorf("b rejected %v", r.Rejected)
	}
	assertConverged(t, a, b)
	if got, want := b.get("n"), `{"v":1}`; got != want {
		t.Errorf("b has n = %q, want %s", got, want)
	}
}

// Two Engines on one database: the second starts its sync, finds the
// outbox empty, then plans while the first's upload is between its
// reservation and its commit. The pending records are the first's to
// send; the second must stop, not send them again under new versions.
func TestOtherEngineMidUploadStopsTheReservation(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryRemote()
	a := newDevice(t, "dev-a", mem)
	a.put("warm", `{"v":0}`)
	a.sync()
	other, err := Open(ctx, a.db, a.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	a.put("n", `{"v":1}`)

	uploaded, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	hooks(a.eng).step = func(p string) error {
		if p == "uploaded" {
			close(uploaded)
			<-release
		}
		return nil
	}
	hooks(other).step = func(p string) error {
		if p == "fetched" { // past its outbox recovery: nothing there yet
			go func() {
				_, err := a.eng.Sync(ctx)
				done <- err
			}()
			<-uploaded
		}
		return nil
	}
	_, otherErr := other.Sync(ctx)
	close(release)
	aErr := <-done
	hooks(a.eng).step, hooks(other).step = nil, nil
	if !errors.Is(otherErr, errOtherEngine) {
		t.Errorf("the second Engine's sync while the first's upload waited to commit: %v; want an error that matches errOtherEngine", otherErr)
	}
	if aErr != nil {
		t.Errorf("the first Engine's sync: %v", aErr)
	}
	if files := remoteFiles(t, mem, kindPatch); len(files) != 2 {
		t.Errorf("the remote holds %d patch files, want 2 (the warm-up and the one upload): %v", len(files), files)
	}
}

// storeOutbox stores data in the outbox under name, as saveOutbox does.
func storeOutbox(t *testing.T, db *sql.DB, name string, data []byte) {
	t.Helper()
	for seq := 0; seq*outboxChunk < len(data); seq++ {
		chunk := data[seq*outboxChunk : min((seq+1)*outboxChunk, len(data))]
		if _, err := db.Exec(`INSERT INTO sync_outbox (name, seq, data) VALUES (?, ?, ?)`, name, seq, chunk); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOutboxReaderFailsWhenTheUploadLeaves: another Engine on the database
// takes an upload out of the outbox (it committed or adopted it), or
// renames it, while this one reads it to publish it. The read fails with
// errOtherEngine; it never ends early as if the file ended there, which
// made the Remote publish a file cut short or empty. A Remote given that
// reader publishes nothing.
func TestOutboxReaderFailsWhenTheUploadLeaves(t *testing.T) {
	ctx := context.Background()
	d := newDevice(t, "dev-a", NewMemoryRemote())
	data := make([]byte, 2*outboxChunk+123)
	for i := range data {
		data[i] = byte(i * 7)
	}
	conn, err := d.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, tc := range []struct {
		name   string
		after  int64  // bytes read before the other Engine acts
		change string // what it does, on another connection
	}{
		{"taken out before the first read", 0, `DELETE FROM sync_outbox WHERE name = 'f'`},
		{"taken out half way", outboxChunk + 10, `DELETE FROM sync_outbox WHERE name = 'f'`},
		{"renamed half way", 100, `UPDATE sync_outbox SET name = 'g' WHERE name = 'f'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d.exec(`DELETE FROM sync_outbox`)
			storeOutbox(t, d.db, "f", data)
			r, err := openOutbox(ctx, conn, "f")
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, tc.after)
			if _, err := io.ReadFull(r, got); err != nil {
				t.Fatal(err)
			}
			d.exec(tc.change)
			rest, err := io.ReadAll(r)
			if !errors.Is(err, errOtherEngine) {
				t.Errorf("read %d bytes, then %d more after the upload left the outbox, ending with %v; want an error that matches errOtherEngine", tc.after, len(rest), err)
			}
			if _, err := r.Read(make([]byte, 1)); !errors.Is(err, errOtherEngine) {
				t.Errorf("a read after the failure: %v; want the failure again", err)
			}
			if _, err := openOutbox(ctx, conn, "f"); !errors.Is(err, errOtherEngine) {
				t.Errorf("opening the upload once it left: %v; want an error that matches errOtherEngine", err)
			}
		})
	}

	folder, err := NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, remote := range []Remote{NewMemoryRemote(), folder} {
		d.exec(`DELETE FROM sync_outbox`)
		storeOutbox(t, d.db, "f", data)
		r, err := openOutbox(ctx, conn, "f")
		if err != nil {
			t.Fatal(err)
		}
		content := &actingReader{r: r, at: outboxChunk, act: func() { d.exec(`DELETE FROM sync_outbox WHERE name = 'f'`) }}
		const name = "2026/11/28/patch_20261128T120000.000Z_dev-a.json.gz"
		if err := remote.Create(ctx, name, content); !errors.Is(err, errOtherEngine) {
			t.Errorf("%T: Create from an upload that left the outbox half way: %v; want an error that matches errOtherEngine", remote, err)
		}
		if files, err := remote.List(ctx, time.Time{}); err != nil || len(files) > 0 {
			t.Errorf("%T: after that Create, List gives %v, %v; want nothing published", remote, files, err)
		}
	}
}

// actingReader runs act once its reader has read at bytes.
type actingReader struct {
	r     io.Reader
	at, n int64
	act   func()
}

func (a *actingReader) Read(p []byte) (int, error) {
	if a.act != nil && a.n >= a.at {
		a.act()
		a.act = nil
	}
	n, err := a.r.Read(p[:min(int64(len(p)), max(a.at-a.n, 1))])
	a.n += int64(n)
	return n, err
}

// Environment of TestProcessesOnOneDatabasePublishWholeFiles's children.
const (
	envOutboxChild  = "DRIVESYNC_OUTBOX_CHILD" // the child's number
	envOutboxDB     = "DRIVESYNC_OUTBOX_DB"
	envOutboxFolder = "DRIVESYNC_OUTBOX_FOLDER"
	envOutboxRounds = "DRIVESYNC_OUTBOX_ROUNDS"
)

// TestProcessesOnOneDatabasePublishWholeFiles: processes that sync one
// database file at once, against one shared folder (an app and a CLI, say),
// are told that another Engine synced it at the same time, and nothing
// else goes wrong: no file they publish is ever empty or unreadable, and
// every write reaches another device. The test binary runs itself as the
// processes; each writes and syncs in a loop while the others do.
func TestProcessesOnOneDatabasePublishWholeFiles(t *testing.T) {
	if os.Getenv(envOutboxChild) != "" {
		outboxChild(t)
		return
	}
	// 150 rounds caught the empty files in every run of ten before the
	// fix, in under two seconds; under the race detector the processes
	// are slower, and fewer rounds keep the test short.
	children, rounds := 3, 150
	if raceEnabled {
		rounds = 50
	}
	ctx := context.Background()
	dir := t.TempDir()
	folder := filepath.Join(dir, "shared")
	if err := os.Mkdir(folder, 0o755); err != nil {
		t.Fatal(err)
	}
	remote, err := NewFolderRemote(folder)
	if err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(dir, "shared.db")
	a := openSharedDatabase(t, dbPath, remote)
	if _, err := a.Sync(ctx); err != nil { // the store, the marker and the device id exist
		t.Fatal(err)
	}

	checked := map[string]bool{} // the files found whole
	checkFolder := func(when string) {
		t.Helper()
		for _, bad := range brokenFiles(t, folder, checked) {
			t.Errorf("%s: the shared folder holds %s", when, bad)
		}
	}
	var procs []*exec.Cmd
	var outs []*bytes.Buffer
	for i := range children {
		cmd := exec.Command(os.Args[0], "-test.run=^TestProcessesOnOneDatabasePublishWholeFiles$", "-test.count=1")
		cmd.Env = append(os.Environ(), envOutboxChild+"="+strconv.Itoa(i), envOutboxDB+"="+dbPath,
			envOutboxFolder+"="+folder, envOutboxRounds+"="+strconv.Itoa(rounds), "TMPDIR="+t.TempDir())
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs, outs = append(procs, cmd), append(outs, out)
	}
	done := make(chan error, children)
	for _, cmd := range procs {
		go func() { done <- cmd.Wait() }()
	}
	// Every file the processes publish is checked while they run: one
	// that a later sync removed was published all the same.
	var failed []error
	for running := children; running > 0; {
		select {
		case err := <-done:
			running--
			if err != nil {
				failed = append(failed, err)
			}
		case <-time.After(2 * time.Millisecond):
			checkFolder("while the processes synced")
		}
	}
	checkFolder("once the processes ended")
	for i, out := range outs {
		told := 0
		for line := range strings.Lines(out.String()) {
			msg, ok := strings.CutPrefix(line, "sync error: ")
			switch {
			case ok && strings.Contains(msg, errOtherEngine.Error()):
				told++
			case ok:
				t.Errorf("process %d: a sync failed with %s", i, strings.TrimSpace(msg))
			}
			if msg, ok := strings.CutPrefix(line, "rejected: "); ok {
				t.Errorf("process %d: a sync rejected %s", i, strings.TrimSpace(msg))
			}
		}
		t.Logf("process %d: %d of %d syncs were told that another Engine synced at the same time", i, told, rounds)
	}
	if len(failed) > 0 {
		for i, out := range outs {
			t.Logf("process %d:\n%s", i, out)
		}
		t.Fatalf("processes failed: %v", failed)
	}

	// One Engine alone sends what the processes left pending.
	for range 3 {
		r, err := a.Sync(ctx)
		if err != nil {
			t.Fatalf("a sync alone after the processes: %v", err)
		}
		if len(r.Rejected) > 0 {
			t.Errorf("a sync alone after the processes rejected %v", r.Rejected)
		}
	}
	checkFolder("after a sync alone")
	var pending int
	if err := a.db.QueryRow(`SELECT count(*) FROM ` + pendingUnion).Scan(&pending); err != nil || pending != 0 {
		t.Errorf("%d records still pending after the syncs alone (%v)", pending, err)
	}

	b := newDevice(t, "dev-b", remote)
	r := b.sync()
	if len(r.Rejected) > 0 {
		t.Errorf("another device rejected %d files: %v", len(r.Rejected), r.Rejected)
	}
	for i := range children {
		for round := range rounds {
			id := fmt.Sprintf("p%d-%d", i, round)
			if got, want := b.get(id), fmt.Sprintf(`{"process":%d,"round":%d}`, i, round); got != want {
				t.Errorf("another device has note %s = %q, want %s", id, got, want)
			}
		}
	}
}

// outboxChild is one process of TestProcessesOnOneDatabasePublishWholeFiles:
// it writes a note and syncs, round after round, and prints what went
// wrong for the parent to judge.
func outboxChild(t *testing.T) {
	ctx := context.Background()
	me, _ := strconv.Atoi(os.Getenv(envOutboxChild))
	rounds, _ := strconv.Atoi(os.Getenv(envOutboxRounds))
	remote, err := NewFolderRemote(os.Getenv(envOutboxFolder))
	if err != nil {
		t.Fatal(err)
	}
	e := openSharedDatabase(t, os.Getenv(envOutboxDB), remote)
	db := e.db
	for round := range rounds {
		if _, err := db.ExecContext(ctx, `INSERT INTO notes (id, content) VALUES (?, jsonb(?))`,
			fmt.Sprintf("p%d-%d", me, round), fmt.Sprintf(`{"process":%d,"round":%d}`, me, round)); err != nil {
			t.Fatal(err)
		}
		r, err := e.Sync(ctx)
		if err != nil {
			fmt.Printf("sync error: %v\n", err)
		}
		for _, f := range r.Rejected {
			fmt.Printf("rejected: %s: %v\n", f.Name, f.Err)
		}
	}
}

// openSharedDatabase opens the database file at path, as every process
// of the test does, and an Engine on it.
func openSharedDatabase(t *testing.T, path string, remote Remote) *Engine {
	t.Helper()
	db, err := sql.Open("sqlite", testDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(notesSchema); err != nil {
		t.Fatal(err)
	}
	e, err := Open(context.Background(), db, Config{Remote: remote, Tables: []Table{{Name: "notes"}}, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// brokenFiles describes the files of folder that are empty or, gzipped,
// do not read to their end; checked holds the files found whole before,
// which are not read again (the engine never rewrites a file).
func brokenFiles(t *testing.T, folder string, checked map[string]bool) []string {
	t.Helper()
	var bad []string
	err := filepath.WalkDir(folder, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed while walked
		}
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") || d.IsDir() || checked[p] {
			return nil
		}
		data, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(data) == 0 {
			bad = append(bad, fmt.Sprintf("an empty file %s", p))
			checked[p] = true
			return nil
		}
		if strings.HasSuffix(p, ".gz") {
			gz, err := gzip.NewReader(bytes.NewReader(data))
			if err == nil {
				_, err = io.Copy(io.Discard, gz)
			}
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s of %d bytes that does not read: %v", p, len(data), err))
			}
		}
		checked[p] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return bad
}

// TestOwnBrokenUploadRemoved: a broken file that this database uploaded
// (its device id, a name it recorded), such as the empty files two Engines
// racing on one database once published, is removed by the device that
// finds it and forgotten: no device could apply it, and every device
// would otherwise report it as rejected for ever. Another device's broken
// file is not this device's to remove.
func TestOwnBrokenUploadRemoved(t *testing.T) {
	for _, store := range []struct {
		name string
		key  Key
	}{{"plain", nil}, {"encrypted", Passphrase("p")}} {
		t.Run(store.name, func(t *testing.T) {
			ctx := context.Background()
			mem, clk := clockedRemote()
			a, b := secretDevice(t, "dev-a", mem, store.key), secretDevice(t, "dev-b", mem, store.key)
			a.put("n1", `{"v":1}`)
			uploaded := a.sync().Uploaded
			b.sync()

			clk.add(time.Second)
			now, _ := mem.Now(ctx)
			whole := remoteBytes(t, mem)[uploaded]
			broken := map[string][]byte{ // name: content
				patchFileName(now, "dev-a"):                         nil,
				patchFileName(now.Add(time.Millisecond), "dev-a"):   whole[:len(whole)/2],
				patchFileName(now.Add(2*time.Millisecond), "dev-a"): whole[:len(whole)-1],
			}
			for name, content := range broken {
				a.exec(`INSERT INTO sync_uploaded (name) VALUES (?)`, name)
				if err := mem.Create(ctx, name, bytes.NewReader(content)); err != nil {
					t.Fatal(err)
				}
			}
			others := patchFileName(now, "dev-c")
			if err := mem.Create(ctx, others, strings.NewReader("")); err != nil {
				t.Fatal(err)
			}
			if r := b.sync(); len(r.Rejected) != len(broken)+1 {
				t.Fatalf("b rejected %v, want the %d broken files", r.Rejected, len(broken)+1)
			}

			r := a.sync()
			if len(r.Rejected) != 1 || r.Rejected[0].Name != others {
				t.Errorf("a rejected %v, want only %s (another device's)", r.Rejected, others)
			}
			for name := range broken {
				if _, err := mem.Open(ctx, name); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("a's own broken file %s after a's sync: Open gives %v, want fs.ErrNotExist", name, err)
				}
			}
			if _, err := mem.Open(ctx, others); err != nil {
				t.Errorf("another device's broken file after a's sync: Open gives %v, want it left alone", err)
			}
			ledgerRows := func(d *device) (n int) {
				t.Helper()
				if err := d.db.QueryRow(`SELECT count(*) FROM sync_files WHERE name LIKE '%dev-a.json.gz' AND status = 'rejected'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			if n := ledgerRows(a); n != 0 {
				t.Errorf("a's ledger keeps %d of its removed files as rejected, want none", n)
			}

			clk.add(2 * time.Hour) // b reads its rejected files again
			r = b.sync()
			if len(r.Rejected) != 1 || r.Rejected[0].Name != others {
				t.Errorf("b, reading its rejected files again, rejected %v, want only %s", r.Rejected, others)
			}
			if n := ledgerRows(b); n != 0 {
				t.Errorf("b's ledger keeps %d of a's removed files as rejected, want none", n)
			}
			if got, want := b.get("n1"), `{"v":1}`; got != want {
				t.Errorf("b has n1 = %q, want %s", got, want)
			}
		})
	}
}

// TestOwnBrokenUploadRepublishedFromOutbox: a device whose upload is still
// in its outbox, and broken on the remote under its name, publishes it
// again under a new name and removes the broken file: every device gets
// the changes, and none rejects anything.
func TestOwnBrokenUploadRepublishedFromOutbox(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	a.put("warm", `{"v":0}`)
	a.sync()
	b.sync()

	a.put("n", `{"v":1}`)
	hooks(a.eng).step = func(p string) error {
		if p == "uploaded" {
			return errors.New("the app quit")
		}
		return nil
	}
	if _, err := a.eng.Sync(ctx); err == nil {
		t.Fatal("a sync that stopped after its upload succeeded")
	}
	hooks(a.eng).step = nil
	var uploaded string
	if err := a.db.QueryRow(`SELECT name FROM sync_outbox LIMIT 1`).Scan(&uploaded); err != nil {
		t.Fatal(err)
	}
	if err := mem.Delete(ctx, uploaded); err != nil {
		t.Fatal(err)
	}
	if err := mem.Create(ctx, uploaded, strings.NewReader("")); err != nil {
		t.Fatal(err)
	}

	r := a.sync()
	if r.Recovered == "" || r.Recovered == uploaded {
		t.Errorf("a recovered %q, want its upload published under a new name, not %s", r.Recovered, uploaded)
	}
	if len(r.Rejected) > 0 {
		t.Errorf("a rejected %v, want nothing", r.Rejected)
	}
	if _, err := mem.Open(ctx, uploaded); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the broken file after a's sync: Open gives %v, want fs.ErrNotExist", err)
	}
	r = b.sync()
	if len(r.Rejected) > 0 {
		t.Errorf("b rejected %v, want nothing", r.Rejected)
	}
	if got, want := b.get("n"), `{"v":1}`; got != want {
		t.Errorf("b has n = %q, want %s", got, want)
	}
}
