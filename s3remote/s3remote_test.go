package s3remote

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	_ "modernc.org/sqlite"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/remotetest"
)

// The tests run against a real S3 server, MinIO, built from the module
// proxy into a cache directory once and started on loopback.

const minioModule = "github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"

var endpoint string // http://127.0.0.1:port of the server the tests share

func TestMain(m *testing.M) {
	bin, err := minioBinary()
	if err != nil {
		fmt.Fprintln(os.Stderr, "s3remote: cannot build the MinIO server the tests need:", err)
		os.Exit(1)
	}
	stop, err := startMinio(bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "s3remote: cannot start MinIO:", err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// minioBinary returns the MinIO server, building it into the user's cache
// directory (or $DRIVESYNC_MINIO_DIR) if it is not there yet.
func minioBinary() (string, error) {
	dir := os.Getenv("DRIVESYNC_MINIO_DIR")
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(cache, "drivesync", "minio")
	}
	bin := filepath.Join(dir, "minio")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	cmd := exec.Command("go", "install", minioModule)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s: %v\n%s", minioModule, err, out)
	}
	return bin, nil
}

// server is the MinIO process the tests share.
var server struct {
	bin, addr, data string
	cmd             *exec.Cmd
}

func startMinio(bin string) (stop func(), err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	server.addr = l.Addr().String()
	l.Close()
	if server.data, err = os.MkdirTemp("", "drivesync-minio-"); err != nil {
		return nil, err
	}
	server.bin = bin
	endpoint = "http://" + server.addr
	if err := runMinio(); err != nil {
		return nil, err
	}
	return func() {
		stopMinio()
		os.RemoveAll(server.data)
	}, nil
}

// runMinio starts the server on its address and data, and waits until it
// answers.
func runMinio() error {
	cmd := exec.Command(server.bin, "server", server.data, "--address", server.addr, "--console-address", "127.0.0.1:0", "--quiet")
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER=drivesync", "MINIO_ROOT_PASSWORD=drivesync-secret", "MINIO_BROWSER=off")
	if err := cmd.Start(); err != nil {
		return err
	}
	server.cmd = cmd
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(endpoint + "/minio/health/live"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	stopMinio()
	return fmt.Errorf("no answer on %s", server.addr)
}

func stopMinio() {
	server.cmd.Process.Kill()
	server.cmd.Wait()
}

func newClient() *s3.Client {
	return s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider("drivesync", "drivesync-secret", ""),
	})
}

// newBucket makes a bucket of its own for t.
func newBucket(t *testing.T) string {
	t.Helper()
	name := strings.ToLower(fmt.Sprintf("t%d", time.Now().UnixNano()))
	if _, err := newClient().CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: &name}); err != nil {
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
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), name+".db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := db.Exec(`CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT, data BLOB)`); err != nil {
			t.Fatal(err)
		}
		r, err := New(ctx, newClient(), bucket, Options{Prefix: "store"})
		if err != nil {
			t.Fatal(err)
		}
		eng, err := drivesync.Open(ctx, db, drivesync.Config{Remote: r, Tables: []drivesync.Table{{Name: "items"}}, DeviceID: name})
		if err != nil {
			t.Fatal(err)
		}
		return db, eng
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

// The server stops while devices sync: a sync fails with ErrRemote and
// loses nothing; once the server is back, the next one completes.
func TestServerRestart(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	open := func(name string) (*sql.DB, *drivesync.Engine) {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), name+".db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if _, err := db.Exec(`CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT)`); err != nil {
			t.Fatal(err)
		}
		r, err := New(ctx, newClient(), bucket, Options{MinSleep: time.Millisecond, MaxSleep: 10 * time.Millisecond, MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		eng, err := drivesync.Open(ctx, db, drivesync.Config{Remote: r, Tables: []drivesync.Table{{Name: "items"}}, DeviceID: name})
		if err != nil {
			t.Fatal(err)
		}
		return db, eng
	}
	a, ea := open("dev-a")
	b, eb := open("dev-b")
	for i, e := range []*drivesync.Engine{ea, eb} {
		if _, err := e.Sync(ctx); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
	}
	a.Exec(`INSERT INTO items VALUES ('x', 'written while the server is down')`)
	stopMinio()
	_, err := ea.Sync(ctx)
	if !errors.Is(err, drivesync.ErrRemote) {
		t.Errorf("sync with the server down: %v, want ErrRemote", err)
	}
	if err := runMinio(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for _, e := range []*drivesync.Engine{ea, eb} {
			if _, err := e.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	var title string
	if err := b.QueryRow(`SELECT title FROM items WHERE id = 'x'`).Scan(&title); err != nil {
		t.Errorf("b: %v: the write made while the server was down did not arrive", err)
	}
}
