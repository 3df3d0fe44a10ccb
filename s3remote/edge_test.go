package s3remote

// Conditions an outside review of the S3 remote found it could not
// survive: each test failed before its fix.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/md5"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/internal/miniotest"
)

// stallTransport holds the requests match picks while on is set, as a
// network that stopped answering does, until the request's context is
// done (or the test ends and releases them).
type stallTransport struct {
	match   func(*http.Request) bool
	on      atomic.Bool
	release chan struct{}
	held    atomic.Int32
}

func newStall(t *testing.T, match func(*http.Request) bool) *stallTransport {
	s := &stallTransport{match: match, release: make(chan struct{})}
	t.Cleanup(func() { close(s.release) })
	return s
}

func (s *stallTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if s.on.Load() && s.match(req) {
		s.held.Add(1)
		select {
		case <-req.Context().Done():
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, req.Context().Err()
		case <-s.release:
		}
	}
	return http.DefaultTransport.RoundTrip(req)
}

// A Remote returns promptly once its context is done. A multipart Create
// whose network stops answering fails at the deadline; the abort of its
// parts then gets a short grace of its own, not an unbounded wait (it
// once ran without any deadline, and Create, with the app's Sync, never
// returned).
func TestMultipartCreateReturnsAtDeadline(t *testing.T) {
	bucket := newBucket(t)
	stall := newStall(t, func(req *http.Request) bool { return req.URL.Query().Has("uploadId") })
	r, err := New(context.Background(), server.Client(stall), bucket, Options{PartSize: 5 << 20, MinSleep: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	content := make([]byte, 6<<20)
	rand.Read(content)
	stall.on.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Create(ctx, "2026/01/01/snapshot_big", bytes.NewReader(content)) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Create: %v, want context.DeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Create still running 9s after its context's deadline (%d requests held): the deferred AbortMultipartUpload runs under context.WithoutCancel with no timeout", stall.held.Load())
	}
}

// The same in New: the self-test's delete of its scratch key runs under
// the caller's context (a key left behind is harmless: listings skip it).
func TestNewReturnsAtDeadline(t *testing.T) {
	bucket := newBucket(t)
	stall := newStall(t, func(req *http.Request) bool { return req.Method == http.MethodDelete })
	stall.on.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := New(ctx, server.Client(stall), bucket, Options{MinSleep: time.Millisecond})
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("New still running 9s after its context's deadline (%d requests held): the self-test's deferred DeleteObject runs under context.WithoutCancel with no timeout", stall.held.Load())
	}
}

// awsLikeProxy is a proxy in front of the MinIO server that lists an
// object made by a multipart upload with the LastModified of the upload's
// start, as AWS does, and holds each upload's completion for hold (its
// parts taking that long to send). initiated says when the upload of a
// key whose name contains substr began.
func awsLikeProxy(t *testing.T, bucket string, hold time.Duration) (endpoint string, initiated func(substr string) (time.Time, bool)) {
	target, _ := url.Parse(server.Endpoint)
	rp := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	started := map[string]time.Time{}
	entry := regexp.MustCompile(`<Key>([^<]*)</Key><LastModified>([^<]*)</LastModified>`)
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodGet || resp.Request.URL.Query().Get("list-type") != "2" || resp.StatusCode != 200 {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		mu.Lock()
		body = entry.ReplaceAllFunc(body, func(m []byte) []byte {
			sub := entry.FindSubmatch(m)
			at, ok := started[string(sub[1])]
			if !ok {
				return m
			}
			return []byte("<Key>" + string(sub[1]) + "</Key><LastModified>" + at.UTC().Format("2006-01-02T15:04:05.000Z") + "</LastModified>")
		})
		mu.Unlock()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		key := strings.TrimPrefix(req.URL.Path, "/"+bucket+"/")
		switch {
		case req.Method == http.MethodPost && q.Has("uploads"):
			mu.Lock()
			started[key] = time.Now()
			mu.Unlock()
		case req.Method == http.MethodPost && q.Has("uploadId"):
			time.Sleep(hold)
		}
		rp.ServeHTTP(w, req)
	}))
	t.Cleanup(proxy.Close)
	return proxy.URL, func(substr string) (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		for k, at := range started {
			if strings.Contains(k, substr) {
				return at, true
			}
		}
		return time.Time{}, false
	}
}

