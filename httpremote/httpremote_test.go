package httpremote_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/httpremote"
	"github.com/drivesync/drivesync/internal/drivertest"
	"github.com/drivesync/drivesync/internal/openapicheck"
	"github.com/drivesync/drivesync/internal/pgtest"
	"github.com/drivesync/drivesync/syncserver"
	_ "modernc.org/sqlite"
)

const (
	aliceToken = "alice-token-0123456789"
	bobToken   = "bob-token-0123456789ab"
)

// startServer serves a fresh store of kind on loopback.
func startServer(t testing.TB, kind string) (string, *syncserver.Store) {
	return serve(t, pgtest.Spec(t, kind))
}

func serve(t testing.TB, spec string, edit ...func(*syncserver.Options)) (string, *syncserver.Store) {
	st, err := syncserver.Open(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	opts := syncserver.Options{Tokens: map[string]string{aliceToken: "alice", bobToken: "bob"}}
	for _, e := range edit {
		e(&opts)
	}
	h := syncserver.NewHandler(st, opts)
	ts := httptest.NewServer(openapicheck.For(t, "../syncserver/openapi.json").Handler(t, h))
	t.Cleanup(ts.Close)
	return ts.URL, st
}

func eachKind(t *testing.T, fn func(t *testing.T, kind string)) {
	for _, kind := range pgtest.Kinds {
		t.Run(kind, func(t *testing.T) { fn(t, kind) })
	}
}

const schema = `CREATE TABLE notes (id TEXT PRIMARY KEY, content TEXT);
CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, n REAL, data BLOB);`

type device struct {
	t   testing.TB
	db  *sql.DB
	eng *drivesync.Engine
}

func openDevice(t testing.TB, name string, srv drivesync.Server, edit ...func(*drivesync.Config)) *device {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), name+".db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(schema); err != nil {
		t.Fatal(err)
	}
	cfg := drivesync.Config{Server: srv, DeviceID: name,
		Tables: []drivesync.Table{{Name: "notes"}, {Name: "items", UniqueIntegerKey: true}}}
	for _, e := range edit {
		e(&cfg)
	}
	eng, err := drivesync.Open(context.Background(), db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &device{t: t, db: db, eng: eng}
}

func (d *device) exec(q string, args ...any) {
	d.t.Helper()
	if _, err := d.db.Exec(q, args...); err != nil {
		d.t.Fatal(err)
	}
}

func (d *device) sync() drivesync.Report {
	d.t.Helper()
	r, err := d.eng.Sync(context.Background())
	if err != nil {
		d.t.Fatalf("sync: %v", err)
	}
	return r
}

// dump is the device's app tables, sorted.
func (d *device) dump() string {
	d.t.Helper()
	var b strings.Builder
	for _, q := range []string{`SELECT id, content FROM notes ORDER BY id`, `SELECT id, quote(name), quote(n), quote(data) FROM items ORDER BY id`} {
		rows, err := d.db.Query(q)
		if err != nil {
			d.t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			rows.Scan(ptrs...)
			fmt.Fprintln(&b, vals...)
		}
		rows.Close()
	}
	return b.String()
}

func converged(t *testing.T, devs ...*device) {
	t.Helper()
	want := devs[0].dump()
	for _, d := range devs[1:] {
		if got := d.dump(); got != want {
			t.Fatalf("devices differ:\n%s\n---\n%s", want, got)
		}
	}
}

// Two devices sync through the server: creates, concurrent edits of
// different fields and of the same field, deletes, an ordinary table.
func TestTwoDevices(t *testing.T) {
	eachKind(t, func(t *testing.T, kind string) {
		url, _ := startServer(t, kind)
		a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{Store: "notes"}))
		b := openDevice(t, "dev-b", httpremote.New(url, aliceToken, httpremote.Options{Store: "notes"}))
		a.exec(`INSERT INTO notes VALUES ('n1', '{"title":"one","body":"x"}'), ('n2', '{"title":"two"}')`)
		a.exec(`INSERT INTO items VALUES (1, 'blob', 1.5, x'00ff')`)
		if r := a.sync(); r.ChangesSent != 3 {
			t.Errorf("a sent %d changes, want 3", r.ChangesSent)
		}
		if r := b.sync(); r.ChangesReceived != 3 {
			t.Errorf("b received %d changes, want 3", r.ChangesReceived)
		}
		converged(t, a, b)

		a.exec(`UPDATE notes SET content = json_set(content, '$.title', 'A') WHERE id = 'n1'`)
		b.exec(`UPDATE notes SET content = json_set(content, '$.body', 'B') WHERE id = 'n1'`)
		b.exec(`DELETE FROM notes WHERE id = 'n2'`)
		b.exec(`UPDATE items SET n = 2.5 WHERE id = 1`)
		a.sync()
		b.sync()
		a.sync()
		converged(t, a, b)
		var content string
		a.db.QueryRow(`SELECT content FROM notes WHERE id = 'n1'`).Scan(&content)
		if content != `{"body":"B","title":"A"}` {
			t.Errorf("n1 = %s, want both edits", content)
		}
		var n int
		a.db.QueryRow(`SELECT count(*) FROM notes WHERE id = 'n2'`).Scan(&n)
		if n != 0 {
			t.Errorf("n2 not deleted on a")
		}
		// Nothing new: a sync sends and receives nothing.
		if r := a.sync(); r.ChangesSent != 0 || r.ChangesReceived != 0 {
			t.Errorf("idle sync: %+v", r)
		}
	})
}

