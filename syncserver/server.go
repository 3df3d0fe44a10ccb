// Package syncserver is drivesync's reference sync server: an HTTP handler
// for the push/pull protocol and the Store it keeps records in, on
// PostgreSQL or SQLite.
//
// Devices running the drivesync engine sync through it with package
// httpremote; any other client (curl, a web or mobile app) can push rows
// and pull changes with plain JSON. The protocol is described by
// openapi.json in this directory:
//
//	POST /sync/push?store=NAME   Idempotency-Key: <key>
//	     {"ops": {"<table>": [{"op": "upsert", "id": "...", ...fields}], "deletions": [...]}}
//	GET  /sync/pull?store=NAME&since=<RFC 3339 time>&limit=500
//	     {"changes": {"<table>": [rows]}, "nextCursor": ..., "server_time": ...}
//	GET  /healthz
//
// A store the devices encrypt keeps files instead, which the server
// cannot read and does not merge (see files.go):
//
//	GET /sync/files?store=NAME, GET|PUT|DELETE /sync/file?store=NAME&name=F, GET /sync/time
//
// The server is the source of truth for time: every write is stamped with
// the server's clock, and a client's cursor is a time the server gave it.
// Records merge last-writer-wins per field, by the drivesync stamps the
// engine sends, or, for a plain client's rows, in the order the server
// receives them.
//
// Server processes keep no state of their own: several may serve one
// PostgreSQL database behind a load balancer.
package syncserver

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Defaults of Options.
const (
	DefaultMaxBodyBytes   = 64 << 20
	DefaultKeyLifetime    = 24 * time.Hour
	DefaultPullLimit      = 500
	MaxPullLimit          = 1000
	DefaultMaxRecordBytes = 4 << 20
	pageBytes             = 4 << 20 // data in one pull page, past its first record
)

// Options configure a Handler.
type Options struct {
	// Tokens maps each bearer token to the user it signs in. Tokens are
	// compared in constant time and never logged.
	Tokens map[string]string
	// Logger receives one JSON line per request, with its trace id. Nil
	// logs to nowhere.
	Logger *slog.Logger
	// MaxBodyBytes bounds a push's body (default DefaultMaxBodyBytes);
	// a larger one is refused with 413.
	MaxBodyBytes int64
	// MaxRecordBytes bounds one write's patch (default
	// DefaultMaxRecordBytes).
	MaxRecordBytes int64
	// MaxFileBytes bounds a file a device writes to a store of files
	// (default DefaultMaxFileBytes); a larger one is refused with 413.
	MaxFileBytes int64
	// KeyLifetime is how long a push's idempotency key is remembered
	// (default 24 hours). A push sent again after that is applied again.
	KeyLifetime time.Duration
	// Now is the server's clock (default time.Now). Tests set it.
	Now func() time.Time
}

// A Handler serves the sync protocol over a Store.
type Handler struct {
	store  *Store
	opts   Options
	tokens []tokenEntry
	log    *slog.Logger
	mux    *http.ServeMux
}

type tokenEntry struct {
	hash [sha256.Size]byte
	user string
}

// NewHandler returns the HTTP handler of the sync protocol over st.
func NewHandler(st *Store, opts Options) *Handler {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.MaxRecordBytes <= 0 {
		opts.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if opts.MaxFileBytes <= 0 {
		opts.MaxFileBytes = DefaultMaxFileBytes
	}
	if opts.KeyLifetime <= 0 {
		opts.KeyLifetime = DefaultKeyLifetime
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	h := &Handler{store: st, opts: opts, log: opts.Logger, mux: http.NewServeMux()}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	for token, user := range opts.Tokens {
		h.tokens = append(h.tokens, tokenEntry{hash: sha256.Sum256([]byte(token)), user: user})
	}
	h.mux.HandleFunc("POST /sync/push", h.authed(h.push))
	h.mux.HandleFunc("GET /sync/pull", h.authed(h.pull))
	h.mux.HandleFunc("GET /sync/files", h.authed(h.listFiles))
	h.mux.HandleFunc("GET /sync/file", h.authed(h.getFile))
	h.mux.HandleFunc("PUT /sync/file", h.authed(h.putFile))
	h.mux.HandleFunc("DELETE /sync/file", h.authed(h.deleteFile))
	h.mux.HandleFunc("GET /sync/time", h.authed(h.serverTime))
	h.mux.HandleFunc("GET /healthz", h.healthz)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		problem(w, r, http.StatusNotFound, "not-found", "No such endpoint",
			fmt.Sprintf("%s %s is not part of the protocol: use POST /sync/push, GET /sync/pull, GET /sync/files, GET, PUT or DELETE /sync/file, GET /sync/time or GET /healthz", r.Method, r.URL.Path))
	})
	return h
}

// partBytes bounds the state of a record in a pull's drivesync view: what
// a device takes of one record at a time (see appendRow).
func (h *Handler) partBytes() int64 { return min(h.opts.MaxRecordBytes, DefaultMaxRecordBytes) }

