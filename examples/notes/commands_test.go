package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/examples/internal/notesapp"
)

// A new user's first steps: notes without a remote, ids as the demo shows
// them, and a failed sync that prints only its error.
func TestNewUser(t *testing.T) {
	t.Setenv("NOTES_DB", "")
	t.Setenv("NOTES_REMOTE", "")
	dir := t.TempDir()
	local := cli{t, filepath.Join(dir, "a.db"), nil}
	id := strings.TrimSpace(local.run("add", "written offline"))
	if list := local.run("list"); !strings.Contains(list, "written offline") {
		t.Fatalf("list without a remote: %q", list)
	}
	local.run("edit", id[:8], "edited by its short id")
	if list := local.run("list"); !strings.Contains(list, "edited by its short id") {
		t.Fatalf("edit by the id's start: %q", list)
	}
	if msg := local.fail("edit", id[:2], "x"); !strings.Contains(msg, "at least the first 4 characters") {
		t.Fatalf("a 2-character id: %s", msg)
	}

	// A sync that fails says only why, and what to do.
	missing := cli{t, local.db, []string{"-remote", filepath.Join(dir, "missing")}}
	out, err := missing.try("sync")
	if err == nil || strings.Contains(out, "up to date") || strings.TrimSpace(out) != "" || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a failed sync printed %q and returned %v", out, err)
	}

	// The note written offline goes out with the first sync.
	remote := t.TempDir()
	a := cli{t, local.db, []string{"-remote", remote}}
	b := cli{t, filepath.Join(dir, "b.db"), []string{"-remote", remote}}
	if got := a.run("sync"); !strings.Contains(got, "sent 1 change") {
		t.Fatalf("the first sync: %q", got)
	}
	b.run("sync")
	if list := b.run("list"); !strings.Contains(list, "edited by its short id") {
		t.Fatalf("b lists %q", list)
	}
}

// -passphrase encrypts what notes uploads; a device without it is told
// what to do, and nothing of the notes shows on the remote.
func TestPassphrase(t *testing.T) {
	t.Setenv("NOTES_DB", "")
	t.Setenv("NOTES_REMOTE", "")
	t.Setenv("NOTES_PASSPHRASE", "")
	dir, remote := t.TempDir(), t.TempDir()
	a := cli{t, filepath.Join(dir, "a.db"), []string{"-remote", remote, "-passphrase", "correct horse"}}
	b := cli{t, filepath.Join(dir, "b.db"), []string{"-remote", remote}}
	a.run("add", "SECRET-NOTE-TEXT")
	a.run("sync")
	if msg := b.fail("sync"); !strings.Contains(msg, "this store is encrypted: give its passphrase with -passphrase or $NOTES_PASSPHRASE") || strings.Contains(msg, "Config.") {
		t.Fatalf("b without the passphrase: %s\nwant what to do in notes' terms, not the library's", msg)
	}
	// A wrong passphrase, from the flag or the environment, and one for a
	// store that has none: each says which passphrase and how to drop it,
	// and stays ErrWrongKey.
	plain := t.TempDir()
	(cli{t, filepath.Join(dir, "p.db"), []string{"-remote", plain}}).run("sync")
	for _, tc := range []struct {
		env  string
		c    cli
		want string
	}{
		{"", cli{t, filepath.Join(dir, "c.db"), []string{"-remote", remote, "-passphrase", "wrong horse"}}, "the passphrase of -passphrase does not open this store"},
		{"wrong horse", cli{t, filepath.Join(dir, "d.db"), []string{"-remote", remote}}, "the passphrase of $NOTES_PASSPHRASE does not open this store"},
		{"", cli{t, filepath.Join(dir, "e.db"), []string{"-remote", plain, "-passphrase", "correct horse"}}, "if the store is not encrypted, leave out -passphrase"},
		{"correct horse", cli{t, filepath.Join(dir, "f.db"), []string{"-remote", plain}}, "if the store is not encrypted, unset NOTES_PASSPHRASE"},
	} {
		t.Setenv("NOTES_PASSPHRASE", tc.env)
		_, err := tc.c.try("sync")
		if !errors.Is(err, drivesync.ErrWrongKey) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "Config.") {
			t.Errorf("%s with $NOTES_PASSPHRASE=%q: %v\nwant ErrWrongKey saying %q, not the library's Config fields", strings.Join(tc.c.flags, " "), tc.env, err, tc.want)
		}
	}
	t.Setenv("NOTES_PASSPHRASE", "")
	b.flags = append(b.flags, "-passphrase", "correct horse")
	b.run("sync")
	if list := b.run("list"); !strings.Contains(list, "SECRET-NOTE-TEXT") {
		t.Fatalf("b lists %q", list)
	}
	filepath.WalkDir(remote, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte("SECRET-NOTE-TEXT")) {
				t.Errorf("%s holds the note in plain", p)
			}
		}
		return err
	})
}

