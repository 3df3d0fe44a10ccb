package httpremote_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/httpremote"
	"github.com/drivesync/drivesync/internal/pgtest"
	"github.com/drivesync/drivesync/syncserver"
)

// rawPush sends a plain client's push and fails the test unless it is
// applied.
func rawPush(t *testing.T, url, token, store, body string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/sync/push?store="+store, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("push: %d %s", res.StatusCode, b)
	}
}

func noteContent(t *testing.T, d *device, id string) string {
	t.Helper()
	var c sql.NullString
	err := d.db.QueryRow(`SELECT content FROM notes WHERE id = ?`, id).Scan(&c)
	if errors.Is(err, sql.ErrNoRows) {
		return "<no row>"
	}
	if err != nil {
		t.Fatal(err)
	}
	return c.String
}

// small is a server's limits small enough that the tests below stay small:
// a write of at most 4 KiB, a push of at most 64 KiB.
func small(o *syncserver.Options) { o.MaxRecordBytes, o.MaxBodyBytes = 4<<10, 64<<10 }

// A record the engine itself makes larger than the write limit (here
// 4 KiB; 4 MiB by default) by two fields of 3 KiB — which the engine supports: it sends the change
// as two writes under one stamp — is merged by the server into one 6 MiB
// record. Every other device rejects that record on pull (its state is
// over MaxRecordSize), the cursor moves past it, and the record never
// arrives: the devices diverge for good.
func TestReviewMergedRecordOverLimitNeverArrives(t *testing.T) {
	url, _ := serve(t, pgtest.Spec(t, "sqlite"), small)
	a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{}))
	b := openDevice(t, "dev-b", httpremote.New(url, aliceToken, httpremote.Options{}))
	big := strings.Repeat("x", 3<<10)
	a.exec(`INSERT INTO notes VALUES ('n1', ?)`, fmt.Sprintf(`{"a":%q,"b":%q}`, big, big))
	if r := a.sync(); r.ChangesSent == 0 {
		t.Fatalf("a sent nothing: %+v", r)
	}
	for i := range 3 {
		r := b.sync()
		t.Logf("b sync %d: received %d, rejected %v", i, r.ChangesReceived, r.Rejected)
	}
	if got := noteContent(t, b, "n1"); got == "<no row>" {
		t.Fatalf("b never receives n1 (pushed by a, held by the server): the devices diverge")
	}
}

// A device whose synced state holds a record over the write limit (as above) and
// whose server store is made again can never sync: StartFresh's pushJoin
// sends the record's state, the server refuses it (400), metaJoin stays
// set, and every later Sync sends it again.
func TestReviewStartFreshStuckOnLargeRecord(t *testing.T) {
	dir := t.TempDir()
	url, st := serve(t, "sqlite:"+filepath.Join(dir, "server.db"), small)
	a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{}))
	big := strings.Repeat("x", 3<<10)
	a.exec(`INSERT INTO notes VALUES ('n1', ?)`, fmt.Sprintf(`{"a":%q,"b":%q}`, big, big))
	a.sync()
	st.Close()
	startFreshElsewhere(t, a, filepath.Join(dir, "server2.db"))
}

// The same with records each under every limit: pushJoin sent up to
// 1000 record states in one push, whatever their size, so a database of
// 1000 notes of 70 bytes (70 KB) got 413 from the server's 64 KiB body
// limit (64 MiB by default, against 70 MB of notes) on every sync, for
// ever.
func TestReviewJoinBatchOverBodyLimitStuck(t *testing.T) {
	dir := t.TempDir()
	url, st := serve(t, "sqlite:"+filepath.Join(dir, "server.db"), small)
	a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{}))
	body := strings.Repeat("y", 70)
	tx, _ := a.db.Begin()
	for i := range 1000 {
		tx.Exec(`INSERT INTO notes VALUES (?, ?)`, fmt.Sprintf("n%04d", i), fmt.Sprintf(`{"body":%q}`, body))
	}
	tx.Commit()
	a.sync()
	st.Close()
	startFreshElsewhere(t, a, filepath.Join(dir, "server2.db"))
}

