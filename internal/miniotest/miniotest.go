// Package miniotest runs a real S3 server, MinIO, on loopback for tests.
//
// The server is built from the module proxy with `go install` once, into
// $DRIVESYNC_MINIO_DIR or the user's cache directory, and reused after:
// CI builds it before the tests run. When it cannot be built, tests skip
// with the reason, unless DRIVESYNC_REQUIRE_S3 is set (CI sets it), which
// makes them fail instead.
package miniotest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Module is the MinIO server the tests build.
const Module = "github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"

// The server's root credentials.
const (
	AccessKey = "drivesync"
	SecretKey = "drivesync-secret"
)

// Binary returns the path of the MinIO server, building it first if it is
// not in the cache directory yet. One process builds at a time (a lock
// directory beside the binary): another that needs it meanwhile waits.
func Binary() (string, error) {
	dir := os.Getenv("DRIVESYNC_MINIO_DIR")
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(cache, "drivesync", "minio")
	}
	bin := filepath.Join(dir, "minio")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock := filepath.Join(dir, "building")
	for {
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
		err := os.Mkdir(lock, 0o755)
		if err == nil {
			defer os.Remove(lock)
			return bin, build(dir, bin)
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
		// Another process is building it; a lock older than any build
		// is one whose builder died.
		if info, err := os.Stat(lock); err == nil && time.Since(info.ModTime()) > 30*time.Minute {
			os.Remove(lock)
		}
		time.Sleep(time.Second)
	}
}

// build installs the server into dir, through a directory of its own and
// a rename, so that no one runs a half-written file.
func build(dir, bin string) error {
	if _, err := os.Stat(bin); err == nil {
		return nil
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// Without optimisation or symbols: a third less to compile, and the
	// server's hot paths are assembly anyway.
	cmd := exec.Command("go", "install", "-trimpath", "-ldflags=-s -w", "-gcflags=all=-N -l", Module)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go install %s: %v\n%s", Module, err, out)
	}
	return os.Rename(filepath.Join(tmp, "minio"), bin)
}

// Server is one MinIO process on loopback with a data directory of its
// own.
type Server struct {
	// Endpoint is http://127.0.0.1:port.
	Endpoint string
	bin      string
	addr     string
	data     string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Start builds (if needed) and starts a server; Stop ends it and removes
// its data.
func Start() (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, &buildError{err}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, addr: l.Addr().String()}
	l.Close()
	s.Endpoint = "http://" + s.addr
	if s.data, err = os.MkdirTemp("", "drivesync-minio-"); err != nil {
		return nil, err
	}
	if err := s.Run(); err != nil {
		os.RemoveAll(s.data)
		return nil, err
	}
	return s, nil
}

// buildError is a server that could not be built (as opposed to one that
// would not start).
type buildError struct{ err error }

func (e *buildError) Error() string {
	return "cannot build the MinIO server the S3 tests need: " + e.err.Error()
}

// ForTest starts a server for t and stops it when t ends. If the server
// cannot be built, t is skipped with the reason, or fails when
// DRIVESYNC_REQUIRE_S3 is set.
func ForTest(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	switch {
	case Skippable(err):
		t.Skip(err)
	case err != nil:
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Skippable says whether Start's error lets the S3 tests skip: the server
// could not be built, and DRIVESYNC_REQUIRE_S3 (CI) is not set.
func Skippable(err error) bool {
	var be *buildError
	return errors.As(err, &be) && os.Getenv("DRIVESYNC_REQUIRE_S3") == ""
}

// Run starts the server process (again, after Kill) on its address and
// data, and waits until it answers.
func (s *Server) Run() error {
	cmd := exec.Command(s.bin, "server", s.data, "--address", s.addr, "--console-address", "127.0.0.1:0", "--quiet")
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+AccessKey, "MINIO_ROOT_PASSWORD="+SecretKey, "MINIO_BROWSER=off")
	if err := cmd.Start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	// Alive is not ready: a restarted server answers its health check
	// before its storage is up, and refuses requests meanwhile
	// (XMinioServerNotInitialized). It is ready once it lists buckets.
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := s.Client(nil).ListBuckets(ctx, &s3.ListBucketsInput{})
		cancel()
		if err == nil {
			return nil
		}
	}
	s.Kill()
	return fmt.Errorf("MinIO gave no answer on %s", s.addr)
}

// Kill stops the server process at once, keeping its data.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		cmd.Process.Kill()
		cmd.Wait()
	}
}

// Stop kills the server and removes its data.
func (s *Server) Stop() {
	s.Kill()
	os.RemoveAll(s.data)
}

// Client returns a client of the server, path-style, with the root
// credentials. transport, if not nil, carries its requests (a fault
// injector, say).
func (s *Server) Client(transport http.RoundTripper) *s3.Client {
	return ClientAt(s.Endpoint, transport)
}

// ClientAt returns a client of the S3 server at endpoint (a proxy in front
// of one, say), with the root credentials.
func ClientAt(endpoint string, transport http.RoundTripper) *s3.Client {
	o := s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	}
	if transport != nil {
		o.HTTPClient = &http.Client{Transport: transport}
	}
	return s3.New(o)
}

var buckets atomic.Int64

// Bucket creates a bucket with a name no other call of this process
// uses.
func (s *Server) Bucket(ctx context.Context) (string, error) {
	name := strings.ToLower(fmt.Sprintf("t%d-%d", time.Now().UnixNano(), buckets.Add(1)))
	if _, err := s.Client(nil).CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &name}); err != nil {
		return "", err
	}
	return name, nil
}
