package drivertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drivesync/drivesync"
)

// testSQLiteVersion: the engine stores JSONB, which SQLite has since
// 3.45.0; the driver's bundled SQLite must have it.
func testSQLiteVersion(t *testing.T, d Driver) {
	db := openDB(t, d.Name, d.DSN(filepath.Join(t.TempDir(), "v.db"), 0))
	var version string
	if err := db.QueryRow(`SELECT sqlite_version()`).Scan(&version); err != nil {
		t.Fatalf("%s: %v", d.Name, err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil || major < 3 || major == 3 && minor < 45 {
		t.Fatalf("%s bundles SQLite %s; drivesync needs 3.45.0 or later (JSONB)", d.Name, version)
	}
	var text, kind string
	err := db.QueryRow(`SELECT json(jsonb_set(jsonb('{"a":1}'), '$.b', json('[2]'))), typeof(jsonb('{}'))`).Scan(&text, &kind)
	if err != nil || text != `{"a":1,"b":[2]}` || kind != "blob" {
		t.Fatalf("%s (SQLite %s): JSONB round trip gave %q, %q, %v; want {\"a\":1,\"b\":[2]}, blob", d.Name, version, text, kind, err)
	}
	t.Logf("%s bundles SQLite %s", d.Name, version)
}

// testDSNPragmas: the driver's DSN sets what the README recommends, on
// every connection of the pool: WAL, the busy timeout, synchronous
// NORMAL, and app transactions that take the write lock at BEGIN.
func testDSNPragmas(t *testing.T, d Driver) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "dsn.db")
	db := openDB(t, d.Name, d.DSN(path, 10*time.Second))
	var conns []*sql.Conn
	for range 2 { // two connections: each must have the pragmas
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i, c := range conns {
		var mode string
		var timeout, synchronous int
		if err := c.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&timeout); err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&synchronous); err != nil {
			t.Fatal(err)
		}
		if mode != "wal" || timeout != 10000 || synchronous != 1 {
			t.Errorf("connection %d: journal_mode %s, busy_timeout %d, synchronous %d; want wal, 10000, 1 (NORMAL)", i, mode, timeout, synchronous)
		}
	}
	for _, c := range conns {
		c.Close()
	}

	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	other := openDB(t, d.Name, d.DSN(path, 0))
	if _, err := other.Exec(`CREATE TABLE IF NOT EXISTS x (y)`); err == nil {
		t.Fatal("another connection wrote while an app transaction was open: the DSN's BEGIN does not take the write lock")
	}
}

// testConverge: creates, edits and deletes in both directions, in a JSONB
// table and a JSON text table, leave both devices with the same rows.
func testConverge(t *testing.T, d Driver) {
	a, b := pair(t, d, schema)
	a.put("n1", `{"title":"from a","body":"x"}`)
	a.exec(`INSERT INTO tags (id, content) VALUES ('t1', '{"name":"red"}')`)
	b.put("n2", `{"title":"from b","n":9007199254740993}`)
	b.exec(`INSERT INTO tags (id, content) VALUES ('t2', '{"name":"blue"}')`)
	converged(t, a, b)
	if got := b.get("n1"); got != `{"body":"x","title":"from a"}` {
		t.Fatalf("modernc got n1 = %s", got)
	}
	if got := a.get("n2"); got != `{"n":9007199254740993,"title":"from b"}` {
		t.Fatalf("%s got n2 = %s", d.Name, got)
	}

	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.body', 'y') WHERE id = 'n2'`)
	a.exec(`DELETE FROM tags WHERE id = 't2'`)
	b.exec(`DELETE FROM notes WHERE id = 'n1'`)
	b.exec(`UPDATE tags SET content = '{"name":"green"}' WHERE id = 't1'`)
	dump := converged(t, a, b)
	want := "n2\tblob\t{\"body\":\"y\",\"n\":9007199254740993,\"title\":\"from b\"}\t'from b'\t\n--\nt1\ttext\t{\"name\":\"green\"}\t\n--\n"
	if dump != want {
		t.Fatalf("after edits and deletes both devices hold\n%s\nwant\n%s", dump, want)
	}
}

