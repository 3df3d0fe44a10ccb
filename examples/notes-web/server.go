package main

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/examples/internal/notesapp"
)

// server is one device's web app.
type server struct {
	app    *notesapp.App
	mux    http.ServeMux
	events *hub
	// syncing is set while a sync started by the button runs: a second
	// click waits for it rather than queueing another.
	mu      sync.Mutex
	syncing bool
}

func (s *server) Close() error { return s.app.Close() }

// ServeHTTP serves the app to this machine's browser only. Any page the
// user visits may send forms to a port on 127.0.0.1: a request another
// site sends (CrossOriginProtection, by Sec-Fetch-Site and Origin) is
// refused, and so is one that names another host, as a page whose name
// was rebound to 127.0.0.1 does.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !loopbackHost(r.Host) {
		http.Error(w, "this app answers only as localhost or 127.0.0.1, not as "+r.Host, http.StatusForbidden)
		return
	}
	crossOrigin.Handler(&s.mux).ServeHTTP(w, r)
}

var crossOrigin = http.NewCrossOriginProtection()

// loopbackHost reports whether a request's Host names this machine.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (s *server) routes() {
	s.mux.HandleFunc("GET /{$}", s.index)
	s.mux.HandleFunc("POST /notes", s.add)
	s.mux.HandleFunc("POST /notes/{id}", s.edit)
	s.mux.HandleFunc("POST /notes/{id}/delete", s.remove)
	s.mux.HandleFunc("POST /conflicts/{id}/{keep}", s.resolve)
	s.mux.HandleFunc("POST /sync", s.sync)
	s.mux.HandleFunc("GET /events", s.stream)
}

// pageSize is how many notes a page lists: the page stays small and
// quick however many notes the database holds.
const pageSize = 100

// page is what the index template shows.
type page struct {
	Notes []notesapp.Note
	// Here is the query that names this page ("" for the first): the
	// forms carry it, to come back to the same page. Newer and Older
	// link to the pages before and after it, "" if there are none.
	Here, Newer, Older string
	// Syncing says that a sync runs: the page says so and follows it.
	Syncing   bool
	Status    drivesync.Status
	Conflicts []drivesync.Conflict
	Error     string
}