// status, conflicts and resolve: a note edited on two devices at once.
func TestStatusAndConflicts(t *testing.T) {
	t.Setenv("NOTES_DB", "")
	t.Setenv("NOTES_REMOTE", "")
	dir, remote := t.TempDir(), t.TempDir()
	a := cli{t, filepath.Join(dir, "a.db"), []string{"-remote", remote}}
	b := cli{t, filepath.Join(dir, "b.db"), []string{"-remote", remote}}
	if st := a.run("status"); !strings.Contains(st, "last sync   never") || !strings.Contains(st, "pending     0 notes") {
		t.Fatalf("status before a sync:\n%s", st)
	}
	id := strings.TrimSpace(a.run("add", "original"))
	if st := a.run("status"); !strings.Contains(st, "pending     1 note") {
		t.Fatalf("status with a pending note:\n%s", st)
	}
	a.run("sync")
	b.run("sync")
	// The add and the two edits fall in different seconds, so both edits
	// set updated_at and conflict there too: notes lists only the
	// conflict on the text.
	nextSecond()
	a.run("edit", id, "a's version")
	nextSecond()
	b.run("edit", id, "b's version")
	a.run("sync")
	b.run("sync")
	a.run("sync")
	if got := a.run("conflicts"); strings.Contains(got, "no conflicts") == strings.Contains(b.run("conflicts"), "no conflicts") {
		t.Fatalf("conflicts: a %q, b %q; want them on the side that lost only", got, b.run("conflicts"))
	}
	loser := a
	if strings.Contains(a.run("conflicts"), "no conflicts") {
		loser = b
	}
	list := loser.run("conflicts")
	if !strings.Contains(list, "yours \"") || !strings.Contains(list, id) {
		t.Fatalf("the loser's conflicts:\n%s", list)
	}
	if st := loser.run("status"); !strings.Contains(st, "conflicts   1") {
		t.Fatalf("status:\n%s", st)
	}
	cid := strings.Fields(list)[0]
	if got := loser.run("resolve", cid, "mine"); !strings.Contains(got, "next sync sends it") {
		t.Fatalf("resolve: %q", got)
	}
	if got := loser.run("conflicts"); !strings.Contains(got, "no conflicts") {
		t.Fatalf("conflicts after resolving:\n%s", got)
	}
	loser.run("sync")
	a.run("sync")
	b.run("sync")
	want := "a's version"
	if loser.db == b.db {
		want = "b's version"
	}
	for _, d := range []cli{a, b} {
		if list := d.run("list"); !strings.Contains(list, want) {
			t.Fatalf("%s lists %q, want %q kept", d.db, list, want)
		}
	}
}

