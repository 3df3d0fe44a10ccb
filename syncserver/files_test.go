package syncserver

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// TestFilesProtocol checks a store of files through the raw protocol:
// create, read, list, a name taken by other bytes, the same bytes sent
// again, delete, names refused, and the two kinds of store kept apart.
func TestFilesProtocol(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		ts := newServer(t, spec)
		file := func(store, name string) string {
			return ts.URL + "/sync/file?store=" + store + "&name=" + name
		}
		if r := do(t, "PUT", file("s", "2026/a.gz"), aliceToken, "sealed bytes"); r.status != 200 || r.json(t)["created"] != true {
			t.Fatalf("PUT: %d %s", r.status, r.body)
		}
		if r := do(t, "PUT", file("s", "2026/a.gz"), aliceToken, "sealed bytes"); r.status != 200 || r.json(t)["created"] != false {
			t.Fatalf("PUT of the same bytes again: %d %s, want 200 created false", r.status, r.body)
		}
		if r := do(t, "PUT", file("s", "2026/a.gz"), aliceToken, "other bytes"); r.status != 412 || !strings.Contains(string(r.body), "file-exists") {
			t.Fatalf("PUT of other bytes under a taken name: %d %s, want 412 file-exists", r.status, r.body)
		}
		if r := do(t, "GET", file("s", "2026/a.gz"), aliceToken, ""); r.status != 200 || string(r.body) != "sealed bytes" {
			t.Fatalf("GET: %d %q", r.status, r.body)
		}
		r := do(t, "GET", ts.URL+"/sync/files?store=s", aliceToken, "")
		if r.status != 200 || !strings.Contains(string(r.body), `{"name":"2026/a.gz","size":12}`) {
			t.Fatalf("list: %d %s", r.status, r.body)
		}
		if r := do(t, "GET", ts.URL+"/sync/files?store=s&since=2999-01-01T00:00:00Z", aliceToken, ""); r.status != 200 || !strings.Contains(string(r.body), `"files":[]`) {
			t.Fatalf("list since a later time: %d %s, want no files", r.status, r.body)
		}
		for _, bad := range []string{"", "/abs", "a/../b", ".hidden", "a//b", "a%5Cb"} {
			if r := do(t, "PUT", file("s", bad), aliceToken, "x"); r.status != 400 || !strings.Contains(string(r.body), `"field":"name"`) {
				t.Errorf("PUT name %q: %d %s, want 400 naming the field name", bad, r.status, r.body)
			}
		}
		// A push makes a store of records; a file is refused there, and
		// a push to the store of files.
		if r := ts.push(t, aliceToken, "rec", "", `{"ops":{"notes":[{"op":"upsert","id":"n","title":"x"}]}}`); r.status != 200 {
			t.Fatalf("push: %d %s", r.status, r.body)
		}
		if r := do(t, "PUT", file("rec", "a"), aliceToken, "x"); r.status != 409 || !strings.Contains(string(r.body), "records-store") {
			t.Fatalf("PUT to a store of records: %d %s, want 409 records-store", r.status, r.body)
		}
		if r := ts.push(t, aliceToken, "s", "", `{"ops":{"notes":[{"op":"upsert","id":"n","title":"x"}]}}`); r.status != 409 || !strings.Contains(string(r.body), "files-store") {
			t.Fatalf("push to a store of files: %d %s, want 409 files-store", r.status, r.body)
		}
		if r := ts.pull(t, aliceToken, "store=s"); r.status != 409 || !strings.Contains(string(r.body), "files-store") {
			t.Fatalf("pull from a store of files: %d %s, want 409 files-store", r.status, r.body)
		}
		if r := do(t, "DELETE", file("s", "2026/a.gz"), aliceToken, ""); r.status != 200 || r.json(t)["deleted"] != true {
			t.Fatalf("DELETE: %d %s", r.status, r.body)
		}
		if r := do(t, "GET", file("s", "2026/a.gz"), aliceToken, ""); r.status != 404 {
			t.Fatalf("GET after DELETE: %d %s, want 404", r.status, r.body)
		}
		if r := do(t, "GET", ts.URL+"/sync/time", aliceToken, ""); r.status != 200 || !strings.Contains(string(r.body), "server_time") {
			t.Fatalf("time: %d %s", r.status, r.body)
		}
		if r := do(t, "GET", ts.URL+"/sync/time", "", ""); r.status != http.StatusUnauthorized {
			t.Fatalf("time without a token: %d, want 401", r.status)
		}
	})
}

