package httpremote_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/google/uuid"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/httpremote"
	"github.com/drivesync/drivesync/internal/pgtest"
	"github.com/drivesync/drivesync/remotetest"
	"github.com/drivesync/drivesync/syncserver"
)

// TestFilesConformance runs the Remote contract's tests on a store's
// files on the server, each in a store of its own.
func TestFilesConformance(t *testing.T) {
	eachKind(t, func(t *testing.T, kind string) {
		url, _ := startServer(t, kind)
		remotetest.Run(t, func(t *testing.T) drivesync.Remote {
			return httpremote.New(url, aliceToken, httpremote.Options{Store: uuid.NewString()}).Files()
		})
	})
}

// dropAfter is a transport that, for the requests of one method, lets
// the server answer and then cuts the connection: the client never hears
// that its request was carried out.
type dropAfter struct {
	method string
	n      atomic.Int32 // responses still to drop
}

func (d *dropAfter) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && req.Method == d.method && d.n.Add(-1) >= 0 {
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return nil, syscall.ECONNRESET
	}
	return res, err
}

// TestFilesLostAnswer checks that a file whose creation's answer was lost
// is taken as created when the request is sent again with the same
// bytes, and that other bytes under that name are refused.
func TestFilesLostAnswer(t *testing.T) {
	url, _ := startServer(t, "sqlite")
	drop := &dropAfter{method: http.MethodPut}
	drop.n.Store(2)
	r := httpremote.New(url, aliceToken, httpremote.Options{Store: "lost", HTTPClient: &http.Client{Transport: drop}, MinSleep: 1, MaxSleep: 2}).Files()
	ctx := context.Background()
	if err := r.Create(ctx, "a/patch", strings.NewReader("first")); err != nil {
		t.Fatalf("Create after two lost answers: %v", err)
	}
	if drop.n.Load() >= 0 {
		t.Fatalf("the transport dropped %d answers, want 2", 2-drop.n.Load())
	}
	rc, err := r.Open(ctx, "a/patch")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "first" {
		t.Fatalf("read %q, want %q", got, "first")
	}
	if err := r.Create(ctx, "a/patch", strings.NewReader("other")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Create of other bytes under a taken name: got %v, want fs.ErrExist", err)
	}
}

// TestFilesStoreKinds checks that a store keeps records or files, as it
// was made, and that each user's stores are their own.
func TestFilesStoreKinds(t *testing.T) {
	url, _ := startServer(t, "sqlite")
	ctx := context.Background()
	// A store made by a push keeps records: its files are refused.
	plain := openDevice(t, "plain", httpremote.New(url, aliceToken, httpremote.Options{Store: "records"}))
	plain.exec(`INSERT INTO notes VALUES ('n1', '{"t":"plain note"}')`)
	plain.sync()
	files := httpremote.New(url, aliceToken, httpremote.Options{Store: "records"}).Files()
	if _, err := files.List(ctx, time0); !errors.Is(err, drivesync.ErrWrongKey) || !strings.Contains(err.Error(), "keeps records") {
		t.Fatalf("List on a store of records: got %v, want ErrWrongKey saying it keeps records", err)
	}
	if err := files.Create(ctx, "x", strings.NewReader("x")); !errors.Is(err, drivesync.ErrWrongKey) {
		t.Fatalf("Create on a store of records: got %v, want ErrWrongKey", err)
	}
	// A store made by a file keeps files: pushes and pulls are refused.
	sealed := httpremote.New(url, aliceToken, httpremote.Options{Store: "sealed"})
	if err := sealed.Files().Create(ctx, "drivesync.json", strings.NewReader("{}")); err != nil {
		t.Fatal(err)
	}
	if _, err := sealed.Pull(ctx, "", ""); !errors.Is(err, drivesync.ErrWrongKey) || !strings.Contains(err.Error(), "Config.Encryption") {
		t.Fatalf("Pull from a store of files: got %v, want ErrWrongKey naming Config.Encryption", err)
	}
	if _, err := sealed.Push(ctx, &drivesync.PushBatch{Writes: []drivesync.ServerWrite{{Table: "notes", Record: "n", Version: 1, Device: "d", Patch: []byte(`{"content":"x"}`)}}}); !errors.Is(err, drivesync.ErrWrongKey) {
		t.Fatalf("Push to a store of files: got %v, want ErrWrongKey", err)
	}
	// Bob's store of that name is his own, and empty.
	bob := httpremote.New(url, bobToken, httpremote.Options{Store: "sealed"}).Files()
	if got, err := bob.List(ctx, time0); err != nil || len(got) != 0 {
		t.Fatalf("bob lists %v, %v: want no files", got, err)
	}
	if _, err := bob.Open(ctx, "drivesync.json"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("bob opens alice's file: got %v, want fs.ErrNotExist", err)
	}
}

