package drivesync_test

import (
	"context"
	"flag"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/uuid"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/httpremote"
	"github.com/drivesync/drivesync/internal/pgtest"
	"github.com/drivesync/drivesync/syncserver"
)

var serverSchedules = flag.Int("server-schedules", 0, "randomized schedules for TestSchedulesOverServer, in batches of 100 (0: 100, or none under -race)")

// TestSchedulesOverServer runs the reliability harness's schedules with
// every device syncing through a sync server on loopback, over
// PostgreSQL, each schedule in a store of its own. A transport of the
// test fails the devices' requests: 503s, cut before the server sees
// them, cut after the server applied them (the response lost), outages
// that outlast the retries; pulls come in small pages.
func TestSchedulesOverServer(t *testing.T) {
	st, err := syncserver.Open(context.Background(), pgtest.Fresh(t))
	if err != nil {
		t.Fatal(err)
	}
	// The schedules run in parallel subtests, after this function returns.
	t.Cleanup(func() { st.Close() })
	tokens := map[string]string{serverToken: "harness"}
	srv := httptest.NewServer(syncserver.NewHandler(st, syncserver.Options{Tokens: tokens}))
	t.Cleanup(srv.Close)
	// A server with small limits on a write and a push, for the
	// schedules with small limits: records merge past the write limit
	// (a pull sends them in parts), and a sync's changes take several
	// pushes.
	// Its limit on a file (an encrypted store's) is just above a patch
	// file's largest: a store whose state outgrows it has its month's
	// snapshot refused, which waits for the next month.
	small := httptest.NewServer(syncserver.NewHandler(st, syncserver.Options{Tokens: tokens, MaxRecordBytes: 1024, MaxBodyBytes: 16 << 10, MaxFileBytes: 1900}))
	t.Cleanup(small.Close)
	drivesync.RunSchedulesOver(t, *serverSchedules, &drivesync.HarnessBackend{
		Name: "a sync server",
		NewStore: func() (drivesync.HarnessStore, error) {
			return &serverStore{url: srv.URL, small: small.URL, name: uuid.NewString(), pageSize: 1 + rand.IntN(40)}, nil
		},
	})
}

const serverToken = "harness-token-0123456789"

// serverStore is one schedule's store on the server, and the faults
// queued for its devices' requests.
type serverStore struct {
	url, small, name string
	pageSize         int

	mu     sync.Mutex
	faults []serverFault
}

type serverFault struct {
	kind   string
	method string
	times  int
}

func (s *serverStore) SmallLimits() { s.url = s.small }

// Open returns a device's Remote on the store's files, for a schedule of
// an encrypted store.
func (s *serverStore) Open() (drivesync.Remote, error) {
	return httpremote.New(s.url, serverToken, httpremote.Options{
		Store: s.name, HTTPClient: &http.Client{Transport: s},
		MinSleep: time.Millisecond, MaxSleep: 4 * time.Millisecond, MaxAttempts: 4,
	}).Files(), nil
}

func (s *serverStore) OpenServer() (drivesync.Server, error) {
	return httpremote.New(s.url, serverToken, httpremote.Options{
		Store: s.name, PageSize: s.pageSize, HTTPClient: &http.Client{Transport: s},
		MinSleep: time.Millisecond, MaxSleep: 4 * time.Millisecond, MaxAttempts: 4,
	}), nil
}

// The faults a step may queue. An outage of six requests outlasts the
// client's four attempts; the others are retried within them.
var serverFaults = []serverFault{
	{kind: "server 503", times: 2},
	{kind: "server connection reset before the server", times: 1},
	{kind: "server push applied, response lost", method: http.MethodPost, times: 1}, // a push, or a file's PUT or DELETE
	{kind: "server pull answered, response lost", method: http.MethodGet, times: 1},
	{kind: "server outage", times: 6},
	{kind: "server file upload cut mid-body", method: http.MethodPut, times: 1}, // an encrypted store's files
}

func (s *serverStore) Fault(rng *rand.Rand) string {
	if rng.Float64() >= 0.3 {
		return ""
	}
	f := serverFaults[rng.IntN(len(serverFaults))]
	s.mu.Lock()
	s.faults = append(s.faults, f)
	s.mu.Unlock()
	return f.kind
}

func (s *serverStore) ClearFaults() {
	s.mu.Lock()
	s.faults = nil
	s.mu.Unlock()
}

// take returns the kind of the first queued fault for a request of
// method, using it up once.
func (s *serverStore) take(method string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.faults {
		f := &s.faults[i]
		if f.method != "" && f.method != method && !(f.method == http.MethodPost && (method == http.MethodPut || method == http.MethodDelete)) {
			continue
		}
		kind := f.kind
		if f.times--; f.times == 0 {
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
		}
		return kind
	}
	return ""
}

func (s *serverStore) RoundTrip(req *http.Request) (*http.Response, error) {
	switch s.take(req.Method) {
	case "server 503", "server outage":
		if req.Body != nil {
			req.Body.Close()
		}
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"application/problem+json"}},
			Body: io.NopCloser(strings.NewReader(`{"type":"urn:drivesync:problem:unavailable","title":"Unavailable","status":503,"detail":"injected"}`)), Request: req}, nil
	case "server connection reset before the server":
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, syscall.ECONNRESET
	case "server file upload cut mid-body":
		// Half the body, then the connection fails: the server must not
		// keep the half as the file.
		if half := req.ContentLength / 2; req.Body != nil && half > 0 {
			req.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(io.LimitReader(req.Body, half), iotest.ErrReader(syscall.ECONNRESET)), req.Body}
		}
		return http.DefaultTransport.RoundTrip(req)
	case "server push applied, response lost", "server pull answered, response lost":
		res, err := http.DefaultTransport.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		return nil, syscall.ECONNRESET
	}
	return http.DefaultTransport.RoundTrip(req)
}