// ServeHTTP serves one request, with its trace context and a log line.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	tc := parseTraceparent(r.Header.Get("traceparent"))
	w.Header().Set("traceparent", tc.child())
	rec := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	ctx := context.WithValue(r.Context(), traceKey{}, tc)
	ctx = context.WithValue(ctx, infoKey{}, &requestInfo{})
	h.mux.ServeHTTP(rec, r.WithContext(ctx))
	info := ctx.Value(infoKey{}).(*requestInfo)
	attrs := []any{"trace_id", tc.traceID, "method", r.Method, "path", r.URL.Path,
		"status", rec.status, "duration_ms", float64(time.Since(start).Microseconds()) / 1000}
	if info.user != "" {
		attrs = append(attrs, "user", info.user)
	}
	if info.store != "" {
		attrs = append(attrs, "store", info.store)
	}
	if info.err != nil {
		attrs = append(attrs, "error", info.err.Error())
	}
	level := slog.LevelInfo
	if rec.status >= 500 {
		level = slog.LevelError
	}
	h.log.Log(ctx, level, "request", attrs...)
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

type infoKey struct{}

// requestInfo is what the log line of a request says besides the request.
type requestInfo struct {
	user, store string
	err         error
}

func info(r *http.Request) *requestInfo {
	if i, ok := r.Context().Value(infoKey{}).(*requestInfo); ok {
		return i
	}
	return &requestInfo{}
}

// authed admits a request whose bearer token names a user.
func (h *Handler) authed(next func(w http.ResponseWriter, r *http.Request, user string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		token, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="drivesync"`)
			problem(w, r, http.StatusUnauthorized, "unauthorized", "Missing bearer token",
				"send the header Authorization: Bearer <token>, with a token from the server's tokens file")
			return
		}
		user := h.user(token)
		if user == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="drivesync", error="invalid_token"`)
			problem(w, r, http.StatusUnauthorized, "unauthorized", "Unknown token",
				"the bearer token is not in the server's tokens file")
			return
		}
		info(r).user = user
		next(w, r, user)
	}
}

// user returns the user token signs in, or "". It compares the token's
// hash with every entry, so its time does not depend on which one
// matches, or on how much of a wrong token is right.
func (h *Handler) user(token string) string {
	sum := sha256.Sum256([]byte(token))
	user := ""
	for _, e := range h.tokens {
		if subtle.ConstantTimeCompare(sum[:], e.hash[:]) == 1 {
			user = e.user
		}
	}
	return user
}

func (h *Handler) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := h.store.Ping(ctx); err != nil {
		info(r).err = err
		problem(w, r, http.StatusServiceUnavailable, "unavailable", "Database unavailable", "the server cannot reach its database; try again later")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"status":"ok"}` + "\n"))
}

// A trace context, from the W3C traceparent header.
type traceContext struct {
	traceID string // 32 lowercase hex digits
	flags   string // 2 hex digits
}

type traceKey struct{}

// parseTraceparent takes the trace id of a valid traceparent header, or
// starts a new trace.
func parseTraceparent(h string) traceContext {
	parts := strings.Split(strings.TrimSpace(h), "-")
	if len(parts) >= 4 && len(parts[0]) == 2 && parts[0] != "ff" && isHex(parts[0]) &&
		len(parts[1]) == 32 && isHex(parts[1]) && parts[1] != strings.Repeat("0", 32) &&
		len(parts[2]) == 16 && isHex(parts[2]) && parts[2] != strings.Repeat("0", 16) &&
		len(parts[3]) == 2 && isHex(parts[3]) && (parts[0] != "00" || len(parts) == 4) {
		return traceContext{traceID: parts[1], flags: parts[3]}
	}
	return traceContext{traceID: randomHex(16), flags: "01"}
}

// child returns the traceparent of this server's part of the trace.
func (t traceContext) child() string {
	return "00-" + t.traceID + "-" + randomHex(8) + "-" + t.flags
}

func isHex(s string) bool {
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TraceID returns the trace id of the request ctx belongs to, or "".
func TraceID(ctx context.Context) string {
	if tc, ok := ctx.Value(traceKey{}).(traceContext); ok {
		return tc.traceID
	}
	return ""
}

// timeLayout is how every time the server writes looks: RFC 3339 in UTC,
// to the microsecond, which is the precision of its cursors.
const timeLayout = "2006-01-02T15:04:05.000000Z"

func formatMicros(us int64) string { return time.UnixMicro(us).UTC().Format(timeLayout) }

// parseTime reads an RFC 3339 time into microseconds, rounding down: a
// cursor between two microseconds then includes the later one.
func parseTime(s string) (int64, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, errors.New("not an RFC 3339 time such as 2026-01-02T15:04:05Z")
	}
	if t.Year() < 1970 || t.Year() > 9999 {
		return 0, errors.New("out of range (1970-9999)")
	}
	return t.UnixMicro(), nil
}