// A new device gets every record from the server's state, page by page.
func TestBootstrapPages(t *testing.T) {
	eachKind(t, func(t *testing.T, kind string) {
		url, _ := startServer(t, kind)
		a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{}))
		tx, _ := a.db.Begin()
		for i := range 1234 {
			tx.Exec(`INSERT INTO notes VALUES (?, ?)`, fmt.Sprintf("n%04d", i), fmt.Sprintf(`{"i":%d}`, i))
		}
		tx.Commit()
		a.sync()
		a.exec(`DELETE FROM notes WHERE id = 'n0007'`)
		a.sync()
		b := openDevice(t, "dev-b", httpremote.New(url, aliceToken, httpremote.Options{PageSize: 100}))
		if r := b.sync(); r.ChangesReceived != 1234 {
			t.Errorf("b received %d records, want 1234 (one a tombstone)", r.ChangesReceived)
		}
		converged(t, a, b)
	})
}

// A push whose response is lost (the server applied it) is sent again
// with its key; one whose request never arrived is sent again too. Either
// way every write arrives once and nothing is lost.
func TestLostResponses(t *testing.T) {
	url, _ := startServer(t, "sqlite")
	lose := &loseResponse{match: func(r *http.Request) bool { return r.Method == "POST" }}
	lose.times.Store(2)
	a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{HTTPClient: &http.Client{Transport: lose}, MinSleep: 1}))
	b := openDevice(t, "dev-b", httpremote.New(url, aliceToken, httpremote.Options{}))
	a.exec(`INSERT INTO notes VALUES ('n1', '{"t":1}')`)
	a.sync()
	if lose.times.Load() > 0 {
		t.Fatal("no response was lost")
	}
	b.sync()
	converged(t, a, b)
}

type loseResponse struct {
	match func(*http.Request) bool
	times atomic.Int32
}

func (l *loseResponse) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || !l.match(req) || l.times.Add(-1) < 0 {
		return res, err
	}
	res.Body.Close()
	return nil, errors.New("connection reset (test)")
}