// TestMigrateOlderDatabase opens a database an earlier server made, whose
// stores have no kind: they keep records, and their records are pulled
// as before.
func TestMigrateOlderDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`CREATE TABLE sync_server_stores (id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, created_us BIGINT NOT NULL, last_us BIGINT NOT NULL, max_version BIGINT NOT NULL, UNIQUE (owner, name))`,
		`CREATE TABLE sync_server_records (store_id TEXT NOT NULL, table_name TEXT NOT NULL, record_id TEXT NOT NULL, data TEXT NOT NULL, clock TEXT NOT NULL, deleted INTEGER NOT NULL, updated_us BIGINT NOT NULL, deleted_us BIGINT, PRIMARY KEY (store_id, table_name, record_id))`,
		`INSERT INTO sync_server_stores VALUES ('st-1', 'alice', 'old', 1, 5, 1)`,
		`INSERT INTO sync_server_records VALUES ('st-1', 'notes', 'n1', '{"title":"kept"}', '{"title":[1,"server-st-1"]}', 0, 5, NULL)`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	ts := newServer(t, "sqlite:"+path)
	if r := ts.pull(t, aliceToken, "store=old"); r.status != 200 || !strings.Contains(string(r.body), `"title":"kept"`) {
		t.Fatalf("pull from a store an earlier server made: %d %s", r.status, r.body)
	}
	if r := do(t, "PUT", ts.URL+"/sync/file?store=old&name=a", aliceToken, "x"); r.status != 409 {
		t.Fatalf("PUT to an earlier server's store: %d %s, want 409 (it keeps records)", r.status, r.body)
	}
	// Opened again: the migration is done once.
	st, err := Open(context.Background(), "sqlite:"+path)
	if err != nil {
		t.Fatalf("open again: %v", err)
	}
	st.Close()
}

// TestFilesInChunks checks a file of several chunks: read back whole,
// listed at its size, and its chunks gone with it; a body cut short
// leaves nothing.
func TestFilesInChunks(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		ts := newServer(t, spec)
		content := make([]byte, 2*chunkBytes+12345)
		for i := range content {
			content[i] = byte(i*7 + i/chunkBytes)
		}
		u := ts.URL + "/sync/file?store=s&name=big"
		if r := do(t, "PUT", u, aliceToken, string(content)); r.status != 200 {
			t.Fatalf("PUT: %d %s", r.status, r.body)
		}
		r := do(t, "GET", u, aliceToken, "")
		if r.status != 200 || !bytes.Equal(r.body, content) {
			t.Fatalf("GET: %d, %d bytes, equal %v", r.status, len(r.body), bytes.Equal(r.body, content))
		}
		if r := do(t, "GET", ts.URL+"/sync/files?store=s", aliceToken, ""); !strings.Contains(string(r.body), fmt.Sprintf(`"size":%d`, len(content))) {
			t.Fatalf("list: %s", r.body)
		}
		chunks := func() (n int) {
			t.Helper()
			if err := ts.st.read.QueryRow(`SELECT count(*) FROM sync_server_chunks`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		if n := chunks(); n != 3 {
			t.Fatalf("%d chunks stored, want 3", n)
		}
		// A body that ends early, straight to the handler (the
		// document's checker reads bodies whole): nothing stored, no
		// chunk left.
		direct := httptest.NewServer(NewHandler(ts.st, Options{Tokens: map[string]string{aliceToken: "alice"}}))
		defer direct.Close()
		req, _ := http.NewRequest("PUT", direct.URL+"/sync/file?store=s&name=cut", io.MultiReader(bytes.NewReader(content[:chunkBytes+10]), iotest.ErrReader(errors.New("cut"))))
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		req.ContentLength = int64(len(content))
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
		if r := do(t, "GET", ts.URL+"/sync/file?store=s&name=cut", aliceToken, ""); r.status != 404 {
			t.Fatalf("a cut upload: GET %d, want 404", r.status)
		}
		// A body cut short ends in io.ErrUnexpectedEOF, which is not its
		// end: the upload fails, and leaves no chunk.
		if _, _, _, _, err := ts.st.upload(context.Background(), io.MultiReader(bytes.NewReader(content[:chunkBytes+10]), iotest.ErrReader(io.ErrUnexpectedEOF)), func() int64 { return 1 }); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("an upload cut short: got %v, want io.ErrUnexpectedEOF", err)
		}
		if r := do(t, "DELETE", u, aliceToken, ""); r.status != 200 {
			t.Fatalf("DELETE: %d %s", r.status, r.body)
		}
		for range 100 {
			if chunks() == 0 {
				return
			}
			time.Sleep(10 * time.Millisecond) // the cut upload's handler may still be cleaning up
		}
		t.Fatalf("%d chunks left after the delete and the cut upload", chunks())
	})
}