// TestFilesTooLarge checks that a file over the server's limit is refused
// with an error that says which limit to lower, and nothing is stored.
func TestFilesTooLarge(t *testing.T) {
	url, _ := serve(t, "sqlite:"+t.TempDir()+"/s.db", func(o *syncserver.Options) { o.MaxFileBytes = 1000 })
	r := httpremote.New(url, aliceToken, httpremote.Options{Store: "big"}).Files()
	ctx := context.Background()
	err := r.Create(ctx, "big", bytes.NewReader(make([]byte, 1001)))
	if !errors.Is(err, drivesync.ErrFileTooLarge) || !strings.Contains(err.Error(), "MaxSnapshotSize") {
		t.Fatalf("Create over the limit: got %v, want ErrFileTooLarge naming Limits.MaxSnapshotSize", err)
	}
	if got, err := r.List(ctx, time0); err != nil || len(got) != 0 {
		t.Fatalf("after a refused file the store lists %v, %v", got, err)
	}
	if err := r.Create(ctx, "small", bytes.NewReader(make([]byte, 1000))); err != nil {
		t.Fatal(err)
	}
}

// TestEncryptedThroughServer syncs an encrypted store through the server
// on both databases, and scans every byte the server keeps for what the
// devices wrote.
func TestEncryptedThroughServer(t *testing.T) {
	eachKind(t, func(t *testing.T, kind string) {
		spec := pgSpec(t, kind)
		url, _ := serve(t, spec)
		// X25519 keys: a passphrase's scrypt takes a second per engine.
		key := x25519Key(t)
		srv := func() *httpremote.Client { return httpremote.New(url, aliceToken, httpremote.Options{Store: "notes"}) }
		withKey := func(k drivesync.Key) func(*drivesync.Config) {
			return func(c *drivesync.Config) { c.Encryption = k }
		}
		a := openDevice(t, "a", srv(), withKey(key))
		b := openDevice(t, "b", srv(), withKey(key))
		a.exec(`INSERT INTO notes VALUES ('SECRET-ID-1', '{"t":"SECRET-TITLE-alpha"}')`)
		a.exec(`INSERT INTO items VALUES (7, 'SECRET-NAME-beta', 1.5, x'5345435245542d424c4f42')`)
		a.sync()
		b.sync()
		b.exec(`UPDATE notes SET content = '{"t":"SECRET-EDIT-gamma"}' WHERE id = 'SECRET-ID-1'`)
		b.exec(`INSERT INTO notes VALUES ('n2', '{"t":"SECRET-TITLE-delta"}')`)
		b.sync()
		a.sync()
		if got, want := a.dump(), b.dump(); got != want || !strings.Contains(got, "SECRET-EDIT-gamma") || !strings.Contains(got, "SECRET-TITLE-delta") {
			t.Fatalf("a:\n%s\nb:\n%s", got, want)
		}
		// A third device joins from what the server keeps.
		c := openDevice(t, "c", srv(), withKey(key))
		c.sync()
		if got, want := c.dump(), a.dump(); got != want {
			t.Fatalf("a new device got\n%s\nwant\n%s", got, want)
		}

		// The server keeps files, every one sealed, and no record.
		files := srv().Files()
		ctx := context.Background()
		list, err := files.List(ctx, time0)
		if err != nil || len(list) < 3 {
			t.Fatalf("the store lists %d files, %v: want the marker and the patches of two syncs", len(list), err)
		}
		for _, f := range list {
			rc, err := files.Open(ctx, f.Name)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(rc)
			rc.Close()
			if f.Name != "drivesync.json" && !bytes.HasPrefix(b, []byte("age-encryption.org/v1\n")) {
				t.Errorf("%s is not an age file: %.40q", f.Name, b)
			}
		}
		dump := serverBytes(t, kind, spec)
		if !bytes.Contains(dump, []byte("age-encryption.org/v1")) {
			t.Fatal("the scan of the server's database found no sealed file: it scans the wrong thing")
		}
		for _, secret := range []string{"SECRET-ID", "SECRET-TITLE", "SECRET-NAME", "SECRET-BLOB", "SECRET-EDIT", "5345435245542d"} {
			if bytes.Contains(dump, []byte(secret)) {
				t.Errorf("the server's database holds %q", secret)
			}
		}

		// No key, a wrong key: ErrWrongKey, and nothing uploaded.
		before := len(list)
		noKey := openDevice(t, "nokey", srv())
		noKey.exec(`INSERT INTO notes VALUES ('mine', '{"t":"kept"}')`)
		if _, err := noKey.eng.Sync(ctx); !errors.Is(err, drivesync.ErrWrongKey) || !strings.Contains(err.Error(), "Config.Encryption") {
			t.Fatalf("sync without a key: got %v, want ErrWrongKey naming Config.Encryption", err)
		}
		wrong := openDevice(t, "wrong", srv(), withKey(x25519Key(t)))
		wrong.exec(`INSERT INTO notes VALUES ('mine', '{"t":"kept"}')`)
		if _, err := wrong.eng.Sync(ctx); !errors.Is(err, drivesync.ErrWrongKey) {
			t.Fatalf("sync with a wrong key: got %v, want ErrWrongKey", err)
		}
		for _, d := range []*device{noKey, wrong} {
			if got := d.dump(); strings.Contains(got, "SECRET") || !strings.Contains(got, "kept") {
				t.Errorf("after a refused sync the device holds\n%s", got)
			}
			if st, err := d.eng.Status(ctx); err != nil || st.Pending != 1 {
				t.Errorf("after a refused sync: status %+v, %v: want its edit pending", st, err)
			}
		}
		if list, err := files.List(ctx, time0); err != nil || len(list) != before {
			t.Errorf("refused syncs left %d files, want %d (%v)", len(list), before, err)
		}

		// A key on a store of records.
		plain := openDevice(t, "plain", httpremote.New(url, aliceToken, httpremote.Options{Store: "plain"}))
		plain.exec(`INSERT INTO notes VALUES ('p', '{"t":"PLAINTEXT-VISIBLE"}')`)
		plain.sync()
		if !bytes.Contains(serverBytes(t, kind, spec), []byte("PLAINTEXT-VISIBLE")) {
			t.Fatal("the scan does not find a plain store's record: it cannot find the others'")
		}
		keyed := openDevice(t, "keyed", httpremote.New(url, aliceToken, httpremote.Options{Store: "plain"}), withKey(key))
		if _, err := keyed.eng.Sync(ctx); !errors.Is(err, drivesync.ErrWrongKey) {
			t.Fatalf("sync with a key on a store of records: got %v, want ErrWrongKey", err)
		}
	})
}