// A push answers a cursor past its own writes when they follow on from
// the batch's cursor, and a pull from it brings none of them; after
// another client's write in between, without a cursor, or from a server
// that does not say, it answers none. The push sent again with its key
// answers as the first time.
func TestPushCursor(t *testing.T) {
	eachKind(t, func(t *testing.T, kind string) {
		ctx := context.Background()
		url, _ := startServer(t, kind)
		c := httpremote.New(url, aliceToken, httpremote.Options{Store: "notes"})
		write := func(record string, version int64) []drivesync.ServerWrite {
			return []drivesync.ServerWrite{{Table: "notes", Record: record, Version: version, Device: "dev-a", Patch: []byte(`{"content":"x"}`)}}
		}
		page, err := c.Pull(ctx, "", "")
		if err != nil {
			t.Fatal(err)
		}
		first := &drivesync.PushBatch{Key: "batch-1", Writes: write("n1", 1), Cursor: page.Cursor}
		res, err := c.Push(ctx, first)
		if err != nil {
			t.Fatal(err)
		}
		if res.Cursor == "" {
			t.Fatalf("a push that follows on from the cursor %q answered no cursor", page.Cursor)
		}
		if p, err := c.Pull(ctx, res.StoreID, res.Cursor); err != nil || len(p.Records) != 0 {
			t.Errorf("a pull from the push's cursor: %+v, %v; want no record", p, err)
		}
		if again, err := c.Push(ctx, first); err != nil || again.Cursor != res.Cursor {
			t.Errorf("the push sent again answered %+v, %v; want the cursor %q", again, err, res.Cursor)
		}

		other := httpremote.New(url, aliceToken, httpremote.Options{Store: "notes"})
		if _, err := other.Push(ctx, &drivesync.PushBatch{StoreID: res.StoreID, Writes: []drivesync.ServerWrite{{Table: "notes", Record: "n2", Version: 2, Device: "dev-b", Patch: []byte(`{"content":"y"}`)}}}); err != nil {
			t.Fatal(err)
		}
		behind, err := c.Push(ctx, &drivesync.PushBatch{StoreID: res.StoreID, Writes: write("n3", 3), Cursor: res.Cursor})
		if err != nil || behind.Cursor != "" {
			t.Errorf("a push after another client's write answered %+v, %v; want no cursor", behind, err)
		}
		if p, err := c.Pull(ctx, res.StoreID, res.Cursor); err != nil || len(p.Records) != 2 {
			t.Errorf("a pull from the kept cursor: %+v, %v; want n2 and n3", p, err)
		}
		if none, err := c.Push(ctx, &drivesync.PushBatch{StoreID: res.StoreID, Writes: write("n4", 4)}); err != nil || none.Cursor != "" {
			t.Errorf("a push without a cursor answered %+v, %v; want no cursor", none, err)
		}
	})
	t.Run("older server", func(t *testing.T) {
		old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"ok":true,"idMap":{},"server_time":"2026-01-02T03:04:05.000006Z","applied":1,"store":"s1"}`)
		}))
		defer old.Close()
		c := httpremote.New(old.URL, aliceToken, httpremote.Options{})
		res, err := c.Push(context.Background(), &drivesync.PushBatch{Writes: []drivesync.ServerWrite{{Table: "notes", Record: "n1", Version: 1, Device: "dev-a", Patch: []byte(`{}`)}}, Cursor: "2026-01-01T00:00:00Z"})
		if err != nil || res.StoreID != "s1" || res.Cursor != "" {
			t.Errorf("push to a server that names no cursor: %+v, %v; want store s1 and no cursor", res, err)
		}
	})
}

// A server whose store was deleted and created again is another store: the
// device stops with ErrRemoteChanged and nothing local is lost; JoinRemote
// merges it into the new store.
func TestStoreReplaced(t *testing.T) {
	dir := t.TempDir()
	spec := "sqlite:" + filepath.Join(dir, "server.db")
	url, st := serve(t, spec)
	a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{}))
	a.exec(`INSERT INTO notes VALUES ('n1', '{"t":1}')`)
	a.sync()
	st.Close()

	// The server starts again on an empty database.
	url2, _ := serve(t, "sqlite:"+filepath.Join(dir, "server2.db"))
	a2 := openDevice(t, "dev-c", httpremote.New(url2, aliceToken, httpremote.Options{}))
	a2.exec(`INSERT INTO notes VALUES ('c1', '{"c":1}')`)
	a2.sync()
	a.eng.Close()
	a = reopen(t, a, httpremote.New(url2, aliceToken, httpremote.Options{}))
	_, err := a.eng.Sync(context.Background())
	if !errors.Is(err, drivesync.ErrRemoteChanged) {
		t.Fatalf("sync with a replaced store: %v, want ErrRemoteChanged", err)
	}
	if err := a.eng.JoinRemote(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.sync()
	a2.sync()
	converged(t, a, a2)
	if got := a2.dump(); !strings.Contains(got, "n1") || !strings.Contains(got, "c1") {
		t.Errorf("after the join: %s", got)
	}
}

func reopen(t testing.TB, d *device, srv drivesync.Server) *device {
	eng, err := drivesync.Open(context.Background(), d.db, drivesync.Config{Server: srv, DeviceID: "dev-a",
		Tables: []drivesync.Table{{Name: "notes"}, {Name: "items", UniqueIntegerKey: true}}})
	if err != nil {
		t.Fatal(err)
	}
	return &device{t: t, db: d.db, eng: eng}
}

// A wrong token is ErrAuth, saying the server refused the token (not to
// sign in again, Google Drive's advice); another user's store of the same
// name is another store.
func TestUsers(t *testing.T) {
	url, _ := startServer(t, "sqlite")
	bad := openDevice(t, "dev-x", httpremote.New(url, "not-a-token-000000000", httpremote.Options{}))
	bad.exec(`INSERT INTO notes VALUES ('x', '{}')`)
	if _, err := bad.eng.Sync(context.Background()); !errors.Is(err, drivesync.ErrAuth) || !strings.Contains(err.Error(), "the sync server refused the token") || strings.Contains(err.Error(), "sign in") {
		t.Errorf("wrong token: %v, want ErrAuth saying the sync server refused the token", err)
	}
	a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{}))
	b := openDevice(t, "dev-b", httpremote.New(url, bobToken, httpremote.Options{}))
	a.exec(`INSERT INTO notes VALUES ('secret', '{"of":"alice"}')`)
	a.sync()
	b.sync()
	if got := b.dump(); got != "" {
		t.Errorf("bob got %s", got)
	}
}

// The drivers' scenarios, each on a store of its own on one server.
func TestScenarios(t *testing.T) {
	eachKind(t, func(t *testing.T, kind string) {
		url, _ := startServer(t, kind)
		drivertest.Run(t, drivertest.Driver{
			Name: "sqlite",
			DSN: func(path string, busyTimeout time.Duration) string {
				return fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate", path, busyTimeout.Milliseconds())
			},
			Server: func(t *testing.T) drivesync.Server {
				name := strings.Map(func(r rune) rune {
					if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-' {
						return r
					}
					return '_'
				}, t.Name())
				return httpremote.New(url, aliceToken, httpremote.Options{Store: name})
			},
		})
	})
}

// A batch pushed without committing, whose store is then deleted on the
// server and created again: the device stops with ErrRemoteChanged, and
// after StartFresh the batch reaches the new store. (With idempotency keys
// scoped to the user, the push again with the batch's key met the old
// store's stored response, naming the old store: the device bound to it
// again and could never sync, and the batch never reached the new store.)
func TestStoreRecreatedWithBatchInOutbox(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.db")
	url, _ := serve(t, "sqlite:"+path)
	var cancel context.CancelFunc
	a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{}), func(c *drivesync.Config) {
		c.Progress = func(p drivesync.Progress) {
			if p.Step == "upload" && p.Done == 1 && cancel != nil {
				cancel()
			}
		}
	})
	a.exec(`INSERT INTO notes VALUES ('n1', '{"t":1}')`)
	var ctx context.Context
	ctx, cancel = context.WithCancel(context.Background())
	if r, err := a.eng.Sync(ctx); err == nil || r.ChangesSent == 0 {
		t.Fatalf("sync cancelled after its push: %+v, %v", r, err)
	}
	cancel = nil

	// The store is deleted on the server, and its name holds a new store.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`DELETE FROM sync_server_records; DELETE FROM sync_server_stores`); err != nil {
		t.Fatal(err)
	}
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, drivesync.ErrRemoteChanged) {
		t.Fatalf("sync after the store was deleted: %v, want ErrRemoteChanged", err)
	}
	if _, err := a.eng.StartFresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	b := openDevice(t, "dev-b", httpremote.New(url, aliceToken, httpremote.Options{}))
	b.sync()
	a.sync()
	converged(t, a, b)
	if got := b.dump(); !strings.Contains(got, "n1") {
		t.Errorf("b after a started fresh: %q, want n1", got)
	}
}

// PostgreSQL goes away while devices sync (every connection cut, new ones
// refused, as during a restart): their syncs fail with ErrRemote and lose
// nothing, and once it is back the next sync completes.
func TestPostgresRestart(t *testing.T) {
	dbURL, dbName := pgtest.Database(t)
	admin, err := sql.Open("pgx", pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	url, _ := serve(t, dbURL)
	quick := httpremote.Options{MinSleep: time.Millisecond, MaxSleep: 5 * time.Millisecond, MaxAttempts: 3}
	a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, quick))
	b := openDevice(t, "dev-b", httpremote.New(url, aliceToken, quick))
	a.exec(`INSERT INTO notes VALUES ('n1', '{"t":1}')`)
	a.sync()
	b.sync()

	down := func() {
		t.Helper()
		if _, err := admin.Exec(`ALTER DATABASE ` + dbName + ` WITH ALLOW_CONNECTIONS false`); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, dbName); err != nil {
			t.Fatal(err)
		}
		// The backends end a moment after they are told to.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var n int
			if err := admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, dbName).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d connections to %s still open", n, dbName)
			}
		}
	}
	down()
	a.exec(`INSERT INTO notes VALUES ('n2', '{"t":2}')`)
	b.exec(`UPDATE notes SET content = '{"t":"b"}' WHERE id = 'n1'`)
	for _, d := range []*device{a, b} {
		if _, err := d.eng.Sync(context.Background()); !errors.Is(err, drivesync.ErrRemote) {
			t.Fatalf("sync while PostgreSQL is down: %v, want ErrRemote", err)
		}
	}
	if _, err := admin.Exec(`ALTER DATABASE ` + dbName + ` WITH ALLOW_CONNECTIONS true`); err != nil {
		t.Fatal(err)
	}
	a.sync()
	b.sync()
	a.sync()
	converged(t, a, b)
	if got := a.dump(); !strings.Contains(got, "n2") || !strings.Contains(got, `"t":"b"`) {
		t.Errorf("after PostgreSQL came back: %s", got)
	}
}
