package main

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/drivesync/drivesync"
)

// chromium returns the browser the test drives: Debian's chromium. Without
// it the test skips, unless DRIVESYNC_REQUIRE_CHROMIUM is set (CI).
func chromium(t *testing.T) string {
	for _, p := range []string{os.Getenv("DRIVESYNC_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	if os.Getenv("DRIVESYNC_REQUIRE_CHROMIUM") != "" {
		t.Fatal("no chromium: install Debian's chromium package (apt-get install chromium)")
	}
	t.Skip("no chromium (apt-get install chromium); set DRIVESYNC_REQUIRE_CHROMIUM=1 to fail instead")
	return ""
}

// device is one instance of the app, served on loopback.
type device struct {
	name string
	url  string
	srv  *server
}

func startDevice(t testing.TB, name, shared string) *device {
	t.Helper()
	remote, err := drivesync.NewFolderRemote(shared)
	if err != nil {
		t.Fatal(err)
	}
	return startDeviceOn(t, name, remote)
}

// startDeviceOn starts a device that syncs through remote.
func startDeviceOn(t testing.TB, name string, remote drivesync.Remote) *device {
	t.Helper()
	srv, err := newServer(context.Background(), filepath.Join(t.TempDir(), name+".db"), drivesync.Config{Remote: remote, DeviceID: name}, "")
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		srv.Close()
	})
	return &device{name: name, url: hs.URL, srv: srv}
}

