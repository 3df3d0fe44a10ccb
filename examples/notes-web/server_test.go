package main

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/drivesync/drivesync"
)

// TestCrossSiteFormPostCannotEditNotes: any web page the user visits can
// post a plain form to the app on 127.0.0.1 (a "simple" cross-origin
// request, sent without a preflight), and a note is named by its first 4
// characters, so a page that got through could overwrite or delete the
// user's notes by trying the 65,536 prefixes, and the next sync would
// carry the change to every device. The server refuses such a post.
func TestCrossSiteFormPostCannotEditNotes(t *testing.T) {
	d := startDevice(t, "a", t.TempDir())
	ctx := context.Background()
	id, err := d.srv.app.Add(ctx, "my important note")
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest(http.MethodPost, d.url+"/notes/"+id[:4], strings.NewReader(url.Values{"text": {"pwned"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	notes, err := d.srv.app.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) == 1 && notes[0].Text == "pwned" {
		t.Fatalf("a cross-site form post (Origin https://evil.example, answered %d) overwrote note %s by its first 4 characters: now %q", res.StatusCode, id, notes[0].Text)
	}
}

// Before any sync the status says "never" and carries no time: a zero
// time is no moment to compare with.
func TestNeverSyncedCarriesNoTime(t *testing.T) {
	d := startDevice(t, "a", t.TempDir())
	p := d.get(t, "/")
	if !strings.Contains(p.html, `<dd id="last-sync" data-at="">never</dd>`) {
		t.Errorf("a device that never synced shows\n%s\nwant last sync never, with an empty data-at", p.html)
	}
}

// fillNotes writes n notes in one transaction, as "note 00000" to "note
// n-1", 7 to a second (see second): later notes are newer, notes of the
// same second tie on updated_at, and the first 7 have none (NULL).
func fillNotes(t testing.TB, d *device, n int) {
	t.Helper()
	ctx := context.Background()
	tx, err := d.srv.app.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ins, err := tx.PrepareContext(ctx, `INSERT INTO notes (id, content, updated_at) VALUES (?, jsonb(?), ?)`)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		var ts any
		if second(i) > 0 {
			ts = base.Add(time.Duration(second(i)) * time.Second).Format(time.RFC3339)
		}
		content, err := json.Marshal(map[string]any{"text": fmt.Sprintf("note %05d", i), "updated_at": ts, "deleted_at": nil})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ins.ExecContext(ctx, uuid.NewString(), string(content), ts); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// second returns the second fillNotes stamps note i with (0: none).
func second(i int) int { return i / 7 }

// shown is a page as the tests read it.
type shown struct {
	html         string
	ids, texts   []string
	older, newer string // the links to the next and previous pages, "" if none
}

var (
	noteID   = regexp.MustCompile(`<li class="note" data-id="([^"]*)"`)
	noteText = regexp.MustCompile(`name="text" value="([^"]*)" aria-label="note text"`)
	pageLink = regexp.MustCompile(`<a id="(older|newer)" href="([^"]*)"`)
)

// get fetches the page at path (a path and query) from d.
func (d *device) get(t testing.TB, path string) shown {
	t.Helper()
	res, err := http.Get(d.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", path, res.Status, body)
	}
	p := shown{html: string(body)}
	for _, m := range noteID.FindAllStringSubmatch(p.html, -1) {
		p.ids = append(p.ids, html.UnescapeString(m[1]))
	}
	for _, m := range noteText.FindAllStringSubmatch(p.html, -1) {
		p.texts = append(p.texts, html.UnescapeString(m[1]))
	}
	for _, m := range pageLink.FindAllStringSubmatch(p.html, -1) {
		if m[1] == "older" {
			p.older = html.UnescapeString(m[2])
		} else {
			p.newer = html.UnescapeString(m[2])
		}
	}
	return p
}

// index returns the number in a note's text ("note 00042": 42).
func index(t testing.TB, text string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimPrefix(text, "note "))
	if err != nil {
		t.Fatalf("a note reads %q, not one fillNotes wrote", text)
	}
	return n
}

// TestPageOf50000NotesIsSmall: with 50,000 notes the page lists one page
// of them, the newest, in a page of bounded size, and its link to older
// notes leads to the next ones.
func TestPageOf50000NotesIsSmall(t *testing.T) {
	d := startDevice(t, "a", t.TempDir())
	const n = 50000
	fillNotes(t, d, n)
	first := d.get(t, "/")
	if len(first.html) > 100<<10 {
		t.Errorf("the page of 50,000 notes is %d bytes, want at most 100 KiB", len(first.html))
	}
	if len(first.texts) == 0 || len(first.texts) > pageSize || len(first.ids) != len(first.texts) {
		t.Fatalf("the page lists %d notes (%d ids), want 1 to %d", len(first.texts), len(first.ids), pageSize)
	}
	if got := index(t, first.texts[0]); second(got) != second(n-1) {
		t.Errorf("the page starts with note %d, want one of the newest second's", got)
	}
	if first.older == "" {
		t.Fatal("the first page has no link to older notes")
	}
	if first.newer != "" {
		t.Errorf("the first page links to newer notes: %s", first.newer)
	}
	next := d.get(t, first.older)
	if len(next.texts) != pageSize {
		t.Fatalf("the second page lists %d notes, want %d", len(next.texts), pageSize)
	}
	last := index(t, first.texts[len(first.texts)-1])
	for i, text := range next.texts {
		if second(index(t, text)) > second(last) || slices.Contains(first.ids, next.ids[i]) {
			t.Fatalf("the second page lists %s, not older than the first page's last, note %d", text, last)
		}
	}
	if next.newer == "" {
		t.Error("the second page has no link back to newer notes")
	}
}

// TestPagesListEveryNoteOnce: following the links to older notes from the
// first page to the last lists every note once, newest first, and the
// links to newer notes lead back through the same pages. Notes of the
// same second straddle pages, and so do notes without updated_at, which
// come last; a deleted note is not listed.
func TestPagesListEveryNoteOnce(t *testing.T) {
	d := startDevice(t, "a", t.TempDir())
	const n = 2*pageSize + 4 // pages break among the 7 notes without updated_at
	fillNotes(t, d, n)
	all, err := d.srv.app.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	deleted := all[n/2]
	if err := d.srv.app.Update(context.Background(), deleted.ID, "deleted_at", "2026-01-02T00:00:00Z"); err != nil {
		t.Fatal(err)
	}

	var pages []shown
	seen := map[string]bool{}
	prev := n
	for p := d.get(t, "/"); ; p = d.get(t, p.older) {
		pages = append(pages, p)
		for i, text := range p.texts {
			k := index(t, text)
			if seen[p.ids[i]] || second(k) > second(prev) {
				t.Fatalf("page %d lists %s after note %d (seen before: %v)", len(pages), text, prev, seen[p.ids[i]])
			}
			seen[p.ids[i]], prev = true, k
		}
		if p.older == "" {
			break
		}
		if len(pages) > n {
			t.Fatal("the links to older notes go round in circles")
		}
	}
	if len(seen) != n-1 || seen[deleted.ID] {
		t.Fatalf("the pages list %d notes (the deleted one: %v), want the %d not deleted", len(seen), seen[deleted.ID], n-1)
	}
	if len(pages) != 3 {
		t.Fatalf("%d notes make %d pages, want 3", n-1, len(pages))
	}
	for i := len(pages) - 1; i > 0; i-- {
		back := d.get(t, pages[i].newer)
		if strings.Join(back.ids, " ") != strings.Join(pages[i-1].ids, " ") {
			t.Fatalf("the link to newer notes from page %d shows %v, want page %d's %v", i+1, back.texts, i, pages[i-1].texts)
		}
	}
}

// post sends a form to d and returns where the app sends the browser.
func (d *device) post(t testing.TB, path string, form url.Values) string {
	t.Helper()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.PostForm(d.url+path, form)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("POST %s: %s, want a redirect", path, res.Status)
	}
	return res.Header.Get("Location")
}

// action returns where the form whose action starts with path (and goes
// on with a query or nothing) posts to.
func (p shown) action(t testing.TB, path string) string {
	t.Helper()
	m := regexp.MustCompile(`action="(` + regexp.QuoteMeta(path) + `(?:\?[^"]*)?)"`).FindStringSubmatch(p.html)
	if m == nil {
		t.Fatalf("the page has no form that posts to %s", path)
	}
	return html.UnescapeString(m[1])
}

// TestFormsOnALaterPage: a note deleted on the second page brings the
// browser back to that page, without it; a note edited there is now the
// newest, and the browser goes to the first page, which lists it first.
func TestFormsOnALaterPage(t *testing.T) {
	d := startDevice(t, "a", t.TempDir())
	fillNotes(t, d, 3*pageSize)
	first := d.get(t, "/")
	if first.older == "" {
		t.Fatal("the first page has no link to older notes")
	}
	page := d.get(t, first.older)

	gone := page.ids[3]
	to := d.post(t, page.action(t, "/notes/"+gone+"/delete"), nil)
	after := d.get(t, to)
	if after.ids[0] != page.ids[0] || slices.Contains(after.ids, gone) {
		t.Fatalf("after a delete on the second page the browser goes to %s, which starts with %s and lists the deleted note: %v; want the second page without it", to, after.texts[0], slices.Contains(after.ids, gone))
	}

	edited := page.ids[5]
	to = d.post(t, page.action(t, "/notes/"+edited), url.Values{"text": {"edited on page 2"}})
	first = d.get(t, to)
	if first.ids[0] != edited || first.texts[0] != "edited on page 2" || first.newer != "" {
		t.Fatalf("after an edit on the second page the browser goes to %s, which starts with %q; want the first page, with the edited note first", to, first.texts[0])
	}

	to = d.post(t, page.action(t, "/notes"), url.Values{"text": {"  "}})
	if again := d.get(t, to); again.ids[0] != after.ids[0] || !strings.Contains(again.html, "a note needs some text") {
		t.Fatalf("an empty note added on the second page goes to %s, which starts with %s; want the second page with the error", to, again.texts[0])
	}
}

// heldRemote holds every List until released: a sync in flight.
type heldRemote struct {
	drivesync.Remote
	listing chan struct{} // gets a value when a List waits
	release chan struct{} // closed to let Lists go on
}

func (r *heldRemote) List(ctx context.Context, since time.Time) ([]drivesync.RemoteFile, error) {
	select {
	case r.listing <- struct{}{}:
	default:
	}
	select {
	case <-r.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return r.Remote.List(ctx, since)
}

// TestPageLoadedMidSyncSaysASyncRuns: a page loaded while a sync runs
// says so (and the live progress takes over from there); once the sync
// has ended, a page shows the last sync's status.
func TestPageLoadedMidSyncSaysASyncRuns(t *testing.T) {
	folder, err := drivesync.NewFolderRemote(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	remote := &heldRemote{Remote: folder, listing: make(chan struct{}, 1), release: make(chan struct{})}
	d := startDeviceOn(t, "a", remote)
	const running = "A sync is running"
	if p := d.get(t, "/"); strings.Contains(p.html, running) {
		t.Fatal("before any sync the page says a sync is running")
	}
	events := d.srv.events.subscribe()
	defer d.srv.events.unsubscribe(events)
	res, err := http.Post(d.url+"/sync", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	select {
	case <-remote.listing:
	case <-time.After(time.Minute):
		t.Fatal("the sync did not list the remote")
	}

	mid := d.get(t, "/")
	released := false
	defer func() {
		if !released {
			close(remote.release)
		}
	}()
	if !strings.Contains(mid.html, running) {
		t.Errorf("a page loaded while a sync runs does not say %q", running)
	}
	if !regexp.MustCompile(`<button id="sync" type="button" disabled>`).MatchString(mid.html) {
		t.Error("a page loaded while a sync runs offers Sync now")
	}

	close(remote.release)
	released = true
	for ended := false; !ended; {
		select {
		case ev := <-events:
			ended = ev.name == "synced"
		case <-time.After(time.Minute):
			t.Fatal("the sync did not end once released")
		}
	}
	done := d.get(t, "/")
	if strings.Contains(done.html, running) {
		t.Error("after the sync the page still says one runs")
	}
	if !strings.Contains(done.html, "— ok") {
		t.Errorf("after the sync the page does not show it ended well:\n%s", done.html)
	}
}

// BenchmarkPageOf50000Notes measures the first page of 50,000 notes: its
// time, and its size in bytes (page-bytes). The notes are all pending
// (just written), or synced, as a device's store mostly is.
func BenchmarkPageOf50000Notes(b *testing.B) {
	for _, synced := range []bool{false, true} {
		name := map[bool]string{false: "pending", true: "synced"}[synced]
		b.Run(name, func(b *testing.B) {
			d := startDevice(b, "a", b.TempDir())
			fillNotes(b, d, 50000)
			if synced {
				if _, err := d.srv.app.Engine.Sync(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			var size int64
			for b.Loop() {
				res, err := http.Get(d.url + "/")
				if err != nil {
					b.Fatal(err)
				}
				size, err = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if err != nil || res.StatusCode != http.StatusOK {
					b.Fatalf("GET /: %s, %v", res.Status, err)
				}
			}
			b.ReportMetric(float64(size), "page-bytes")
		})
	}
}
