package drivesync_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/remotetest"
)

// tempPrefix must match the prefix folder.go gives its temp files;
// TestFolderRemoteHidesFileWhileWriting checks that it does.
const tempPrefix = ".drivesync-tmp-"

func newFolderRemote(t *testing.T, dir string) *drivesync.FolderRemote {
	t.Helper()
	r, err := drivesync.NewFolderRemote(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestFolderRemote(t *testing.T) {
	remotetest.Run(t, func(t *testing.T) drivesync.Remote {
		return newFolderRemote(t, t.TempDir())
	})
}

// A folder that is not there (a USB stick not mounted) makes a remote
// that the app can open its database with, offline; every operation says
// the folder is missing, never that a file is, and nothing creates it.
func TestNewFolderRemoteMissing(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "not-mounted")
	r, err := drivesync.NewFolderRemote(dir)
	if err != nil {
		t.Fatalf("NewFolderRemote(%q): %v, want a remote that fails when used", dir, err)
	}
	_, lerr := r.List(ctx, time.Time{})
	_, oerr := r.Open(ctx, "2026/11/22/x.json.gz")
	cerr := r.Create(ctx, "2026/11/22/x.json.gz", strings.NewReader("x"))
	derr := r.Delete(ctx, "2026/11/22/x.json.gz")
	for op, err := range map[string]error{"List": lerr, "Open": oerr, "Create": cerr, "Delete": derr} {
		if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "mounted") || errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s on a missing folder: got %v, want an error naming the folder that does not match fs.ErrNotExist", op, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat(%q): got %v, want fs.ErrNotExist (the folder must never be created)", dir, err)
	}
}

func TestNewFolderRemoteNotAFolder(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := drivesync.NewFolderRemote(file); err == nil {
		t.Errorf("NewFolderRemote(%q) on a file: got nil error, want one", file)
	}
}

func TestNewFolderRemoteRelative(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	r := newFolderRemote(t, ".")
	t.Chdir(t.TempDir())
	if err := r.Create(context.Background(), "a", strings.NewReader("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); err != nil {
		t.Errorf("after changing directory, Create wrote elsewhere: got %v, want the file in %s", err, dir)
	}
}

// listNames returns the names r lists, sorted.
func listNames(t *testing.T, r drivesync.Remote) []string {
	t.Helper()
	files, err := r.List(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	return names
}

// writeFile writes a file directly on disk, as a sync tool or another
// machine would, creating its folders.
func writeFile(t *testing.T, root, name, content string) string {
	t.Helper()
	path := filepath.Join(root, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestFolderRemoteListsFilesFromOtherMachines(t *testing.T) {
	dir := t.TempDir()
	r := newFolderRemote(t, dir)
	writeFile(t, dir, "2026/11/22/patch_20261122T101500.123Z_laptop.json.gz", "hello")
	// A since after the file's arrival must still list it: it may have
	// been created long before and only just synced.
	files, err := r.List(context.Background(), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := []drivesync.RemoteFile{{Name: "2026/11/22/patch_20261122T101500.123Z_laptop.json.gz", Size: 5}}
	if !slices.Equal(files, want) {
		t.Errorf("List: got %v, want %v", files, want)
	}
}

func TestFolderRemoteSkipsDotFiles(t *testing.T) {
	dir := t.TempDir()
	r := newFolderRemote(t, dir)
	for _, name := range []string{
		".DS_Store",
		".stfolder/x",
		".dropbox.cache/2026/y",
		"2026/.hidden/z",
		"2026/11/22/.sync-conflict",
		"2026/11/22/a",
	} {
		writeFile(t, dir, name, "x")
	}
	if got, want := listNames(t, r), []string{"2026/11/22/a"}; !slices.Equal(got, want) {
		t.Errorf("List: got %v, want %v", got, want)
	}
}

func TestFolderRemoteRemovesStaleTempFiles(t *testing.T) {
	dir := t.TempDir()
	r := newFolderRemote(t, dir)
	old := time.Now().Add(-25 * time.Hour)
	stale := []string{
		writeFile(t, dir, tempPrefix+"old", "x"),
		writeFile(t, dir, "2026/11/22/"+tempPrefix+"old", "x"),
	}
	kept := []string{
		writeFile(t, dir, "2026/11/22/"+tempPrefix+"new", "x"), // a Create may still be writing it
		writeFile(t, dir, ".DS_Store", "x"),                    // not ours
	}
	for _, path := range append(stale, kept[1]) {
		if err := os.Chtimes(path, old, old); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, dir, "2026/11/22/a", "a")

	if got, want := listNames(t, r), []string{"2026/11/22/a"}; !slices.Equal(got, want) {
		t.Errorf("List: got %v, want %v", got, want)
	}
	for _, path := range stale {
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("stale temp file %s after List: got %v, want it removed", path, err)
		}
	}
	for _, path := range kept {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("file %s after List: got %v, want it kept", path, err)
		}
	}
}

// TestFolderRemoteTwoProcesses races two FolderRemotes on one folder, as two
// processes on one machine would.
func TestFolderRemoteTwoProcesses(t *testing.T) {
	dir := t.TempDir()
	remotes := []drivesync.Remote{newFolderRemote(t, dir), newFolderRemote(t, dir)}
	const name = "2026/11/22/race"
	errs := make([]error, 8)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			<-start
			content := bytes.Repeat([]byte{'A' + byte(i)}, 64<<10)
			errs[i] = remotes[i%2].Create(context.Background(), name, bytes.NewReader(content))
		})
	}
	close(start)
	wg.Wait()
	wins := 0
	for i, err := range errs {
		if err == nil {
			wins++
		} else if !errors.Is(err, fs.ErrExist) {
			t.Errorf("Create %d: got %v, want nil or fs.ErrExist", i, err)
		}
	}
	if wins != 1 {
		t.Errorf("successful Creates: got %d, want 1", wins)
	}
	assertNoTempFiles(t, dir)
}

