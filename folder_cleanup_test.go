package drivesync_test

import (
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
	"time"
)

// dayName returns the name of a file in the day folder of t.
func dayName(t time.Time, base string) string {
	return t.UTC().Format("2006/01/02") + "/" + base
}

func assertFolders(t *testing.T, root string, exist bool, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		_, err := os.Stat(filepath.Join(root, filepath.FromSlash(d)))
		switch {
		case exist && err != nil:
			t.Errorf("folder %s: got %v, want it kept", d, err)
		case !exist && !errors.Is(err, fs.ErrNotExist):
			t.Errorf("folder %s: got %v, want it removed", d, err)
		}
	}
}

// TestFolderRemoteKeepsRecentFolders: a day folder within a week of today
// stays when emptied, by Delete and by List alike: another device may be
// about to write into it.
func TestFolderRemoteKeepsRecentFolders(t *testing.T) {
	dir := t.TempDir()
	r := newFolderRemote(t, dir)
	ctx := context.Background()
	now := time.Now()
	names := []string{dayName(now, "a"), dayName(now.AddDate(0, 0, -2), "b"), dayName(now.AddDate(0, 0, -6), "c")}
	for _, name := range names {
		if err := r.Create(ctx, name, strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
		if err := r.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if got := listNames(t, r); len(got) != 0 {
		t.Errorf("List: got %v, want nothing", got)
	}
	for _, name := range names {
		assertFolders(t, dir, true, filepath.ToSlash(filepath.Dir(name)))
	}
}

// TestFolderRemoteListRemovesOldEmptyFolders: List removes the old empty
// folders of the YYYY/MM/DD layout that other machines emptied, and
// nothing else.
func TestFolderRemoteListRemovesOldEmptyFolders(t *testing.T) {
	dir := t.TempDir()
	r := newFolderRemote(t, dir)
	old := time.Now().AddDate(0, -3, 0)
	// Files another machine wrote, then deleted through the sync tool.
	gone := []string{
		dayName(old, "patch_a"),
		"2020/01/05/patch_b", // with 2020/01/06: 2020/01, then 2020
		"2020/01/06/patch_c",
		"2019/02/03/patch_d",     // 2019/02/03 holds a dot file
		"2018/03/notes/x",        // a folder outside the layout, in a month
		"archive/2017/01/01/y",   // the layout, but not from the root
		"2016/1/1/z",             // not the layout
		dayName(time.Now(), "e"), // today
	}
	for _, name := range gone {
		if err := os.Remove(writeFile(t, dir, name, "x")); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, dir, "2019/02/03/.DS_Store", "x")
	writeFile(t, dir, "2021/05/05/patch_f", "x") // an old folder still in use
	writeFile(t, dir, "drivesync.json", "x")
	// All that happened long ago, but for a folder a sync tool is just
	// making: List leaves a folder touched within a day alone.
	ageFolders(t, dir, time.Now().AddDate(0, 0, -2))
	if err := os.MkdirAll(filepath.Join(dir, "2015", "06", "07"), 0o755); err != nil {
		t.Fatal(err)
	}

	if got, want := listNames(t, r), []string{"2021/05/05/patch_f", "drivesync.json"}; !slices.Equal(got, want) {
		t.Errorf("List: got %v, want %v", got, want)
	}
	assertFolders(t, dir, false, filepath.ToSlash(filepath.Dir(dayName(old, ""))), "2020/01/05", "2020/01/06", "2020/01", "2020")
	assertFolders(t, dir, true, "2019/02/03", "2018/03/notes", "2018/03", "archive/2017/01/01", "2016/1/1",
		filepath.ToSlash(filepath.Dir(dayName(time.Now(), ""))), "2021/05/05", "2015/06/07", ".")
}

// ageFolders sets the modification time of every folder below root.
func ageFolders(t *testing.T, root string, at time.Time) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && p != root {
			err = os.Chtimes(p, at, at)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFolderRemoteCreateRacesRemoval: one process writes into an old day
// folder while another deletes the files it wrote, each Delete removing
// the folder if that left it empty, and lists all along. Every Create
// succeeds and its file is there to read: removing a folder fails once it
// holds the Create's temp file, and a folder removed before that is made
// again.
func TestFolderRemoteCreateRacesRemoval(t *testing.T) {
	dir := t.TempDir()
	writer, tidier := newFolderRemote(t, dir), newFolderRemote(t, dir)
	ctx := context.Background()
	day := time.Now().AddDate(0, -2, 0)
	written := make(chan string)
	var wg sync.WaitGroup
	wg.Go(func() {
		for name := range written {
			if err := tidier.Delete(ctx, name); err != nil {
				t.Errorf("Delete(%s): %v", name, err)
			}
			if _, err := tidier.List(ctx, time.Time{}); err != nil {
				t.Errorf("List: %v", err)
			}
		}
	})
	defer wg.Wait()
	defer close(written)
	const n = 300
	for i := range n {
		name := dayName(day, fmt.Sprintf("patch_%03d", i))
		if err := writer.Create(ctx, name, strings.NewReader(name)); err != nil {
			t.Fatalf("Create %d: %v", i, err)
		}
		rc, err := writer.Open(ctx, name)
		if err != nil {
			t.Fatalf("Open %d right after Create: %v", i, err)
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(data) != name {
			t.Fatalf("%s: got %q, %v; want its content", name, data, err)
		}
		written <- name // deleted while the next one is created
	}
}
