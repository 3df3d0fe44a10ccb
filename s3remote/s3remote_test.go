package s3remote

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	_ "modernc.org/sqlite"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/internal/drivertest"
	"github.com/drivesync/drivesync/internal/miniotest"
	"github.com/drivesync/drivesync/remotetest"
)

// The tests run against a real S3 server, MinIO, started on loopback
// (see internal/miniotest).

var server *miniotest.Server

func TestMain(m *testing.M) {
	s, err := miniotest.Start()
	if err != nil && !miniotest.Skippable(err) {
		fmt.Fprintln(os.Stderr, "s3remote:", err)
		os.Exit(1)
	}
	if err != nil {
		// Every test skips, saying why.
		fmt.Fprintln(os.Stderr, "s3remote: skipping the tests:", err)
		skipAll = err.Error()
	}
	server = s
	code := m.Run()
	if s != nil {
		s.Stop()
	}
	os.Exit(code)
}

var skipAll string

func newClient() *s3.Client { return server.Client(nil) }

// newBucket makes a bucket of its own for t (and skips t when there is no
// server to make it on).
func newBucket(t testing.TB) string {
	t.Helper()
	if skipAll != "" {
		t.Skip(skipAll)
	}
	name, err := server.Bucket(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return name
}

func TestConformance(t *testing.T) {
	bucket := newBucket(t)
	remotetest.Run(t, func(t *testing.T) drivesync.Remote {
		r, err := New(context.Background(), newClient(), bucket, Options{Prefix: t.Name()})
		if err != nil {
			t.Fatal(err)
		}
		return r
	})
}

// Two devices sync an ordinary table through one bucket.
func TestTwoDevicesSync(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	open := func(name string) (*sql.DB, *drivesync.Engine) {
		return openDevice(t, newClient(), bucket, Options{Prefix: "store"}, name, `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT, data BLOB)`)
	}
	a, ea := open("dev-a")
	b, eb := open("dev-b")
	if _, err := a.Exec(`INSERT INTO items VALUES ('x', 'from a', X'00FF')`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Exec(`INSERT INTO items VALUES ('y', 'from b', NULL)`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for _, e := range []*drivesync.Engine{ea, eb} {
			r, err := e.Sync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %+v", e.DeviceID(), r)
		}
	}
	for _, db := range []*sql.DB{a, b} {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM items WHERE (id, title, quote(data)) IN (VALUES ('x', 'from a', 'X''00FF'''), ('y', 'from b', 'NULL'))`).Scan(&n); err != nil || n != 2 {
			t.Errorf("rows %d (%v), want both devices' rows", n, err)
		}
	}
}

// The server is killed in the middle of syncs: before a download, before
// an upload, after it. A sync that needed it fails with ErrRemote and
// loses nothing; once the server is back, the next syncs deliver every
// write.
func TestServerKilledMidSync(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	var killAt drivesync.Progress // the step at which to kill the server, once
	kill := func(cfg *drivesync.Config) {
		cfg.Progress = func(p drivesync.Progress) {
			if killAt.Step != "" && p.Step == killAt.Step && p.Done == killAt.Done {
				killAt = drivesync.Progress{}
				server.Kill()
			}
		}
	}
	opts := Options{MinSleep: time.Millisecond, MaxSleep: 10 * time.Millisecond, MaxAttempts: 3}
	const schema = `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT)`
	a, ea := openDevice(t, newClient(), bucket, opts, "dev-a", schema, kill)
	b, eb := openDevice(t, newClient(), bucket, opts, "dev-b", schema, kill)
	for _, e := range []*drivesync.Engine{ea, eb} {
		if _, err := e.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range []struct {
		at      drivesync.Progress
		syncer  *drivesync.Engine // the device whose sync meets the dead server
		failing bool
	}{
		{drivesync.Progress{Step: "upload", Done: 0}, ea, true},
		{drivesync.Progress{Step: "download", Done: 0}, eb, true},
		{drivesync.Progress{Step: "upload", Done: 1}, ea, false}, // after the upload: nothing more to ask
	} {
		id := fmt.Sprint("row", i)
		if _, err := a.Exec(`INSERT INTO items VALUES (?, 'x')`, id); err != nil {
			t.Fatal(err)
		}
		if c.syncer == eb { // b downloads a's file
			if _, err := ea.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		killAt = c.at
		_, err := c.syncer.Sync(ctx)
		if killAt.Step != "" {
			t.Fatalf("%v: the sync never reached that step", c.at)
		}
		if c.failing && !errors.Is(err, drivesync.ErrRemote) || !c.failing && err != nil {
			t.Errorf("server killed at %+v: %v", c.at, err)
		}
		if err := server.Run(); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			for _, e := range []*drivesync.Engine{ea, eb} {
				if _, err := e.Sync(ctx); err != nil {
					t.Fatalf("after a restart: %v", err)
				}
			}
		}
		var n int
		if err := b.QueryRow(`SELECT count(*) FROM items WHERE id = ?`, id).Scan(&n); err != nil || n != 1 {
			t.Errorf("server killed at %+v: %s did not arrive (%v)", c.at, id, err)
		}
	}
}

// openDevice opens a device: a SQLite database of its own with schema,
// its table items synced through a Remote on bucket; edit may change the
// engine's Config first.
func openDevice(t testing.TB, client *s3.Client, bucket string, opts Options, name, schema string, edit ...func(*drivesync.Config)) (*sql.DB, *drivesync.Engine) {
	t.Helper()
	ctx := context.Background()
	db := openDB(t, name, schema)
	r, err := New(ctx, client, bucket, opts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := drivesync.Config{Remote: r, Tables: []drivesync.Table{{Name: "items"}}, DeviceID: name}
	for _, f := range edit {
		f(&cfg)
	}
	eng, err := drivesync.Open(ctx, db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return db, eng
}

// loseResponse is a transport that sends the requests match picks to the
// server and then reports the connection reset, as if the response were
// lost, the first times times.
type loseResponse struct {
	match func(*http.Request) bool
	times atomic.Int32
}

func (l *loseResponse) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || !l.match(req) || l.times.Add(-1) < 0 {
		return resp, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil, fmt.Errorf("injected: %w", syscall.ECONNRESET)
}

// A file larger than PartSize goes up in parts: its bytes arrive whole,
// a second create of its name is refused and leaves no upload behind, and
// a completion whose response was lost is recognised as ours.
func TestMultipartUpload(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	complete := func(req *http.Request) bool {
		return req.Method == http.MethodPost && req.URL.Query().Has("uploadId")
	}
	lose := &loseResponse{match: complete}
	r, err := New(ctx, server.Client(lose), bucket, Options{Prefix: "mp", PartSize: 5 << 20, MinSleep: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	content := make([]byte, 12<<20+17)
	rand.Read(content)
	check := func(name string, want []byte) {
		t.Helper()
		rc, err := r.Open(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		got, err := io.ReadAll(rc)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes (%v), want the %d written", name, len(got), err, len(want))
		}
	}
	// From a seekable reader, and spooled from a stream.
	if err := r.Create(ctx, "2026/01/01/big", bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	check("2026/01/01/big", content)
	if err := r.Create(ctx, "2026/01/01/streamed", io.MultiReader(bytes.NewReader(content[:7<<20]), bytes.NewReader(content[7<<20:]))); err != nil {
		t.Fatal(err)
	}
	check("2026/01/01/streamed", content)

	other := bytes.Repeat([]byte{1}, 6<<20)
	if err := r.Create(ctx, "2026/01/01/big", bytes.NewReader(other)); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second create of a name: %v, want fs.ErrExist", err)
	}
	check("2026/01/01/big", content)
	ups, err := newClient().ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: &bucket})
	if err != nil {
		t.Fatal(err)
	}
	if len(ups.Uploads) != 0 {
		t.Errorf("%d multipart uploads left in progress, want the refused one aborted", len(ups.Uploads))
	}

	lose.times.Store(1)
	if err := r.Create(ctx, "2026/01/01/lost", bytes.NewReader(content)); err != nil {
		t.Errorf("create whose completion's response was lost: %v, want it recognised as ours", err)
	}
	if lose.times.Load() >= 1 {
		t.Error("no completion's response was lost: the test did not test")
	}
	check("2026/01/01/lost", content)
}

// A plain PUT whose response was lost after the server stored it: the
// retry meets 412, and the object's ETag shows it is ours.
func TestPutResponseLost(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	lose := &loseResponse{match: func(req *http.Request) bool {
		return req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, "/a")
	}}
	r, err := New(ctx, server.Client(lose), bucket, Options{MinSleep: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lose.times.Store(1)
	if err := r.Create(ctx, "a", strings.NewReader("content")); err != nil {
		t.Errorf("create whose response was lost: %v, want it recognised as ours", err)
	}
	lose.times.Store(1)
	if err := r.Create(ctx, "a", strings.NewReader("other")); !errors.Is(err, fs.ErrExist) {
		t.Errorf("create of a taken name whose first response was lost: %v, want fs.ErrExist", err)
	}
}

// The engine's multi-device scenarios (convergence, concurrent edits, an
// ordinary table, a refused row, writes during a sync, an upload never
// committed, a snapshot bootstrapping a device, cancelled syncs) over S3,
// each on a store of its own.
func TestScenarios(t *testing.T) {
	bucket := newBucket(t)
	drivertest.Run(t, drivertest.Driver{
		Name: "sqlite",
		DSN: func(path string, busyTimeout time.Duration) string {
			return fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate", path, busyTimeout.Milliseconds())
		},
		Remote: func(t *testing.T) drivesync.Remote {
			r, err := New(context.Background(), newClient(), bucket, Options{Prefix: t.Name()})
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
	})
}

// replyError is a transport that answers the requests match picks with an
// S3 error of the given status and code, without sending them, and counts
// them.
type replyError struct {
	match  func(*http.Request) bool
	status int
	code   string
	n      atomic.Int32
}

func (e *replyError) RoundTrip(req *http.Request) (*http.Response, error) {
	if !e.match(req) {
		return http.DefaultTransport.RoundTrip(req)
	}
	e.n.Add(1)
	if req.Body != nil {
		req.Body.Close()
	}
	body := `<?xml version="1.0" encoding="UTF-8"?><Error><Code>` + e.code + `</Code><Message>injected</Message></Error>`
	return &http.Response{
		StatusCode: e.status, Status: fmt.Sprint(e.status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/xml"}}, Body: io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)), Request: req,
	}, nil
}

// Errors say what to do, and are typed for the engine: bad keys and a
// key without permissions are ErrAuth, a missing bucket says so, a full
// server is ErrQuota (not retried), a file refused to this key is
// fs.ErrPermission, throttling is retried.
func TestErrors(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	bad := s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: &server.Endpoint, UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(miniotest.AccessKey, "wrong-secret", "")})
	if _, err := New(ctx, bad, bucket, Options{MaxAttempts: 1}); !errors.Is(err, drivesync.ErrAuth) || !strings.Contains(err.Error(), "access key") {
		t.Errorf("wrong secret: %v, want ErrAuth saying to check the access key", err)
	}
	if _, err := New(ctx, newClient(), "no-such-bucket", Options{MaxAttempts: 1}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing bucket: %v, want an error saying it does not exist", err)
	}

	isPut := func(req *http.Request) bool {
		return req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, "/f")
	}
	isGet := func(req *http.Request) bool {
		return req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/f")
	}
	isList := func(req *http.Request) bool { return req.URL.Query().Get("list-type") == "2" }
	for _, c := range []struct {
		name   string
		fault  *replyError
		op     func(r *Remote) error
		want   error
		sent   int32 // requests the fault answered: 1 unless retried
		advice string
	}{
		{"full", &replyError{match: isPut, status: 507, code: "XMinioStorageFull"},
			func(r *Remote) error { return r.Create(ctx, "f", strings.NewReader("x")) }, drivesync.ErrQuota, 1, "quota"},
		{"bucket quota", &replyError{match: isPut, status: 400, code: "XMinioAdminBucketQuotaExceeded"},
			func(r *Remote) error { return r.Create(ctx, "f", strings.NewReader("x")) }, drivesync.ErrQuota, 1, "quota"},
		{"file refused", &replyError{match: isGet, status: 403, code: "AccessDenied"},
			func(r *Remote) error { _, err := r.Open(ctx, "f"); return err }, fs.ErrPermission, 1, ""},
		{"listing refused", &replyError{match: isList, status: 403, code: "AccessDenied"},
			func(r *Remote) error { _, err := r.List(ctx, time.Time{}); return err }, drivesync.ErrAuth, 1, "s3:ListBucket"},
		{"throttled", &replyError{match: isList, status: 503, code: "SlowDown"},
			func(r *Remote) error { _, err := r.List(ctx, time.Time{}); return err }, nil, 3, ""},
	} {
		r, err := New(ctx, server.Client(c.fault), bucket, Options{Prefix: c.name, MinSleep: time.Millisecond, MaxSleep: time.Millisecond, MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		err = c.op(r)
		switch {
		case c.want == nil && err == nil:
			t.Errorf("%s: no error", c.name)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		case !strings.Contains(fmt.Sprint(err), c.advice):
			t.Errorf("%s: %v, want it to mention %q", c.name, err, c.advice)
		}
		if n := c.fault.n.Load(); n != c.sent {
			t.Errorf("%s: %d requests, want %d", c.name, n, c.sent)
		}
	}
}

// openDB opens a device's SQLite database, of its own, with schema.
func openDB(t testing.TB, name, schema string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), name+".db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(schema); err != nil {
		t.Fatal(err)
	}
	return db
}