// Plain writes are stamped {maxVersion+1, "server"} by each store on its
// own, so two stores name different writes with one stamp. A device that
// joins a new store brings the old store's {1, server} write of n1; the
// new store holds its own {1, server} write of n1. Neither side takes
// the other's (equal stamps), and the devices diverge for good.
func TestReviewServerStampCollidesAcrossStores(t *testing.T) {
	dir := t.TempDir()
	url, st := serve(t, "sqlite:"+filepath.Join(dir, "server.db"))
	rawPush(t, url, aliceToken, "default", `{"ops":{"notes":[{"op":"upsert","id":"n1","t":"x"}]}}`)
	a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{}))
	a.sync()
	if got := noteContent(t, a, "n1"); got != `{"t":"x"}` {
		t.Fatalf("a's n1 = %s", got)
	}
	st.Close()

	// The store is made again; a plain client writes n1 there first.
	url2, _ := serve(t, "sqlite:"+filepath.Join(dir, "server2.db"))
	rawPush(t, url2, aliceToken, "default", `{"ops":{"notes":[{"op":"upsert","id":"n1","t":"y"}]}}`)
	a.eng.Close()
	a = reopen(t, a, httpremote.New(url2, aliceToken, httpremote.Options{}))
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, drivesync.ErrRemoteChanged) {
		t.Fatalf("sync: %v, want ErrRemoteChanged", err)
	}
	if err := a.eng.JoinRemote(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.sync()
	a.sync()
	b := openDevice(t, "dev-b", httpremote.New(url2, aliceToken, httpremote.Options{}))
	b.sync()
	a.sync()
	if ga, gb := noteContent(t, a, "n1"), noteContent(t, b, "n1"); ga != gb {
		t.Fatalf("diverged for good: a has n1 = %s, b (and the server) n1 = %s", ga, gb)
	}
}

// The server stamps a plain client's writes with its own device id,
// "server-<store id>". A device named so (or "server") would share its
// stamps: a device's write reserved in its outbox and a plain write of
// the same field got one stamp, {2, server}, and the server and the
// device each kept their own value for good. Open refuses such ids with a
// Server, and the server refuses writes stamped with them.
func TestReviewDeviceNamedServerRefused(t *testing.T) {
	url, _ := startServer(t, "sqlite")
	for _, id := range []string{"server", "server-1"} {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "d.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		db.Exec(schema)
		_, err = drivesync.Open(context.Background(), db, drivesync.Config{Server: httpremote.New(url, aliceToken, httpremote.Options{}), DeviceID: id, Tables: []drivesync.Table{{Name: "notes"}}})
		if err == nil || !strings.Contains(err.Error(), "server's own stamps") {
			t.Errorf("Open with device id %q: %v", id, err)
		}
	}
	req, _ := http.NewRequest("POST", url+"/sync/push", strings.NewReader(`{"ops":{"notes":[{"id":"n1","drivesync":{"version":2,"device":"server","patch":{"t":"a"}}}]}}`))
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 400 {
		t.Errorf("a write stamped by device \"server\": %d, want 400", res.StatusCode)
	}
	// Plain writes of two stores never share a stamp.
	rawPush(t, url, aliceToken, "one", `{"ops":{"notes":[{"id":"n1","t":"x"}]}}`)
	rawPush(t, url, aliceToken, "two", `{"ops":{"notes":[{"id":"n1","t":"y"}]}}`)
	clocks := map[string]bool{}
	for _, store := range []string{"one", "two"} {
		a := openDevice(t, "dev-"+store, httpremote.New(url, aliceToken, httpremote.Options{Store: store}))
		a.sync()
		var clock string
		a.db.QueryRow(`SELECT clock FROM sync_states WHERE record_id = 'n1'`).Scan(&clock)
		clocks[clock] = true
	}
	if len(clocks) != 2 {
		t.Errorf("the plain writes of two stores carry one stamp: %v", clocks)
	}
}