func TestFolderRemoteLeavesNoTempFiles(t *testing.T) {
	dir := t.TempDir()
	r := newFolderRemote(t, dir)
	ctx := context.Background()
	const name = "2026/11/22/a"
	if err := r.Create(ctx, name, strings.NewReader("a")); err != nil {
		t.Fatal(err)
	}
	if err := r.Create(ctx, name, strings.NewReader("b")); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second Create: got %v, want fs.ErrExist", err)
	}
	readErr := errors.New("disk on fire")
	content := io.MultiReader(strings.NewReader("partial"), iotest.ErrReader(readErr))
	if err := r.Create(ctx, "2026/11/22/b", content); !errors.Is(err, readErr) {
		t.Errorf("Create with a failing reader: got %v, want %v", err, readErr)
	}
	assertNoTempFiles(t, dir)
	if got, want := listNames(t, r), []string{name}; !slices.Equal(got, want) {
		t.Errorf("List: got %v, want %v", got, want)
	}
}

func assertNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), tempPrefix) {
			t.Errorf("temp file left behind: got %s, want none", path)
		}
		return err
	})
}

// TestFolderRemoteHidesFileWhileWriting checks that a Create in progress is
// invisible to List and Open, and that its temp file has the prefix the
// other tests assume.
func TestFolderRemoteHidesFileWhileWriting(t *testing.T) {
	dir := t.TempDir()
	r := newFolderRemote(t, dir)
	ctx := context.Background()
	const name = "2026/11/22/a"
	pr, pw := io.Pipe()
	done := make(chan error)
	go func() { done <- r.Create(ctx, name, pr) }()
	if _, err := pw.Write([]byte("half")); err != nil { // returns once Create has read it
		t.Fatal(err)
	}

	entries, err := os.ReadDir(filepath.Join(dir, "2026", "11", "22"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || !strings.HasPrefix(entries[0].Name(), tempPrefix) {
		t.Errorf("folder during Create: got %v, want one file starting with %q", entries, tempPrefix)
	}
	if got := listNames(t, r); len(got) != 0 {
		t.Errorf("List during Create: got %v, want nothing", got)
	}
	if _, err := r.Open(ctx, name); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open during Create: got %v, want fs.ErrNotExist", err)
	}

	pw.Write([]byte(" and whole"))
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
	if want := "half and whole"; err != nil || string(got) != want {
		t.Errorf("file after Create: got %q, %v, want %q", got, err, want)
	}
	assertNoTempFiles(t, dir)
}

// TestFolderRemoteDeleteRemovesEmptyFolders: deleting the last file of an
// old day removes its folder, and the month's and year's once empty, but
// never the root. (Recent folders: TestFolderRemoteKeepsRecentFolders.)
func TestFolderRemoteDeleteRemovesEmptyFolders(t *testing.T) {
	dir := t.TempDir()
	r := newFolderRemote(t, dir)
	ctx := context.Background()
	for _, name := range []string{"2020/11/22/a", "2020/11/23/b"} {
		if err := r.Create(ctx, name, strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Delete(ctx, "2020/11/22/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "2020", "11", "22")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("emptied day folder after Delete: got %v, want it removed", err)
	}
	if err := r.Delete(ctx, "2020/11/23/b"); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("root after deleting everything: got %v, want it kept", err)
	}
	if len(entries) != 0 {
		t.Errorf("root after deleting everything: got %v, want it empty", entries)
	}
}

func ExampleNewFolderRemote() {
	// In a real program dir is a folder that Dropbox, Syncthing or a USB
	// stick shares; it must exist already.
	dir, err := os.MkdirTemp("", "drivesync-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	remote, err := drivesync.NewFolderRemote(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	name := "2026/11/22/hello.txt"
	if err := remote.Create(ctx, name, strings.NewReader("hello")); err != nil {
		fmt.Println(err)
		return
	}
	err = remote.Create(ctx, name, strings.NewReader("again"))
	fmt.Println("second create exists:", errors.Is(err, fs.ErrExist))

	files, err := remote.List(ctx, time.Time{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range files {
		fmt.Println(f.Name, f.Size)
	}
	// Output:
	// second create exists: true
	// 2026/11/22/hello.txt 5
}