// TestBrowser drives two instances of the app (two databases, one shared
// folder) in headless Chromium: a note added on A reaches B through Sync
// now on each; the same note edited on both shows as a conflict on the
// side that lost, and "Keep mine" brings its value back on both.
func TestBrowser(t *testing.T) {
	exe := chromium(t)
	shots := os.Getenv("NOTES_WEB_SCREENSHOTS")
	if shots == "" {
		shots = filepath.Join(os.TempDir(), "notes-web-screenshots")
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", shots)
	shared := t.TempDir()
	a, b := startDevice(t, "device-a", shared), startDevice(t, "device-b", shared)

	// Chromium's helper processes may still write to its profile for a
	// moment after the browser exits: t.TempDir's cleanup then fails the
	// test on a directory not yet empty. This one is removed with retries.
	profile, err := os.MkdirTemp("", "notes-web-chromium-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if err := os.RemoveAll(profile); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("the browser's profile %s could not be removed", profile)
	})
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true), chromedp.NoFirstRun,
		chromedp.UserDataDir(profile), chromedp.WindowSize(1000, 900))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	browser, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel := context.WithTimeout(browser, 2*time.Minute)
	defer cancel()
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	tab := func() context.Context {
		c, _ := chromedp.NewContext(ctx)
		return c
	}
	ta, tb := tab(), tab()
	n := 0
	shot := func(c context.Context, what string) {
		t.Helper()
		var png []byte
		if err := chromedp.Run(c, chromedp.FullScreenshot(&png, 100)); err != nil {
			t.Fatal(err)
		}
		n++
		name := filepath.Join(shots, fmt.Sprintf("%02d-%s.png", n, what))
		if err := os.WriteFile(name, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	open := func(c context.Context, d *device) {
		t.Helper()
		if err := chromedp.Run(c, chromedp.Navigate(d.url), chromedp.WaitVisible(`body[data-live="1"]`, chromedp.ByQuery)); err != nil {
			t.Fatalf("%s: open the page: %v", d.name, err)
		}
	}
	// syncNow clicks Sync now and waits for the page to come back with
	// the sync done.
	syncNow := func(c context.Context, d *device) {
		t.Helper()
		before := d.lastSync(t, c)
		err := chromedp.Run(c, chromedp.Evaluate(`document.body.dataset.stale = "1"`, nil), chromedp.Click("#sync", chromedp.ByQuery))
		for err == nil {
			var stale bool
			chromedp.Run(c, chromedp.Evaluate(`document.body.dataset.stale === "1"`, &stale))
			if got := d.lastSync(t, c); !stale && got != before && strings.Contains(got, "ok") {
				break
			}
			if msg := errorText(c); msg != "" {
				t.Fatalf("%s: %s", d.name, msg)
			}
			err = chromedp.Run(c, chromedp.Sleep(100*time.Millisecond))
		}
		if err == nil {
			err = chromedp.Run(c, chromedp.WaitVisible(`body[data-live="1"]`, chromedp.ByQuery))
		}
		if err != nil {
			t.Fatalf("%s: Sync now: %v (last sync %q before %q)", d.name, err, d.lastSync(t, c), before)
		}
	}
	// submit clicks sel, which posts a form, and waits for the page the
	// app answers with: the page clicked on is marked stale first.
	submit := func(c context.Context, d *device, sel string) {
		t.Helper()
		if err := chromedp.Run(c,
			chromedp.Evaluate(`document.body.dataset.stale = "1"`, nil),
			chromedp.Click(sel, chromedp.ByQuery),
			chromedp.WaitVisible(`body[data-live="1"]:not([data-stale])`, chromedp.ByQuery)); err != nil {
			t.Fatalf("%s: click %s: %v", d.name, sel, err)
		}
	}
	notes := func(c context.Context) []string {
		t.Helper()
		var texts []string
		if err := chromedp.Run(c, chromedp.Evaluate(`[...document.querySelectorAll("li.note input[name=text]")].map(e => e.value)`, &texts)); err != nil {
			t.Fatal(err)
		}
		return texts
	}

	// The bar fills against the changes an apply counts, not its files;
	// a sync server's pull, whose total only its last page tells, shows
	// a busy bar, with the changes pulled so far.
	open(ta, a)
	for _, c := range []struct {
		p        drivesync.Progress
		text     string
		position float64 // -1: no value, a busy bar
	}{
		{drivesync.Progress{Step: "apply", Total: 2, Records: 1000, TotalRecords: 4000}, "apply 1000/4000 changes", 0.25},
		{drivesync.Progress{Step: "download", Records: 500}, "download 500 changes", -1},
		{drivesync.Progress{Step: "download", Done: 1, Total: 4, Bytes: 10, TotalBytes: 20}, "download 1/4 files", 0.5},
	} {
		a.srv.progress(c.p)
		var position float64
		err := chromedp.Run(ta, chromedp.Poll(`document.getElementById("sync-state").textContent === `+strconv.Quote(c.text), nil, chromedp.WithPollingTimeout(10*time.Second)),
			chromedp.Evaluate(`document.getElementById("progress").position`, &position))
		if err != nil || position != c.position {
			var text string
			chromedp.Run(ta, chromedp.Evaluate(`document.getElementById("sync-state").textContent`, &text))
			t.Fatalf("progress %+v: the page shows %q, its bar at %v (%v); want %q, at %v", c.p, text, position, err, c.text, c.position)
		}
	}

	// A adds a note; Sync now on A, then on B: B shows it.
	if err := chromedp.Run(ta, chromedp.SendKeys("#new-text", "hello from A", chromedp.ByQuery)); err != nil {
		t.Fatalf("type a note on A: %v", err)
	}
	submit(ta, a, "#add")
	shot(ta, "a-added")
	syncNow(ta, a)
	shot(ta, "a-synced")
	open(tb, b)
	shot(tb, "b-before-sync")
	syncNow(tb, b)
	shot(tb, "b-synced")
	if got := notes(tb); len(got) != 1 || got[0] != "hello from A" {
		t.Fatalf("B shows %q after syncing, want A's note", got)
	}

	// Both edit it before syncing: A syncs, then B (whose write is stamped
	// after A's and wins), then A, which lost.
	edit := func(c context.Context, d *device, text string) {
		t.Helper()
		if err := chromedp.Run(c, chromedp.SetValue(`li.note input[name=text]`, text, chromedp.ByQuery)); err != nil {
			t.Fatalf("%s: edit: %v", d.name, err)
		}
		submit(c, d, `li.note button.save`)
	}
	// The add and the two edits fall in different seconds, so both edits
	// set updated_at and conflict there too: the page lists only the
	// conflict on the text.
	nextSecond()
	edit(ta, a, "A's edit")
	nextSecond()
	edit(tb, b, "B's edit")
	syncNow(ta, a)
	syncNow(tb, b)
	syncNow(ta, a)
	if got := notes(ta); len(got) != 1 || got[0] != "B's edit" {
		t.Fatalf("A shows %q, want B's edit, which synced later", got)
	}
	var loser string
	if err := chromedp.Run(ta, chromedp.Text(`.conflict .loser`, &loser, chromedp.ByQuery)); err != nil {
		t.Fatalf("A shows no conflict: %v", err)
	}
	if loser != `"A's edit"` {
		t.Fatalf("A's conflict shows %q as its value", loser)
	}
	var shown int
	if err := chromedp.Run(ta, chromedp.Evaluate(`document.querySelectorAll(".conflict").length`, &shown)); err != nil || shown != 1 {
		t.Fatalf("A shows %d conflicts, want the one on the text (%v)", shown, err)
	}
	if logged := a.conflicts(t); len(logged) != 2 {
		t.Fatalf("A logged %v, want conflicts on text and updated_at", logged)
	}
	shot(ta, "a-conflict")
	var bConflicts int
	if err := chromedp.Run(tb, chromedp.Navigate(b.url), chromedp.WaitVisible(`body[data-live="1"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll(".conflict").length`, &bConflicts)); err != nil || bConflicts != 0 {
		t.Fatalf("B, whose edit won, shows %d conflicts (%v)", bConflicts, err)
	}

	// Keep mine on A: A's value is back, and reaches B.
	submit(ta, a, `.conflict .keep-mine`)
	if err := chromedp.Run(ta, chromedp.WaitVisible(`#no-conflicts`, chromedp.ByQuery)); err != nil {
		t.Fatalf("keep mine: %v", err)
	}
	if got := notes(ta); len(got) != 1 || got[0] != "A's edit" {
		t.Fatalf("A shows %q after keeping its value", got)
	}
	if logged := a.conflicts(t); len(logged) != 0 {
		t.Fatalf("A still logs %v after keeping its text", logged)
	}
	shot(ta, "a-kept-mine")
	syncNow(ta, a)
	syncNow(tb, b)
	if got := notes(tb); len(got) != 1 || got[0] != "A's edit" {
		t.Fatalf("B shows %q, want A's kept value", got)
	}
	shot(tb, "b-final")
}

// conflicts returns the paths of the conflicts d's engine logs.
func (d *device) conflicts(t *testing.T) []string {
	t.Helper()
	cs, err := d.srv.app.Engine.Conflicts(context.Background(), drivesync.ConflictFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, c := range cs {
		paths = append(paths, strings.Join(c.Path, "."))
	}
	return paths
}

// lastSync returns the status panel's last sync line.
func (d *device) lastSync(t *testing.T, c context.Context) string {
	t.Helper()
	var s string
	js := `(e => e ? e.dataset.at + " " + e.textContent : "")(document.getElementById("last-sync"))`
	if err := chromedp.Run(c, chromedp.Evaluate(js, &s)); err != nil && !errors.Is(err, context.Canceled) {
		// A page reloading now: ask again next time.
		return ""
	}
	return s
}

// errorText returns the page's error line, if any.
func errorText(c context.Context) string {
	var s string
	chromedp.Run(c, chromedp.Evaluate(`(document.getElementById("error") || {}).textContent || ""`, &s))
	return s
}

// nextSecond sleeps until the clock's next whole second: notes' updated_at
// counts seconds.
func nextSecond() {
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
}
