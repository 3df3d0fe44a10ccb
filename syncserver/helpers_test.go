package syncserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/openapicheck"
	"github.com/drivesync/drivesync/internal/pgtest"
)

// storeSpec returns the spec of a fresh store of kind.
func storeSpec(t testing.TB, kind string) string { return pgtest.Spec(t, kind) }

func openStore(t testing.TB, spec string) *Store {
	st, err := Open(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// eachStore runs fn as a subtest for every store kind.
func eachStore(t *testing.T, fn func(t *testing.T, spec string)) {
	for _, kind := range pgtest.Kinds {
		t.Run(kind, func(t *testing.T) { fn(t, storeSpec(t, kind)) })
	}
}

// Tokens of the tests' users.
const (
	aliceToken = "alice-token-0123456789"
	bobToken   = "bob-token-0123456789ab"
)

// testServer is a Handler on a store, served on loopback, with the log
// lines it wrote.
type testServer struct {
	*httptest.Server
	st  *Store
	log *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newServer(t testing.TB, spec string, edit ...func(*Options)) *testServer {
	st := openStore(t, spec)
	buf := &syncBuffer{}
	opts := Options{
		Tokens: map[string]string{aliceToken: "alice", bobToken: "bob"},
		Logger: slog.New(slog.NewJSONHandler(buf, nil)),
	}
	for _, e := range edit {
		e(&opts)
	}
	ts := &testServer{Server: httptest.NewServer(openapicheck.For(t, "openapi.json").Handler(t, NewHandler(st, opts))), st: st, log: buf}
	t.Cleanup(ts.Close)
	return ts
}

// response is what a request got.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response %d is not JSON: %v\n%s", r.status, err, r.body)
	}
	return m
}

func do(t testing.TB, method, u, token string, body string, header ...string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

func (ts *testServer) push(t testing.TB, token, store, key, body string) response {
	t.Helper()
	var h []string
	if key != "" {
		h = []string{"Idempotency-Key", key}
	}
	return do(t, "POST", ts.URL+"/sync/push?store="+url.QueryEscape(store), token, body, h...)
}

func (ts *testServer) pull(t testing.TB, token, query string) response {
	t.Helper()
	return do(t, "GET", ts.URL+"/sync/pull?"+query, token, "")
}

// pullAll pulls every page after since and returns the rows by table and
// id (the last row of each id) and the final server_time.
func pullAll(t testing.TB, base, token, store, since, view string) (map[string]map[string]map[string]any, string) {
	t.Helper()
	rows := map[string]map[string]map[string]any{}
	for {
		q := url.Values{"store": {store}, "limit": {"7"}, "view": {view}}
		if since != "" {
			q.Set("since", since)
		}
		r := do(t, "GET", base+"/sync/pull?"+q.Encode(), token, "")
		if r.status != 200 {
			t.Fatalf("pull: %d %s", r.status, r.body)
		}
		m := r.json(t)
		for table, list := range m["changes"].(map[string]any) {
			if rows[table] == nil {
				rows[table] = map[string]map[string]any{}
			}
			for _, row := range list.([]any) {
				row := row.(map[string]any)
				rows[table][row["id"].(string)] = row
			}
		}
		if m["nextCursor"] == nil {
			return rows, m["server_time"].(string)
		}
		since = m["nextCursor"].(string)
	}
}

// checkTimes checks that every member of v named like a time holds an
// RFC 3339 UTC time.
func checkTimes(t testing.TB, v any, path string) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (strings.HasSuffix(k, "_at") || k == "server_time" || k == "nextCursor") {
				if _, err := time.Parse(time.RFC3339Nano, s); err != nil || !strings.HasSuffix(s, "Z") {
					t.Errorf("%s.%s = %q: not an RFC 3339 UTC time", path, k, s)
				}
			}
			checkTimes(t, x, path+"."+k)
		}
	case []any:
		for i, x := range v {
			checkTimes(t, x, fmt.Sprintf("%s[%d]", path, i))
		}
	}
}
