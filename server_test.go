package drivesync_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/httpremote"
	"github.com/drivesync/drivesync/syncserver"
)

const serverTestToken = "server-test-token-0123456789"

// startSyncServer serves a sync server over SQLite on loopback, and
// returns its URL.
func startSyncServer(t *testing.T) string {
	t.Helper()
	return startSyncServerWith(t, syncserver.Options{})
}

// startSyncServerWith is startSyncServer with opts (its Tokens set here).
func startSyncServerWith(t *testing.T, opts syncserver.Options) string {
	t.Helper()
	st, err := syncserver.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	opts.Tokens = map[string]string{serverTestToken: "alice"}
	srv := httptest.NewServer(syncserver.NewHandler(st, opts))
	t.Cleanup(srv.Close)
	return srv.URL
}

// serverDevice opens a database with a notes table syncing through the
// server at url, which sends pulls in pages of pageSize records, with
// progress as its Config.Progress.
func serverDevice(t *testing.T, url, name string, pageSize int, progress func(drivesync.Progress)) (*sql.DB, *drivesync.Engine) {
	t.Helper()
	return openNotes(t, name, drivesync.Config{
		Server:   httpremote.New(url, serverTestToken, httpremote.Options{PageSize: pageSize}),
		Progress: progress,
	})
}