// AWS gives an object uploaded in parts the LastModified of the upload's
// start, not its completion; MinIO gives the completion's. A file whose
// upload outlasts the engine's ListOverlap (a big snapshot or merge file
// on a slow uplink) was once missed for good by List(since), which
// filtered by LastModified: not there yet for a device that listed during
// the upload, and too old for every later listing. List now returns every
// object.
func TestListShowsFileDatedAtItsUploadsStart(t *testing.T) {
	bucket := newBucket(t)
	const hold = 4 * time.Second // the upload's parts take this long
	endpoint, initiated := awsLikeProxy(t, bucket, hold)
	ctx := context.Background()
	r, err := New(ctx, miniotest.ClientAt(endpoint, nil), bucket, Options{PartSize: 5 << 20, MinSleep: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	content := make([]byte, 6<<20)
	rand.Read(content)
	const name = "2026/01/01/merge_20260101T000000.000Z_dev-a.json.gz"
	done := make(chan error, 1)
	go func() { done <- r.Create(ctx, name, bytes.NewReader(content)) }()
	for {
		if _, ok := initiated(name); ok {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Another device syncs while the upload is under way: its cursor is
	// the remote's time before it lists, and the file is not there yet.
	time.Sleep(hold - time.Second)
	cursor, err := r.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	files, err := r.List(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f.Name == name {
			t.Fatal("the file was listed before its upload completed: the test did not test")
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Created after cursor: every later List(since <= cursor) must show it.
	files, err = r.List(ctx, cursor)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f.Name == name {
			return
		}
	}
	t.Errorf("List(%s) misses %s, which completed after that time (its LastModified is its upload's start, as on AWS): a device whose cursor passed it never lists it", cursor.Format(time.RFC3339Nano), name)
}

// One bucket holds a store per prefix, and a store may be at the bucket's
// root. List lists every key under the prefix, at any depth, and the
// engine once took any path whose last element is a patch, snapshot or
// merge name as a file of its store: the root store took in the rows of
// the stores under it, and its compaction deleted their files. The engine
// takes only names in the day folder of their time.
func TestRootStoreLeavesPrefixStoresAlone(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	const schema = `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT)`
	open := func(prefix, name string, cfg drivesync.Config) (*sql.DB, *drivesync.Engine) {
		return openDevice(t, newClient(), bucket, Options{Prefix: prefix}, name, schema, func(c *drivesync.Config) {
			c.ListOverlap, c.Retention = cfg.ListOverlap, cfg.Retention
		})
	}
	// Store "other" under the prefix other/: one device writes a row.
	o1, eo1 := open("other", "dev-o1", drivesync.Config{})
	if _, err := o1.Exec(`INSERT INTO items VALUES ('x', 'a row of store other')`); err != nil {
		t.Fatal(err)
	}
	if _, err := eo1.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// Another store at the bucket's root.
	root, er := open("", "dev-r", drivesync.Config{ListOverlap: time.Millisecond, Retention: time.Millisecond})
	if _, err := er.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var title string
	if err := root.QueryRow(`SELECT title FROM items WHERE id = 'x'`).Scan(&title); err == nil {
		t.Errorf("the root store's device has %q, a row of store other/", title)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := er.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := newClient().ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: aws.String("other/")})
	if err != nil {
		t.Fatal(err)
	}
	patches := 0
	for _, o := range out.Contents {
		if strings.Contains(aws.ToString(o.Key), "/patch_") {
			patches++
		}
	}
	if patches == 0 {
		t.Errorf("store other/ has no patch file left: the root store's compaction deleted it")
	}
	// A new device of store other.
	o2, eo2 := open("other", "dev-o2", drivesync.Config{})
	if _, err := eo2.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := o2.QueryRow(`SELECT title FROM items WHERE id = 'x'`).Scan(&title); err != nil {
		t.Errorf("a new device of store other/ lacks row x (%v): lost", err)
	}
}

// An Open must not report a refusal of one file as an outage. An object
// that another writer of a shared bucket stored with SSE-C (a key of its
// own) cannot be read without that key: the server answers 400
// InvalidRequest, which once failed the sync, and every later one since
// the file stays listed. It is refused alone now (fs.ErrPermission), as a
// 403 is. SSE-C needs TLS: this test runs a MinIO of its own with a
// self-signed certificate.
func TestObjectRefusedToTheKeyIsSkipped(t *testing.T) {
	if skipAll != "" {
		t.Skip(skipAll)
	}
	ctx := context.Background()
	endpoint, tr := startTLSMinio(t)
	client := miniotest.ClientAt(endpoint, tr)
	bucket := "sse"
	if _, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatal(err)
	}
	const schema = `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT)`
	a, ea := openDevice(t, client, bucket, Options{}, "dev-a", schema)
	if _, err := a.Exec(`INSERT INTO items VALUES ('x', 'from a')`); err != nil {
		t.Fatal(err)
	}
	if _, err := ea.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// Another writer of the bucket stores a file with a key of its own.
	key := bytes.Repeat([]byte{7}, 32)
	sum := md5.Sum(key)
	now := time.Now().UTC()
	name := now.Format("2006/01/02") + "/patch_" + now.Format("20060102T150405.000Z") + "_dev-other.json.gz"
	if _, err := client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(name), Body: strings.NewReader("whatever"),
		SSECustomerAlgorithm: aws.String("AES256"),
		SSECustomerKey:       aws.String(base64.StdEncoding.EncodeToString(key)),
		SSECustomerKeyMD5:    aws.String(base64.StdEncoding.EncodeToString(sum[:])),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(`INSERT INTO items VALUES ('y', 'from a, later')`); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := ea.Sync(ctx); err != nil {
			t.Errorf("sync %d: %v: one unreadable file fails every sync, where a refusal (fs.ErrPermission) would be skipped", i, err)
		}
	}
}

// startTLSMinio runs a MinIO server with a self-signed certificate for
// 127.0.0.1, and returns its endpoint and a transport that trusts it.
func startTLSMinio(t *testing.T) (string, http.RoundTripper) {
	t.Helper()
	bin, err := miniotest.Binary()
	if err != nil {
		t.Skip(err)
	}
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	certs := t.TempDir()
	os.WriteFile(filepath.Join(certs, "public.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(filepath.Join(certs, "private.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), 0o600)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "server", t.TempDir(), "--address", addr, "--console-address", "127.0.0.1:0", "--quiet", "--certs-dir", certs)
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+miniotest.AccessKey, "MINIO_ROOT_PASSWORD="+miniotest.SecretKey, "MINIO_BROWSER=off")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pool := x509.NewCertPool()
	cert, _ := x509.ParseCertificate(der)
	pool.AddCert(cert)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	endpoint := "https://" + addr
	hc := &http.Client{Transport: tr}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if resp, err := hc.Get(endpoint + "/minio/health/live"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return endpoint, tr
			}
		}
	}
	t.Fatal("the TLS MinIO did not answer")
	return "", nil
}