type failPosts struct{ fail atomic.Bool }

func (f *failPosts) RoundTrip(req *http.Request) (*http.Response, error) {
	if f.fail.Load() && req.Method == "POST" {
		return nil, errors.New("network down (test)")
	}
	return http.DefaultTransport.RoundTrip(req)
}

// loseAfter applies a POST on the server and then loses its response.
type loseAfter struct{ lose atomic.Bool }

func (l *loseAfter) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && req.Method == "POST" && l.lose.Load() {
		res.Body.Close()
		return nil, errors.New("connection reset (test)")
	}
	return res, err
}

// A push applied whose response was lost stays in the outbox with its
// Idempotency-Key. When keys belonged to the user, not to a store, after
// the store was deleted and made again and the device joined the new
// store, recoverPushes sent the batch with the same key to the new store,
// got the old store's stored response, and bindServer refused it
// (ErrRemoteChanged: "call JoinRemote"). JoinRemote did not help: the
// device could not sync, and its batch did not reach the new store, until
// the key expired (24 h).
func TestReviewReplayedKeyAfterStoreRecreatedStuck(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "server.db")
	url, _ := serve(t, "sqlite:"+path)
	lt := &loseAfter{}
	a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{HTTPClient: &http.Client{Transport: lt}, MaxAttempts: 1}))
	a.exec(`INSERT INTO notes VALUES ('n1', '{"t":1}')`)
	a.sync()
	a.exec(`INSERT INTO notes VALUES ('n2', '{"t":2}')`)
	lt.lose.Store(true)
	if _, err := a.eng.Sync(context.Background()); err == nil {
		t.Fatal("sync did not fail")
	}
	lt.lose.Store(false)

	// The operator deletes the store; another device makes it again.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`DELETE FROM sync_server_records; DELETE FROM sync_server_stores`); err != nil {
		t.Fatal(err)
	}
	b := openDevice(t, "dev-b", httpremote.New(url, aliceToken, httpremote.Options{}))
	b.exec(`INSERT INTO notes VALUES ('c1', '{"c":1}')`)
	b.sync()

	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, drivesync.ErrRemoteChanged) {
		t.Fatalf("sync: %v, want ErrRemoteChanged", err)
	}
	for i := range 2 {
		if err := a.eng.JoinRemote(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := a.eng.Sync(context.Background()); err != nil {
			t.Errorf("sync after JoinRemote %d: %v", i, err)
		}
	}
	b.sync()
	if got := b.dump(); !strings.Contains(got, "n2") {
		t.Errorf("n2 never reached the new store: b has %s", got)
	}
}

// The engine plans a write for a row whose id the server refuses (an
// empty id, or one over 1024 bytes) and reserves it in the outbox. The
// server refuses the whole batch (400); every later sync pushes the same
// outbox batch first, so the device never syncs again, whatever the app
// does: deleting the row does not take the batch back.
func TestReviewRefusedIdStuck(t *testing.T) {
	for _, id := range []string{"", strings.Repeat("k", 1025)} {
		t.Run(fmt.Sprintf("id%d", len(id)), func(t *testing.T) {
			url, _ := startServer(t, "sqlite")
			a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{}))
			a.exec(`INSERT INTO notes VALUES ('ok', '{"t":1}')`)
			a.exec(`INSERT INTO notes VALUES (?, '{"t":2}')`, id)
			_, err := a.eng.Sync(context.Background())
			t.Logf("first sync: %v", err)
			a.exec(`DELETE FROM notes WHERE id = ?`, id) // the app gives up on the row
			for i := range 2 {
				if _, err := a.eng.Sync(context.Background()); err != nil {
					t.Errorf("sync %d: %v", i, err)
				}
			}
			b := openDevice(t, "dev-b", httpremote.New(url, aliceToken, httpremote.Options{}))
			b.sync()
			if got := noteContent(t, b, "ok"); got == "<no row>" {
				t.Errorf("note 'ok' never reaches b")
			}
		})
	}
}