// testConcurrentFieldEdits: two devices edit different fields of one
// record between syncs; both edits survive on both.
func testConcurrentFieldEdits(t *testing.T, d Driver) {
	a, b := pair(t, d, schema)
	a.put("n1", `{"title":"t","body":"b"}`)
	converged(t, a, b)
	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.title', 'title by ` + d.Name + `') WHERE id = 'n1'`)
	b.exec(`UPDATE notes SET content = jsonb_set(content, '$.body', 'body by modernc') WHERE id = 'n1'`)
	converged(t, a, b)
	want := `{"body":"body by modernc","title":"title by ` + d.Name + `"}`
	if got := a.get("n1"); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// testConstraintRefusesRow: a received record that the app's own
// constraints refuse (UNIQUE and NOT NULL on projection columns) is
// reported, the sync succeeds, and later records still arrive.
func testConstraintRefusesRow(t *testing.T, d Driver) {
	tables := []string{`CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL, slug TEXT NOT NULL UNIQUE)`}
	a, b := pair(t, d, tables)
	b.exec(`INSERT INTO notes (id, content, slug) VALUES ('n1', jsonb('{"slug":"same"}'), 'same')`)
	// The app fills slug itself; content has no slug, so the row the
	// engine writes elsewhere has none and NOT NULL refuses it.
	b.exec(`INSERT INTO notes (id, content, slug) VALUES ('n3', jsonb('{"text":"no slug"}'), 'own')`)
	b.sync()
	a.exec(`INSERT INTO notes (id, content, slug) VALUES ('n2', jsonb('{"slug":"same"}'), 'same')`)
	r, err := a.eng.Sync(context.Background())
	if err != nil {
		t.Errorf("sync with a refused row failed: %v", err)
	}
	var refused []string
	for _, u := range r.Unwritten {
		refused = append(refused, u.Table+"/"+u.Record)
	}
	if strings.Join(refused, ",") != "notes/n1,notes/n3" || r.ChangesSent == 0 {
		t.Errorf("report: unwritten %v, sent %d; want notes/n1 and notes/n3 unwritten and a's upload done", refused, r.ChangesSent)
	}
	// The device keeps receiving.
	b.exec(`INSERT INTO notes (id, content, slug) VALUES ('n4', jsonb('{"slug":"other"}'), 'other')`)
	b.sync()
	for i := range 2 {
		if _, err := a.eng.Sync(context.Background()); err != nil {
			t.Errorf("sync %d after a refused row: %v", i+1, err)
		}
	}
	if got := a.get("n4"); got != `{"slug":"other"}` {
		t.Fatalf("after a refused row, n4 = %q: the device no longer receives", got)
	}
}

// testBusyDatabaseIsRetried: another connection holds the write lock
// when Sync starts and the DSN sets no busy timeout, so SQLite fails at
// once with SQLITE_BUSY; the engine must recognise the driver's error
// and wait.
func testBusyDatabaseIsRetried(t *testing.T, d Driver) {
	remote := drivesync.NewMemoryRemote()
	path := filepath.Join(t.TempDir(), "busy.db")
	db := openDB(t, d.Name, d.DSN(path, 0))
	if _, err := db.Exec(schema[0]); err != nil {
		t.Fatal(err)
	}
	eng, err := drivesync.Open(context.Background(), db, drivesync.Config{Remote: remote, Tables: []drivesync.Table{{Name: "notes"}}, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	if _, err := db.Exec(`INSERT INTO notes (id, content) VALUES ('n1', jsonb('{"v":1}'))`); err != nil {
		t.Fatal(err)
	}
	other := openDB(t, d.Name, d.DSN(path, 0))
	conn, err := other.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	release := time.AfterFunc(300*time.Millisecond, func() { conn.ExecContext(context.Background(), "COMMIT") })
	defer release.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	r, err := eng.Sync(ctx)
	if err != nil || r.ChangesSent != 1 {
		t.Fatalf("sync while another connection held the write lock: sent %d, %v", r.ChangesSent, err)
	}
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Fatalf("sync finished after %v, before the lock was released", waited)
	}

	// A lock held past the context's deadline fails the sync, saying so.
	if _, err := db.Exec(`UPDATE notes SET content = jsonb('{"v":2}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), "ROLLBACK")
	// Long enough that a loaded machine reaches the lock wait before the
	// deadline; the lock is held until the test ends.
	short, cancelShort := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancelShort()
	_, err = eng.Sync(short)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("got %v, want a deadline error saying the database stayed locked", err)
	}
}

// testWriteDuringSync: the app writes a record while a sync is between
// planning and its final transaction; the write is kept locally and sent
// by the next sync.
func testWriteDuringSync(t *testing.T, d Driver) {
	var a *device
	wrote := false
	a, b := pair(t, d, schema, func(cfg *drivesync.Config) {
		cfg.Progress = func(p drivesync.Progress) {
			if p.Step == "upload" && p.Done == 0 && !wrote {
				wrote = true
				a.exec(`UPDATE notes SET content = jsonb_set(content, '$.late', 'kept') WHERE id = 'n1'`)
			}
		}
	})
	a.put("n1", `{"title":"t"}`)
	b.put("n2", `{"title":"u"}`)
	b.sync()
	a.sync()
	if !wrote {
		t.Fatal("the app's write did not run during the sync")
	}
	if got := a.get("n1"); got != `{"late":"kept","title":"t"}` {
		t.Fatalf("after the sync the app's row is %s, want its write kept", got)
	}
	if got := a.get("n2"); got != `{"title":"u"}` {
		t.Fatalf("n2 = %q, want it received in the same sync", got)
	}
	converged(t, a, b)
	if got := b.get("n1"); got != `{"late":"kept","title":"t"}` {
		t.Fatalf("modernc has n1 = %s, want the write made during the sync", got)
	}
}

// testSnapshotBootstrap: a snapshot written on one driver bootstraps a
// new device on the other, both ways.
func testSnapshotBootstrap(t *testing.T, d Driver) {
	remote := d.remote(t)
	a := newDevice(t, "dev-"+d.Name, &d, remote, schema)
	b := newDevice(t, "dev-modernc", nil, remote, schema)
	a.put("n1", `{"title":"one","nested":{"x":[1,2]}}`)
	a.exec(`INSERT INTO tags (id, content) VALUES ('t1', '{"name":"red"}')`)
	b.put("n2", `{"title":"two"}`)
	b.put("gone", `{"title":"deleted later"}`)
	converged(t, a, b)
	b.exec(`DELETE FROM notes WHERE id = 'gone'`)
	converged(t, a, b)

	if d.Server != nil {
		// A server has no snapshots: a new device starts from the
		// server's state of every record.
		fromDriver := newDevice(t, "new-modernc", nil, remote, schema)
		if r := fromDriver.sync(); r.ChangesReceived != 4 {
			t.Fatalf("new modernc device received %d records, want 4 (one deleted)", r.ChangesReceived)
		}
		if got, want := fromDriver.dump(), a.dump(); got != want {
			t.Fatalf("modernc device bootstrapped from the server holds\n%s\nwant\n%s", got, want)
		}
		return
	}
	r, err := a.eng.Snapshot(context.Background())
	if err != nil || r.Snapshot == "" {
		t.Fatalf("%s: Snapshot wrote %q, %v", d.Name, r.Snapshot, err)
	}
	fromDriver := newDevice(t, "new-modernc", nil, remote, schema)
	if r := fromDriver.sync(); !loadedSnapshot(r, r.Snapshot) {
		t.Fatalf("new modernc device downloaded %v, want %s's snapshot", r.Downloaded, d.Name)
	}
	if got, want := fromDriver.dump(), a.dump(); got != want {
		t.Fatalf("modernc device bootstrapped from %s's snapshot holds\n%s\nwant\n%s", d.Name, got, want)
	}

	b.put("n3", `{"title":"after the first snapshot"}`)
	b.sync()
	if r, err := b.eng.Snapshot(context.Background()); err != nil || r.Snapshot == "" {
		t.Fatalf("modernc: Snapshot wrote %q, %v", r.Snapshot, err)
	}
	fromModernc := newDevice(t, "new-"+d.Name, &d, remote, schema)
	if r := fromModernc.sync(); !loadedSnapshot(r, "") {
		t.Fatalf("new %s device downloaded %v, want modernc's snapshot", d.Name, r.Downloaded)
	}
	if got, want := fromModernc.dump(), b.dump(); got != want {
		t.Fatalf("%s device bootstrapped from modernc's snapshot holds\n%s\nwant\n%s", d.Name, got, want)
	}
	converged(t, fromModernc, fromDriver)
}

// loadedSnapshot reports whether r applied a snapshot other than the one
// it wrote itself (own).
func loadedSnapshot(r drivesync.Report, own string) bool {
	for _, name := range r.Downloaded {
		if strings.Contains(name, "/snapshot_") && name != own {
			return true
		}
	}
	return false
}

// testUploadNotCommitted: a sync that fails after its upload (here its
// context ends) leaves the file in the outbox, a BLOB column the engine
// reads back through the driver; the next sync recovers it, and the
// other device applies it once.
func testUploadNotCommitted(t *testing.T, d Driver) {
	var cancel context.CancelFunc
	a, b := pair(t, d, schema, func(cfg *drivesync.Config) {
		cfg.Progress = func(p drivesync.Progress) {
			if p.Step == "upload" && p.Done == 1 && cancel != nil {
				cancel()
			}
		}
	})
	// Big enough for several outbox chunks of incompressible text.
	for i := range 40 {
		a.put(fmt.Sprintf("n%02d", i), fmt.Sprintf(`{"title":"note %d","body":"%x"}`, i, strings.Repeat(fmt.Sprint(i*7919), 2000)))
	}
	var ctx context.Context
	ctx, cancel = context.WithCancel(context.Background())
	r, err := a.eng.Sync(ctx)
	cancel = nil
	if err == nil || r.ChangesSent == 0 {
		t.Fatalf("sync cancelled after its upload: sent %d, err %v; want an upload and an error", r.ChangesSent, err)
	}
	uploaded := r.Uploaded // "" through a server: a push is no file
	r = a.sync()
	if r.Recovered == "" || (uploaded != "" && r.Recovered != uploaded) || r.ChangesSent != 0 {
		t.Fatalf("next sync: recovered %q, sent %d; want %q recovered and nothing sent again", r.Recovered, r.ChangesSent, uploaded)
	}
	r = b.sync()
	if r.ChangesReceived != 40 {
		t.Fatalf("modernc received %d changes, want the 40 of the recovered file once", r.ChangesReceived)
	}
	converged(t, a, b)
}

// testAppWritesWhileSyncing: the app's own transactions on its pool run
// while syncs do; none fails with SQLITE_BUSY (the DSN's busy timeout and
// BEGIN IMMEDIATE) and none is lost.
func testAppWritesWhileSyncing(t *testing.T, d Driver) {
	a, b := pair(t, d, schema)
	const writes = 60
	done := make(chan error, 1)
	go func() {
		for i := range writes {
			tx, err := a.db.Begin()
			if err != nil {
				done <- err
				return
			}
			_, err = tx.Exec(`INSERT INTO notes (id, content) VALUES (?, jsonb(?))`, fmt.Sprintf("w%03d", i), fmt.Sprintf(`{"i":%d}`, i))
			if err == nil {
				err = tx.Commit()
			} else {
				tx.Rollback()
			}
			if err != nil {
				done <- fmt.Errorf("app write %d: %w", i, err)
				return
			}
			time.Sleep(time.Millisecond)
		}
		done <- nil
	}()
	for syncing := true; syncing; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			syncing = false
		default:
			a.sync()
		}
	}
	converged(t, a, b)
	var n int
	if err := b.db.QueryRow(`SELECT count(*) FROM notes WHERE id LIKE 'w%'`).Scan(&n); err != nil || n != writes {
		t.Fatalf("modernc holds %d of the app's %d writes (%v)", n, writes, err)
	}
}

// testCancelledSyncs: syncs whose context ends at random moments, at a
// step boundary or inside the final transaction, lose nothing: the
// driver's interrupted statements leave no transaction open on the
// app's pool, and plain syncs afterwards converge with every edit.
func testCancelledSyncs(t *testing.T, d Driver) {
	var cancelAt struct {
		step   string
		done   int
		cancel context.CancelFunc
	}
	a, b := pair(t, d, schema, func(cfg *drivesync.Config) {
		cfg.Progress = func(p drivesync.Progress) {
			if c := cancelAt.cancel; c != nil && p.Step == cancelAt.step && p.Done == cancelAt.done {
				c()
			}
		}
	})
	points := []struct {
		step string
		done int
	}{{"list", 1}, {"download", 0}, {"upload", 0}, {"upload", 1}, {"apply", 0}, {"apply", 1}}
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[string]string{}
	typical := 10 * time.Millisecond // the length of the last sync not cancelled
	var cancelled, completed int
	for i := range 60 {
		id := fmt.Sprintf("a%d", i%10)
		want[id] = fmt.Sprintf(`{"i":%d}`, i)
		a.put(id, want[id])
		b.put(fmt.Sprintf("b%d", i%5), fmt.Sprintf(`{"i":%d}`, i))
		b.sync()
		ctx, cancel := context.WithCancel(context.Background())
		switch i % 3 {
		case 0: // now and then a sync that runs to its end
		case 1:
			p := points[rng.IntN(len(points))]
			cancelAt.step, cancelAt.done, cancelAt.cancel = p.step, p.done, cancel
		case 2:
			time.AfterFunc(time.Duration(rng.Int64N(int64(typical))), cancel)
		}
		began := time.Now()
		_, err := a.eng.Sync(ctx)
		switch {
		case err == nil:
			completed++
			typical = max(time.Since(began), time.Millisecond)
		case ctx.Err() == nil:
			t.Fatalf("sync %d failed without being cancelled: %v", i, err)
		default:
			cancelled++
		}
		cancelAt.cancel = nil
		cancel()
		if n := openTransactions(t, a.db); n > 0 {
			t.Fatalf("after sync %d (%v), %d idle connections of the app's pool are inside a transaction", i, err, n)
		}
	}
	t.Logf("%d syncs cancelled, %d completed", cancelled, completed)
	if cancelled == 0 {
		t.Fatal("no sync was cancelled")
	}
	converged(t, a, b)
	for id, content := range want {
		if got := b.get(id); got != content {
			t.Errorf("modernc has %s = %q, want %s", id, got, content)
		}
	}
}

// openTransactions counts the idle connections of db's pool that are
// inside a transaction nothing is running: an app write on one of them
// would never commit.
func openTransactions(t *testing.T, db *sql.DB) int {
	t.Helper()
	ctx := context.Background()
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	found := 0
	for range db.Stats().Idle {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.ExecContext(ctx, "BEGIN"); err != nil {
			found++
		} else if _, err := c.ExecContext(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	}
	return found
}

// testOrdinaryTable: an ordinary table's values cross between the driver
// under test and modernc exactly, whatever the driver makes of declared
// types (mattn reads a DATETIME or TIMESTAMP column as time.Time and a
// BOOLEAN as bool when it can).
func testOrdinaryTable(t *testing.T, d Driver) {
	tables := []string{`CREATE TABLE events (
		uuid TEXT NOT NULL, gen INTEGER NOT NULL,
		at DATETIME, stamp TIMESTAMP, done BOOLEAN, score REAL, pixels BLOB, note,
		PRIMARY KEY (uuid, gen))`}
	a, b := pair(t, d, tables)
	a.exec(`INSERT INTO events VALUES
		('e1', 0, '2026-11-24 10:00:00', 1700000000, 1, 0.1, X'00FF', NULL),
		('e1', 1, 1700000000, '2026-11-24T10:00:00Z', 'yes', 1e300, X'', 'text')`)
	b.exec(`INSERT INTO events VALUES ('e2', 0, NULL, NULL, 0, -2.5, zeroblob(4), 7)`)
	settle := func() {
		for range 3 {
			a.sync()
			b.sync()
		}
	}
	settle()
	dump := `SELECT typeof(uuid)||quote(uuid), typeof(gen)||quote(gen), typeof(at)||quote(at), typeof(stamp)||quote(stamp),
		typeof(done)||quote(done), typeof(score)||quote(score), typeof(pixels)||quote(pixels), typeof(note)||quote(note)
		FROM events ORDER BY uuid, gen`
	read := func(dev *device) string {
		rows, err := dev.db.Query(dump)
		if err != nil {
			t.Fatalf("%s: %v", dev.name, err)
		}
		defer rows.Close()
		var out strings.Builder
		for rows.Next() {
			vals := make([]string, 8)
			ptrs := make([]any, len(vals))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatalf("%s: %v", dev.name, err)
			}
			out.WriteString(strings.Join(vals, " ") + "\n")
		}
		return out.String()
	}
	want := "text'e1' integer0 text'2026-11-24 10:00:00' integer1700000000 integer1 real0.1 blobX'00FF' nullNULL\n" +
		"text'e1' integer1 integer1700000000 text'2026-11-24T10:00:00Z' text'yes' real1.0e+300 blobX'' text'text'\n" +
		"text'e2' integer0 nullNULL nullNULL integer0 real-2.5 blobX'00000000' integer7\n"
	for _, dev := range []*device{a, b} {
		if got := read(dev); got != want {
			t.Errorf("%s holds\n%s\nwant\n%s", dev.name, got, want)
		}
	}
	// Each edits a column of the other's row: both edits arrive as written.
	a.exec(`UPDATE events SET done = 1, note = X'01' WHERE uuid = 'e2'`)
	b.exec(`UPDATE events SET at = '2027-01-01', score = NULL WHERE uuid = 'e1' AND gen = 0`)
	settle()
	if ga, gb := read(a), read(b); ga != gb || !strings.Contains(ga, "blobX'01'") || !strings.Contains(ga, "text'2027-01-01'") {
		t.Errorf("after edits:\n%s\n%s", ga, gb)
	}
}