var time0 time.Time

func x25519Key(t *testing.T) drivesync.Key {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	return drivesync.X25519Key(id)
}

// pgSpec is a fresh store's spec of kind.
func pgSpec(t *testing.T, kind string) string {
	if kind == "sqlite" {
		return "sqlite:" + t.TempDir() + "/server.db"
	}
	return pgtest.Fresh(t)
}

// serverBytes is everything the server's database holds: an SQLite
// file's bytes (with its write-ahead log), or every row of every table
// of the PostgreSQL schema, as text.
func serverBytes(t *testing.T, kind, spec string) []byte {
	t.Helper()
	if kind == "sqlite" {
		path := strings.TrimPrefix(spec, "sqlite:")
		var all []byte
		for _, p := range []string{path, path + "-wal"} {
			b, err := os.ReadFile(p)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			all = append(all, b...)
		}
		return all
	}
	db, err := sql.Open("pgx", spec)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var name string
		rows.Scan(&name)
		tables = append(tables, name)
	}
	rows.Close()
	if len(tables) == 0 {
		t.Fatal("the server's schema has no tables")
	}
	var all []byte
	for _, table := range tables {
		// Every row as text (bytea shows as hex); the files' bytes
		// themselves are added below.
		rows, err := db.Query(`SELECT x::text FROM ` + table + ` x`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			rows.Scan(&s)
			all = append(all, s...)
		}
		rows.Close()
	}
	var data [][]byte
	rows, err = db.Query(`SELECT data FROM sync_server_chunks`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var b []byte
		rows.Scan(&b)
		data = append(data, b)
	}
	rows.Close()
	return append(all, bytes.Join(data, nil)...)
}
