package drivesync_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http/httptest"
	"path/filepath"
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
	st, err := syncserver.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv := httptest.NewServer(syncserver.NewHandler(st, syncserver.Options{Tokens: map[string]string{serverTestToken: "alice"}}))
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
