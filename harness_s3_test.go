package drivesync_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/uuid"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/internal/miniotest"
	"github.com/drivesync/drivesync/s3remote"
)

var s3Schedules = flag.Int("s3-schedules", 0, "randomized schedules for TestSchedulesOverS3, in batches of 100 (0: 100, or none under -race)")

// TestSchedulesOverS3 runs the reliability harness's schedules with every
// device on its own s3remote.Remote, each store under a prefix of one
// bucket of a real MinIO server, whose requests a transport of the test
// fails: throttled, cut before the server sees them, cut after the server
// applied them (the response lost), and outages that outlast the retries.
func TestSchedulesOverS3(t *testing.T) {
	server := miniotest.ForTest(t)
	bucket, err := server.Bucket(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var outer []string // prefixes of stores that others are nested in
	drivesync.RunSchedulesOver(t, *s3Schedules, &drivesync.HarnessBackend{
		Name: "S3",
		NewStore: func() (drivesync.HarnessStore, error) {
			// A third of the stores hold others under their prefix (as a
			// bucket's root store holds the stores of its prefixes), and
			// half of the rest sit under one of those: the outer store's
			// devices list the inner stores' files, and must leave them be.
			mu.Lock()
			prefix := uuid.NewString()
			switch n := rand.IntN(6); {
			case n < 2:
				outer = append(outer, prefix)
			case n < 4 && len(outer) > 0:
				prefix = outer[rand.IntN(len(outer))] + "/" + prefix
				drivesync.CountHarness("schedules over S3 in another store's prefix")
			}
			mu.Unlock()
			s := &s3Store{endpoint: server.Endpoint, bucket: bucket, prefix: prefix}
			return s, s.putForeign()
		},
	})
}

// putForeign puts keys that are not the engine's in the store, as other
// tools do: a key with a control character, the litter of desktop sync
// clients, a file in a day folder, another store's marker deeper down.
func (s *s3Store) putForeign() error {
	client := miniotest.ClientAt(s.endpoint, nil)
	for _, key := range []string{"notes\x01.txt", ".DS_Store", "Thumbs.db", "2026/01/01/readme.txt", "archive/drivesync.json"} {
		_, err := client.PutObject(context.Background(), &s3.PutObjectInput{
			Bucket: &s.bucket, Key: aws.String(s.prefix + "/" + key), Body: strings.NewReader("not the engine's"),
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// s3Store is one schedule's store: a prefix of the bucket, and the
// faults queued for its devices' requests.
type s3Store struct {
	endpoint, bucket, prefix string

	mu     sync.Mutex
	faults []s3Fault
}

// s3Fault fails the next times requests of method (any, if empty).
type s3Fault struct {
	kind   string
	method string
	times  int
}

func (s *s3Store) Open() (drivesync.Remote, error) {
	client := miniotest.ClientAt(s.endpoint, s)
	return s3remote.New(context.Background(), client, s.bucket, s3remote.Options{
		Prefix: s.prefix, MinSleep: time.Millisecond, MaxSleep: 4 * time.Millisecond, MaxAttempts: 4,
	})
}

// The faults a step may queue. An outage of six requests outlasts the
// remote's four attempts; the others are retried within them.
var s3Faults = []s3Fault{
	{kind: "s3 503 SlowDown", times: 2},
	{kind: "s3 500 InternalError", times: 1},
	{kind: "s3 connection reset before the server", times: 1},
	{kind: "s3 PUT applied, response lost", method: http.MethodPut, times: 1},
	{kind: "s3 DELETE applied, response lost", method: http.MethodDelete, times: 1},
	{kind: "s3 GET cut mid-body", method: http.MethodGet, times: 1},
	{kind: "s3 GET of a file refused (400, as an SSE-C object is)", method: http.MethodGet, times: 1},
	{kind: "s3 outage", times: 6},
}

func (s *s3Store) Fault(rng *rand.Rand) string {
	if rng.Float64() >= 0.3 {
		return ""
	}
	f := s3Faults[rng.IntN(len(s3Faults))]
	s.mu.Lock()
	s.faults = append(s.faults, f)
	s.mu.Unlock()
	return f.kind
}

func (s *s3Store) ClearFaults() {
	s.mu.Lock()
	s.faults = nil
	s.mu.Unlock()
}

// take returns the fault this request meets, if any.
func (s *s3Store) take(req *http.Request) (s3Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.faults {
		f := &s.faults[i]
		if f.method != "" && f.method != req.Method {
			continue
		}
		if strings.HasPrefix(f.kind, "s3 GET of a file refused") && !strings.Contains(req.URL.Path, ".json.gz") {
			continue // files only: the marker refused is a store refused
		}
		taken := *f
		if f.times--; f.times == 0 {
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
		}
		return taken, true
	}
	return s3Fault{}, false
}

var errReset = fmt.Errorf("injected: %w", syscall.ECONNRESET)

// RoundTrip sends req to the server, or fails it as a queued fault says.
func (s *s3Store) RoundTrip(req *http.Request) (*http.Response, error) {
	f, ok := s.take(req)
	if !ok {
		return http.DefaultTransport.RoundTrip(req)
	}
	reply := func(status int, code string) (*http.Response, error) {
		if req.Body != nil {
			req.Body.Close()
		}
		body := `<?xml version="1.0" encoding="UTF-8"?><Error><Code>` + code + `</Code><Message>injected</Message></Error>`
		return &http.Response{
			StatusCode: status, Status: fmt.Sprintf("%d %s", status, http.StatusText(status)),
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Content-Type": {"application/xml"}, "Date": {time.Now().UTC().Format(http.TimeFormat)}},
			Body:          io.NopCloser(strings.NewReader(body)),
			ContentLength: int64(len(body)),
			Request:       req,
		}, nil
	}
	switch f.kind {
	case "s3 503 SlowDown":
		return reply(http.StatusServiceUnavailable, "SlowDown")
	case "s3 500 InternalError":
		return reply(http.StatusInternalServerError, "InternalError")
	case "s3 GET of a file refused (400, as an SSE-C object is)":
		return reply(http.StatusBadRequest, "InvalidRequest")
	case "s3 PUT applied, response lost", "s3 DELETE applied, response lost":
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return nil, errReset
	case "s3 GET cut mid-body":
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		resp.Body = &cutBody{r: resp.Body, left: resp.ContentLength / 2}
		return resp, nil
	}
	// A reset before the server, and an outage.
	if req.Body != nil {
		req.Body.Close()
	}
	return nil, errReset
}

// cutBody ends a response body with a connection reset after left bytes.
type cutBody struct {
	r    io.ReadCloser
	left int64
}

func (c *cutBody) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, errReset
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *cutBody) Close() error { return c.r.Close() }