func (s *server) index(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	p, err := s.notesPage(ctx, r.URL.Query())
	if err != nil {
		if errors.Is(err, errPageLink) {
			goTo(w, r, nil, err) // the first page, which says what happened
			return
		}
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.mu.Lock()
	p.Syncing = s.syncing
	s.mu.Unlock()
	if p.Status, err = s.app.Engine.Status(ctx); err == nil {
		p.Conflicts, err = s.app.Conflicts(ctx)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	p.Error = r.URL.Query().Get("error")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := indexTemplate.Execute(w, p); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// notesPage reads the page of notes q names. A page is named by the note
// it starts after (?after=, read toward older notes) or ends before
// (?before=, toward newer ones), not by a count of notes to skip, so a
// page deep in the list is read from the index as quickly as the first.
// A note is named by its notesapp.Key, as JSON [updated_at, id] in
// base64url.
func (s *server) notesPage(ctx context.Context, q url.Values) (page, error) {
	var p page
	var notes notesapp.Page
	var err error
	switch {
	case q.Has("after"):
		var after notesapp.Key
		if after, err = decodeKey(q.Get("after")); err != nil {
			return p, err
		}
		if notes, err = s.app.Older(ctx, &after, pageSize); err != nil {
			return p, err
		}
		p.Here = "?after=" + q.Get("after")
		p.Newer = "/?before=" + q.Get("after") // when the page is empty: the notes before it
		if len(notes.Keys) > 0 {
			p.Newer = "/?before=" + encodeKey(notes.Keys[0])
		}
		if notes.More {
			p.Older = "/?after=" + encodeKey(notes.Keys[len(notes.Keys)-1])
		}
	case q.Has("before"):
		var before notesapp.Key
		if before, err = decodeKey(q.Get("before")); err != nil {
			return p, err
		}
		if notes, err = s.app.Newer(ctx, before, pageSize); err != nil {
			return p, err
		}
		if !notes.More {
			// The first page, and perhaps short of it: the first page as
			// it is, full.
			return s.notesPage(ctx, nil)
		}
		p.Here = "?before=" + q.Get("before")
		p.Newer = "/?before=" + encodeKey(notes.Keys[0])
		p.Older = "/?after=" + encodeKey(notes.Keys[len(notes.Keys)-1])
	default:
		if notes, err = s.app.Older(ctx, nil, pageSize); err != nil {
			return p, err
		}
		if notes.More {
			p.Older = "/?after=" + encodeKey(notes.Keys[len(notes.Keys)-1])
		}
	}
	p.Notes = notes.Notes
	return p, nil
}

// errPageLink is a page link (?after= or ?before=) the app did not make.
var errPageLink = errors.New("bad page link")

func encodeKey(k notesapp.Key) string {
	var at any // NULL: JSON null
	if k.UpdatedAt.Valid {
		at = k.UpdatedAt.String
	}
	b, _ := json.Marshal([]any{at, k.ID})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeKey(s string) (notesapp.Key, error) {
	var k notesapp.Key
	var parts []*string
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &parts)
	}
	if err != nil || len(parts) != 2 || parts[1] == nil {
		return k, fmt.Errorf("%w: %q names no note's place (this app did not make it); here are the newest notes", errPageLink, s)
	}
	if parts[0] != nil {
		k.UpdatedAt = sql.NullString{String: *parts[0], Valid: true}
	}
	k.ID = *parts[1]
	return k, nil
}

// back redirects to the page of notes the form was on (its query names
// it, see page.Here), with err shown if there is one.
func back(w http.ResponseWriter, r *http.Request, err error) {
	here := url.Values{}
	for _, name := range []string{"after", "before"} {
		if r.URL.Query().Has(name) {
			here.Set(name, r.URL.Query().Get(name))
		}
	}
	goTo(w, r, here, err)
}

// toNewest redirects to the first page, where a note just added or
// edited is, or back to the form's page to show err.
func toNewest(w http.ResponseWriter, r *http.Request, err error) {
	if err != nil {
		back(w, r, err)
		return
	}
	goTo(w, r, nil, nil)
}

// goTo redirects to the page of notes q names, with err shown if there is
// one.
func goTo(w http.ResponseWriter, r *http.Request, q url.Values, err error) {
	if q == nil {
		q = url.Values{}
	}
	if err != nil {
		q.Set("error", err.Error())
	}
	to := "/"
	if len(q) > 0 {
		to += "?" + q.Encode()
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

func (s *server) add(w http.ResponseWriter, r *http.Request) {
	text := strings.TrimSpace(r.FormValue("text"))
	if text == "" {
		back(w, r, fmt.Errorf("a note needs some text"))
		return
	}
	_, err := s.app.Add(r.Context(), text)
	toNewest(w, r, err)
}

func (s *server) edit(w http.ResponseWriter, r *http.Request) {
	toNewest(w, r, s.app.Update(r.Context(), r.PathValue("id"), "text", r.FormValue("text")))
}

func (s *server) remove(w http.ResponseWriter, r *http.Request) {
	back(w, r, s.app.Update(r.Context(), r.PathValue("id"), "deleted_at", notesapp.Now()))
}

func (s *server) resolve(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		back(w, r, fmt.Errorf("conflict id %q is not a number", r.PathValue("id")))
		return
	}
	keep := map[string]drivesync.Resolution{"mine": drivesync.KeepLoser, "theirs": drivesync.KeepWinner}
	k, ok := keep[r.PathValue("keep")]
	if !ok {
		back(w, r, fmt.Errorf("keep mine or theirs, not %q", r.PathValue("keep")))
		return
	}
	back(w, r, s.app.Resolve(r.Context(), id, k))
}

// sync starts a sync, unless one runs; the page follows it on /events.
func (s *server) sync(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	running := s.syncing
	s.syncing = true
	s.mu.Unlock()
	if !running {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			rep, err := s.app.Engine.Sync(ctx)
			s.mu.Lock()
			s.syncing = false
			s.mu.Unlock()
			done := map[string]any{"summary": notesapp.Summary(rep)}
			if err != nil {
				done["error"] = err.Error()
			}
			s.events.send("synced", done)
		}()
	}
	w.WriteHeader(http.StatusAccepted)
}

// progress is the engine's Config.Progress: it goes to every page open.
func (s *server) progress(p drivesync.Progress) {
	s.events.send("progress", map[string]any{"step": p.Step, "done": p.Done, "total": p.Total, "bytes": p.Bytes, "totalBytes": p.TotalBytes, "records": p.Records, "totalRecords": p.TotalRecords})
}

// stream sends the sync's events to a page, as server-sent events.
func (s *server) stream(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	ch := s.events.subscribe()
	defer s.events.unsubscribe(ch)
	// Whether a sync runs, read after subscribing: if one runs, its end
	// comes on ch. A page that showed a sync running that ended before it
	// listened learns so here.
	s.mu.Lock()
	running := s.syncing
	s.mu.Unlock()
	fmt.Fprintf(w, "event: state\ndata: {\"syncing\":%t}\n\n", running)
	fl.Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case ev := <-ch:
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.name, ev.data)
			fl.Flush()
		}
	}
}

// hub fans events out to the pages listening.
type hub struct {
	mu   sync.Mutex
	subs map[chan event]bool
}

type event struct {
	name string
	data []byte
}

func newHub() *hub { return &hub{subs: map[chan event]bool{}} }

func (h *hub) subscribe() chan event {
	ch := make(chan event, 64)
	h.mu.Lock()
	h.subs[ch] = true
	h.mu.Unlock()
	return ch
}

func (h *hub) unsubscribe(ch chan event) {
	h.mu.Lock()
	delete(h.subs, ch)
	h.mu.Unlock()
}

// send gives every listener the event; a listener too slow for it misses
// a progress update, never the end of a sync.
func (h *hub) send(name string, v any) {
	data, _ := json.Marshal(v)
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- event{name, data}:
			continue
		default:
		}
		if name != "progress" {
			// Make room: an old update gives way to the sync's end.
			select {
			case <-ch:
			default:
			}
			select {
			case ch <- event{name, data}:
			default:
			}
		}
	}
}

var indexTemplate = template.Must(template.New("index").Funcs(template.FuncMap{
	"join": strings.Join,
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return t.Local().Format("15:04:05")
	},
}).Parse(indexHTML))