// insertNotes writes n notes with ids prefix0, prefix1... in one
// transaction.
func insertNotes(t *testing.T, db *sql.DB, prefix string, n int) {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for i := range n {
		if _, err := tx.Exec(`INSERT INTO notes (id, content) VALUES (?, jsonb(?))`, fmt.Sprint(prefix, i), fmt.Sprintf(`{"v":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestProgressThroughServer: through a sync server no total is negative.
// The download, which pulls pages of records until the last says there
// are no more, counts the records pulled and knows their total at its
// last update; the upload and the apply know theirs from the start, and
// every count reaches its total.
func TestProgressThroughServer(t *testing.T) {
	ctx := context.Background()
	url := startSyncServer(t)
	const received, own = 3000, 200
	dbA, a := serverDevice(t, url, "dev-a", 500, nil)
	insertNotes(t, dbA, "a", received)
	if _, err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var updates []drivesync.Progress
	dbB, b := serverDevice(t, url, "dev-b", 500, func(p drivesync.Progress) { updates = append(updates, p) })
	insertNotes(t, dbB, "b", own)
	r, err := b.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.ChangesReceived != received || r.ChangesSent != own {
		t.Fatalf("b received %d changes and sent %d, want %d and %d", r.ChangesReceived, r.ChangesSent, received, own)
	}
	first, last := drivesync.ProgressSteps(t, updates)
	if d := last["download"]; d.Records != received {
		t.Errorf("download ended at %+v, want the %d records pulled", d, received)
	}
	if u := first["upload"]; u.TotalRecords != own {
		t.Errorf("upload starts at %+v, want a total of %d changes", u, own)
	}
	if ap := first["apply"]; ap.TotalRecords != own+received {
		t.Errorf("apply starts at %+v, want a total of %d records", ap, own+received)
	}
}

// TestReportUploadedThroughServer: a sync through a server moves no
// file, so Report.Uploaded, like Report.Downloaded, is empty; ChangesSent
// and ChangesReceived count what went out and what came in.
func TestReportUploadedThroughServer(t *testing.T) {
	ctx := context.Background()
	url := startSyncServer(t)
	dbA, a := serverDevice(t, url, "dev-a", 0, nil)
	_, b := serverDevice(t, url, "dev-b", 0, nil)
	insertNotes(t, dbA, "a", 3)
	r, err := a.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Uploaded != "" || r.ChangesSent != 3 {
		t.Errorf("a pushed: Uploaded %q, ChangesSent %d; want no file named and 3 changes sent", r.Uploaded, r.ChangesSent)
	}
	r, err = b.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Downloaded) != 0 || r.Uploaded != "" || r.ChangesReceived != 3 || r.ChangesSent != 0 {
		t.Errorf("b pulled: %+v; want no file named and 3 changes received", r)
	}
}

// pullCounter is a transport that counts what the pulls through it
// bring, the rows of their pages and the bytes of their bodies, and the
// pushes it sends. Its
// aroundPush, when set, takes the next push: it sends it by calling
// push, and may do more before or after.
type pullCounter struct {
	mu         sync.Mutex
	rows       int
	bytes      int64
	pushes     int
	aroundPush func(push func() (*http.Response, error)) (*http.Response, error)
}

func (c *pullCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == "/sync/push" {
		c.mu.Lock()
		c.pushes++
		around := c.aroundPush
		c.aroundPush = nil
		c.mu.Unlock()
		if around != nil {
			return around(func() (*http.Response, error) { return http.DefaultTransport.RoundTrip(req) })
		}
	}
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || req.URL.Path != "/sync/pull" || res.StatusCode != http.StatusOK {
		return res, err
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		return nil, err
	}
	var page struct{ Changes map[string][]json.RawMessage }
	if err := json.Unmarshal(b, &page); err != nil {
		return nil, err
	}
	c.mu.Lock()
	for _, rows := range page.Changes {
		c.rows += len(rows)
	}
	c.bytes += int64(len(b))
	c.mu.Unlock()
	res.Body = io.NopCloser(bytes.NewReader(b))
	return res, nil
}

// take returns the rows and bytes pulled since the last call.
func (c *pullCounter) take() (rows int, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rows, n = c.rows, c.bytes
	c.rows, c.bytes = 0, 0
	return rows, n
}

// countedDevice is serverDevice on the server at url, its requests
// going through a pullCounter.
func countedDevice(t *testing.T, url, name string) (*sql.DB, *drivesync.Engine, *pullCounter) {
	t.Helper()
	c := &pullCounter{}
	db, eng := openNotes(t, name, drivesync.Config{
		Server: httpremote.New(url, serverTestToken, httpremote.Options{HTTPClient: &http.Client{Transport: c}}),
	})
	return db, eng, c
}

// TestOwnPushNotPulledBack: a device does not pull back what it pushed.
// After a sync that pushed 3,000 notes (in one push, or in many under a
// server's small body limit), the next sync pulls no record and receives
// no change, and neither does the sync after an edit's; another device
// receives them all.
func TestOwnPushNotPulledBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		maxBody int64
	}{{"one push", 0}, {"many pushes", 64 << 10}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			url := startSyncServerWith(t, syncserver.Options{MaxBodyBytes: tc.maxBody})
			dbA, a, pulls := countedDevice(t, url, "work")
			insertNotes(t, dbA, "n", 3000)
			if r, err := a.Sync(ctx); err != nil || r.ChangesSent != 3000 {
				t.Fatalf("first sync: %+v, %v; want 3000 changes sent", r, err)
			}
			if many := pulls.pushes > 1; many != (tc.maxBody > 0) {
				t.Fatalf("the notes went in %d pushes: the test needs %s", pulls.pushes, tc.name)
			}
			pulls.take()
			r, err := a.Sync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rows, n := pulls.take()
			if r.ChangesReceived != 0 || rows != 0 {
				t.Errorf("the sync after the push received %d changes and pulled %d records (%d bytes); want none", r.ChangesReceived, rows, n)
			}
			if _, err := dbA.Exec(`UPDATE notes SET content = jsonb_set(content, '$.v', 'edited') WHERE id = 'n7'`); err != nil {
				t.Fatal(err)
			}
			if r, err := a.Sync(ctx); err != nil || r.ChangesSent != 1 {
				t.Fatalf("sync of an edit: %+v, %v; want 1 change sent", r, err)
			}
			pulls.take()
			r, err = a.Sync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if rows, n := pulls.take(); r.ChangesReceived != 0 || rows != 0 {
				t.Errorf("the sync after the edit's received %d changes and pulled %d records (%d bytes); want none", r.ChangesReceived, rows, n)
			}
			_, b := serverDevice(t, url, "home", 0, nil)
			if r, err := b.Sync(ctx); err != nil || r.ChangesReceived != 3000 {
				t.Errorf("another device's sync: %+v, %v; want 3000 changes received", r, err)
			}
		})
	}
}

// TestWriteAroundPushIsPulled: another device's write that commits
// between a device's pull and its push, or while its push runs, or right
// after it, reaches the device at its next sync, also when both wrote
// the same record; that sync counts only the other device's changes.
func TestWriteAroundPushIsPulled(t *testing.T) {
	for _, when := range []string{"before the push", "during the push", "after the push"} {
		t.Run(when, func(t *testing.T) {
			ctx := context.Background()
			url := startSyncServer(t)
			dbA, a, transport := countedDevice(t, url, "dev-a")
			dbB, b := serverDevice(t, url, "dev-b", 0, nil)
			if _, err := dbA.Exec(`INSERT INTO notes (id, content) VALUES ('shared', jsonb('{"v":0}'))`); err != nil {
				t.Fatal(err)
			}
			for _, e := range []*drivesync.Engine{a, b} {
				if _, err := e.Sync(ctx); err != nil {
					t.Fatal(err)
				}
			}
			writeB := func() error {
				if _, err := dbB.Exec(`UPDATE notes SET content = jsonb_set(content, '$.y', 'b') WHERE id = 'shared'`); err != nil {
					return err
				}
				if _, err := dbB.Exec(`INSERT INTO notes (id, content) VALUES ('b-new', jsonb('{"v":2}'))`); err != nil {
					return err
				}
				r, err := b.Sync(ctx)
				if err == nil && r.ChangesSent != 2 {
					err = fmt.Errorf("b sent %d changes, want 2", r.ChangesSent)
				}
				return err
			}
			transport.aroundPush = func(push func() (*http.Response, error)) (*http.Response, error) {
				switch when {
				case "before the push":
					if err := writeB(); err != nil {
						return nil, err
					}
					return push()
				case "during the push":
					done := make(chan error, 1)
					go func() { done <- writeB() }()
					res, err := push()
					if errB := <-done; errB != nil {
						t.Errorf("b: %v", errB)
					}
					return res, err
				}
				res, err := push()
				if err == nil {
					err = writeB()
				}
				return res, err
			}
			if _, err := dbA.Exec(`UPDATE notes SET content = jsonb_set(content, '$.x', 'a') WHERE id = 'shared'`); err != nil {
				t.Fatal(err)
			}
			if _, err := dbA.Exec(`INSERT INTO notes (id, content) VALUES ('a-new', jsonb('{"v":1}'))`); err != nil {
				t.Fatal(err)
			}
			if r, err := a.Sync(ctx); err != nil || r.ChangesSent != 2 {
				t.Fatalf("a's sync: %+v, %v; want 2 changes sent", r, err)
			}
			r, err := a.Sync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// a-new, and shared as a pushed it, are a's own: what a
			// receives is b's new note and b's field of shared.
			if r.ChangesReceived != 2 {
				t.Errorf("a's next sync received %d changes, want b's 2", r.ChangesReceived)
			}
			if _, err := b.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			want := `a-new {"v":1}|b-new {"v":2}|shared {"v":0,"x":"a","y":"b"}|`
			for name, db := range map[string]*sql.DB{"a": dbA, "b": dbB} {
				if got := notesDump(t, db); got != want {
					t.Errorf("%s holds %s, want %s", name, got, want)
				}
			}
		})
	}
}

// notesDump is the notes table, by id: "id content|" for each row.
func notesDump(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT id, json(content) FROM notes ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, content string
		if err := rows.Scan(&id, &content); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s|", id, content)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