// A key with a control character (S3 keys may hold any UTF-8 but NUL; a
// tool or another writer of the bucket can make one) came back, with keys
// asked for as XML text, as a character reference XML 1.0 forbids: the
// SDK could not decode the page, and every sync failed for good. Keys are
// asked for URL-encoded now.
func TestControlCharacterInAKey(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	r, err := New(ctx, newClient(), bucket, Options{Prefix: "store", MinSleep: time.Millisecond, MaxSleep: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newClient().PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: aws.String("store/notes\x01.txt"), Body: strings.NewReader("x")}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.List(ctx, time.Time{}); err != nil {
		t.Errorf("List with a key holding U+0001 under the prefix: %v", err)
	}
	_, e := openDevice(t, newClient(), bucket, Options{Prefix: "store"}, "dev-a", `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT)`)
	for i := range 2 {
		if _, err := e.Sync(ctx); err != nil {
			t.Errorf("sync %d: %v", i, err)
		}
	}
}

// The engine's view of TestListShowsFileDatedAtItsUploadsStart: a device
// joins a store (JoinRemote) and publishes its records in a merge file
// over PartSize, uploaded in parts, dated as AWS dates it, the upload
// taking longer than ListOverlap. A device of the store that syncs during
// the upload, and again after, must get the joiner's records. (ListOverlap
// 500ms and a 5 s upload here; 15 minutes and a long upload in the field.)
func TestMergeFileUploadedInPartsDatedAtItsStart(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	const hold = 5 * time.Second
	endpoint, initiated := awsLikeProxy(t, bucket, hold)
	const schema = `CREATE TABLE items (id TEXT PRIMARY KEY, data BLOB)`
	newDB := func(name string) *sql.DB { return openDB(t, name, schema) }
	engine := func(db *sql.DB, name, prefix string, overlap time.Duration) *drivesync.Engine {
		r, err := New(ctx, miniotest.ClientAt(endpoint, nil), bucket, Options{Prefix: prefix, PartSize: 5 << 20, MinSleep: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		e, err := drivesync.Open(ctx, db, drivesync.Config{Remote: r, Tables: []drivesync.Table{{Name: "items"}}, DeviceID: name, ListOverlap: overlap})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	// Store s: device b.
	b := newDB("dev-b")
	eb := engine(b, "dev-b", "s", 500*time.Millisecond)
	b.Exec(`INSERT INTO items VALUES ('b', X'00')`)
	if _, err := eb.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// Device j, of another store, with 6 MiB of records.
	j := newDB("dev-j")
	ej := engine(j, "dev-j", "j", 0)
	const rows = 24
	for i := range rows {
		blob := make([]byte, 256<<10)
		rand.Read(blob)
		if _, err := j.Exec(`INSERT INTO items VALUES (?, ?)`, "j"+strconv.Itoa(i), blob); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ej.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	ej.Close()
	// j is pointed at store s and joins it.
	ej = engine(j, "dev-j", "s", 0)
	if _, err := ej.Sync(ctx); !errors.Is(err, drivesync.ErrRemoteChanged) {
		t.Fatalf("j on store s: %v, want ErrRemoteChanged", err)
	}
	if err := ej.JoinRemote(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ej.Sync(ctx)
		done <- err
	}()
	for {
		if _, ok := initiated("/merge_"); ok {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("j's sync ended (%v) without a multipart merge upload: the test did not test", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	time.Sleep(hold - 2*time.Second)
	if _, err := eb.Sync(ctx); err != nil { // during the upload
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := eb.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := b.QueryRow(`SELECT count(*) FROM items WHERE id LIKE 'j%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != rows {
		t.Errorf("b has %d of j's %d rows after syncing three times since j's merge file completed: it never listed the file", n, rows)
	}
	// A new device of store s does get them: the devices diverge.
	c := newDB("dev-c")
	ec := engine(c, "dev-c", "s", 500*time.Millisecond)
	if _, err := ec.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	c.QueryRow(`SELECT count(*) FROM items WHERE id LIKE 'j%'`).Scan(&n)
	t.Logf("a new device of the store has %d of j's rows", n)
}