// startFreshElsewhere points a at a new server (an empty store at path):
// its sync stops with ErrRemoteChanged, StartFresh makes its data the new
// store, later syncs succeed, and a new device gets all of it.
func startFreshElsewhere(t *testing.T, a *device, path string) {
	t.Helper()
	url, _ := serve(t, "sqlite:"+path, small)
	a.eng.Close()
	a = reopen(t, a, httpremote.New(url, aliceToken, httpremote.Options{}))
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, drivesync.ErrRemoteChanged) {
		t.Fatalf("sync with a new server store: %v, want ErrRemoteChanged", err)
	}
	if _, err := a.eng.StartFresh(context.Background()); err != nil {
		t.Fatalf("StartFresh: %v", err)
	}
	for i := range 2 {
		if _, err := a.eng.Sync(context.Background()); err != nil {
			t.Fatalf("sync %d after StartFresh: %v", i, err)
		}
	}
	b := openDevice(t, "dev-new", httpremote.New(url, aliceToken, httpremote.Options{}))
	b.sync()
	converged(t, a, b)
}

// A database copied to another machine (a restored backup, a cloned
// phone) syncs under the same device id. The two copies stamp different
// writes alike — here both stamp their edit of n1 {M+1, id}, the copy's
// waiting in its outbox after a failed push. The server kept the first,
// the copy its own, for good. Now the server refuses the second push
// (the store holds another write under its stamp, ErrDeviceIDShared),
// the copy takes a new device id and sends its edit again under it, and
// the copies converge.
func TestReviewCopiedDatabaseSameStamps(t *testing.T) {
	url, _ := startServer(t, "sqlite")
	noID := func(c *drivesync.Config) { c.DeviceID = "" }
	a := openDevice(t, "dev-a", httpremote.New(url, aliceToken, httpremote.Options{}), noID)
	a.exec(`INSERT INTO notes VALUES ('n1', '{"t":"0"}')`)
	a.sync()
	copyPath := filepath.Join(t.TempDir(), "copy.db")
	a.exec(`VACUUM INTO ?`, copyPath)
	db2, err := sql.Open("sqlite", "file:"+copyPath+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db2.Close() })
	// A copy Open cannot tell from the original (a cloned disk keeps the
	// file's inode): forget the file the id was taken on.
	if _, err := db2.Exec(`DELETE FROM sync_meta WHERE key = 'file_id'`); err != nil {
		t.Fatal(err)
	}
	ft := &failPosts{}
	eng2, err := drivesync.Open(context.Background(), db2, drivesync.Config{Server: httpremote.New(url, aliceToken, httpremote.Options{HTTPClient: &http.Client{Transport: ft}, MaxAttempts: 1}),
		Tables: []drivesync.Table{{Name: "notes"}, {Name: "items", UniqueIntegerKey: true}}})
	if err != nil {
		t.Fatal(err)
	}
	a2 := &device{t: t, db: db2, eng: eng2}
	t.Logf("ids: %s %s", a.eng.DeviceID(), a2.eng.DeviceID())

	a2.exec(`UPDATE notes SET content = '{"t":"copy"}' WHERE id = 'n1'`)
	ft.fail.Store(true)
	a2.eng.Sync(context.Background()) // reserved, push failed
	ft.fail.Store(false)
	a.exec(`UPDATE notes SET content = '{"t":"orig"}' WHERE id = 'n1'`)
	a.sync()
	old := a2.eng.DeviceID()
	if _, err := a2.eng.Sync(context.Background()); !errors.Is(err, drivesync.ErrDeviceIDShared) {
		t.Fatalf("the copy's push under a stamp the store holds: %v, want ErrDeviceIDShared", err)
	}
	if a2.eng.DeviceID() == old {
		t.Fatalf("the copy still syncs as %s", old)
	}
	a2.sync()
	a2.sync()
	a.sync()
	if g1, g2 := noteContent(t, a, "n1"), noteContent(t, a2, "n1"); g1 != g2 {
		t.Fatalf("diverged for good: original %s, copy %s", g1, g2)
	}
}