// Progress goes to standard error, as plain lines when it is not a
// terminal: each step's first and last (a download that starts again
// from 0, after a snapshot's, is a step again), in the changes it moves
// when it knows their total, else in files, and a sync server's pull
// (whose total its last page tells) in the changes so far. A folder's
// download of nothing counts files too.
func TestProgressLines(t *testing.T) {
	var out bytes.Buffer
	bar := newProgressBar(&out, false)
	bar.show(drivesync.Progress{Step: "download"})
	bar.show(drivesync.Progress{Step: "upload", Total: 1, TotalRecords: 1})
	bar.show(drivesync.Progress{Step: "upload", Done: 1, Total: 1, Records: 1, TotalRecords: 1})
	bar.done()
	for i := range 4 {
		bar.show(drivesync.Progress{Step: "download", Done: i, Total: 3, Bytes: int64(i), TotalBytes: 3})
	}
	for i := range 3 {
		bar.show(drivesync.Progress{Step: "apply", Done: min(i, 2), Total: 2, Records: 100 * i, TotalRecords: 200})
	}
	bar.done()
	bar.show(drivesync.Progress{Step: "download", Total: 1, TotalBytes: 10})
	bar.show(drivesync.Progress{Step: "download", Done: 1, Total: 1, Bytes: 10, TotalBytes: 10})
	bar.done()
	want := "download 0 files\nupload 0/1 changes\nupload 1/1 changes\n" +
		"download 0/3 files\ndownload 3/3 files\napply 0/200 changes\napply 200/200 changes\n" +
		"download 0/1 files\ndownload 1/1 files\n"
	if got := out.String(); got != want {
		t.Fatalf("plain progress of a folder sync\n%s\nwant\n%s", got, want)
	}

	out.Reset()
	bar = newProgressBar(&out, true)
	bar.show(drivesync.Progress{Step: "download"})
	for i := range 3 {
		bar.show(drivesync.Progress{Step: "download", Records: 500 * (i + 1)})
	}
	bar.show(drivesync.Progress{Step: "download", Records: 1500, TotalRecords: 1500})
	bar.show(drivesync.Progress{Step: "upload", Total: 1, TotalRecords: 4})
	bar.show(drivesync.Progress{Step: "upload", Done: 1, Total: 1, Records: 4, TotalRecords: 4})
	bar.done()
	want = "download 0 changes\ndownload 1500/1500 changes\nupload 0/4 changes\nupload 4/4 changes\n"
	if got := out.String(); got != want {
		t.Fatalf("plain progress of a sync server's sync\n%s\nwant\n%s", got, want)
	}
}

// A folder sync with nothing new prints its download in files, as notes
// runs it.
func TestProgressLinesOfAnUpToDateFolder(t *testing.T) {
	t.Setenv("NOTES_DB", "")
	t.Setenv("NOTES_REMOTE", "")
	a := cli{t, filepath.Join(t.TempDir(), "a.db"), []string{"-remote", t.TempDir()}}
	a.run("sync")
	out, progress, err := a.tryBoth("sync")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "up to date" || progress != "download 0 files\n" {
		t.Errorf("an up-to-date sync printed %q with progress %q, want up to date and \"download 0 files\"", out, progress)
	}
}

// Synced through a sync server, notes prints each step's progress in
// changes, never a negative total.
func TestProgressLinesThroughServer(t *testing.T) {
	const token = "alice-token-0123456789"
	srv := startServer(t, map[string]string{token: "alice"})
	dir := t.TempDir()
	a := cli{t, filepath.Join(dir, "a.db"), []string{"-server", srv.URL, "-token", token}}
	b := cli{t, filepath.Join(dir, "b.db"), []string{"-server", srv.URL, "-token", token}}
	a.run("add", "one")
	a.run("add", "two")
	for _, c := range []struct {
		dev        cli
		want, sync string
	}{
		{a, "download 0 changes\nupload 0/2 changes\nupload 2/2 changes\napply 0/2 changes\napply 2/2 changes\n", "sent 2 changes"},
		{b, "download 0 changes\ndownload 2/2 changes\napply 0/2 changes\napply 2/2 changes\n", "received 2 changes"},
	} {
		out, progress, err := c.dev.tryBoth("sync")
		if err != nil {
			t.Fatal(err)
		}
		if progress != c.want || !strings.Contains(out, c.sync) || strings.Contains(out, ".json.gz") {
			t.Errorf("%s: sync printed\n%s\nwith progress\n%s\nwant %q, no file named, and progress\n%s", c.dev.db, out, progress, c.sync, c.want)
		}
	}
}

// watch syncs a local change by itself.
func TestWatch(t *testing.T) {
	dir, remote := t.TempDir(), t.TempDir()
	folder, err := drivesync.NewFolderRemote(remote)
	if err != nil {
		t.Fatal(err)
	}
	a, err := notesapp.Open(context.Background(), filepath.Join(dir, "a.db"), drivesync.Config{Remote: folder})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- watch(ctx, &out, a.Engine, newProgressBar(&bytes.Buffer{}, false), options{}) }()
	time.Sleep(200 * time.Millisecond)
	if _, err := a.Add(ctx, "watched"); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(out.String(), "sent 1 change") && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "sent 1 change") {
		t.Fatalf("watch printed %q", out.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// nextSecond sleeps until the clock's next whole second: notes' updated_at
// counts seconds.
func nextSecond() {
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
}
