// Package httpremote lets a drivesync Engine sync through a sync server
// (drivesync-server, package syncserver) instead of a storage Remote:
//
//	srv := httpremote.New("https://sync.example.com", token, httpremote.Options{Store: "notes"})
//	eng, err := drivesync.Open(ctx, db, drivesync.Config{Server: srv, Tables: tables})
//
// A sync then pushes this device's changes in one request and pulls, page
// by page, the merged records changed since its last pull. Requests that
// fail for a moment (the network, a 5xx, a 429) are retried with backoff;
// a push is retried with the same Idempotency-Key, so the server applies
// it once. A token the server refuses fails the call with an error
// matching drivesync.ErrAuth.
package httpremote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/pacer"
)

// Options configure a Client. The zero value works.
type Options struct {
	// Store is the name of the store on the server (default "default").
	// Each user's stores are their own: two users' stores of one name
	// are two stores.
	Store string
	// HTTPClient makes the requests (default: one with a 2-minute
	// timeout per request).
	HTTPClient *http.Client
	// PageSize is the number of records a pull asks for at a time
	// (default 500, at most 1000).
	PageSize int
	// MinSleep, MaxSleep and MaxAttempts bound the retries of a request
	// (defaults 100ms, 10s, 6).
	MinSleep, MaxSleep time.Duration
	MaxAttempts        int
}

// A Client reaches one store on a sync server. It implements
// drivesync.Server and is safe for concurrent use.
type Client struct {
	base  *url.URL
	token string
	opts  Options
	http  *http.Client
	files *http.Client // for files: see New
	pace  *pacer.Pacer
	err   error // a bad base URL, reported by every call
}

var _ drivesync.Server = (*Client)(nil)

// New returns a Client for the server at baseURL (such as
// "https://sync.example.com" or "http://127.0.0.1:8080"), signing in with
// token, one of the server's tokens.
func New(baseURL, token string, opts Options) *Client {
	if opts.Store == "" {
		opts.Store = "default"
	}
	if opts.PageSize <= 0 || opts.PageSize > 1000 {
		opts.PageSize = 500
	}
	if opts.MinSleep <= 0 {
		opts.MinSleep = 100 * time.Millisecond
	}
	if opts.MaxSleep <= 0 {
		opts.MaxSleep = 10 * time.Second
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 6
	}
	c := &Client{token: token, opts: opts, http: opts.HTTPClient, files: opts.HTTPClient, pace: pacer.New(opts.MinSleep, opts.MaxSleep, opts.MaxAttempts)}
	if c.http == nil {
		c.http = &http.Client{Timeout: 2 * time.Minute}
		// A file may be a snapshot of gigabytes: no bound on a whole
		// exchange, but on the wait for the server's answer.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.ResponseHeaderTimeout = 2 * time.Minute
		c.files = &http.Client{Transport: t}
	}
	u, err := url.Parse(strings.TrimSuffix(baseURL, "/"))
	switch {
	case err != nil:
		c.err = fmt.Errorf("httpremote: server URL %q: %w", baseURL, err)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		c.err = fmt.Errorf("httpremote: server URL %q: want http://host[:port] or https://host[:port]", baseURL)
	case token == "":
		c.err = errors.New("httpremote: no token: use one of the server's tokens")
	}
	c.base = u
	return c
}

// Identity names the server and store, for the engine's status: the URL
// and the store's name, never the token.
func (c *Client) Identity() string {
	if c.base == nil {
		return ""
	}
	return c.base.String() + "#" + c.opts.Store
}

// Push sends a batch of writes in one request:
//
//	{"ops": {"<table>": [{"op": "upsert", "id": "<id>", "drivesync": {...}}, ...],
//	         "deletions": [{"table": "<table>", "id": "<id>", "drivesync": {...}}]}}
func (c *Client) Push(ctx context.Context, b *drivesync.PushBatch) (*drivesync.PushResult, error) {
	if c.err != nil {
		return nil, c.err
	}
	body := encodePush(b.Writes)
	q := url.Values{"store": {c.opts.Store}}
	if b.StoreID != "" {
		q.Set("store_id", b.StoreID)
	}
	var res struct {
		OK       bool   `json:"ok"`
		Store    string `json:"store"`
		Previous string `json:"previous_time"`
		Cursor   string `json:"cursor"`
	}
	// The key the server sees is the batch's key and its body hashed: a
	// key names one body, so no push of the engine is ever refused as a
	// key reused, even from two databases that share a device id.
	key := ""
	if b.Key != "" {
		sum := sha256.Sum256(append([]byte(b.Key+"\x00"), body...))
		key = "drivesync-" + hex.EncodeToString(sum[:20])
	}
	err := c.call(ctx, "POST", "/sync/push", q, body, key, &res)
	if err != nil {
		return nil, err
	}
	if !res.OK || res.Store == "" {
		return nil, fmt.Errorf("httpremote: the server's push response names no store")
	}
	return &drivesync.PushResult{StoreID: res.Store, Cursor: followOn(b.Cursor, res.Previous, res.Cursor)}, nil
}

// followOn returns where the next pull starts after a push that the store
// wrote after its clock read previous up to cursor, for a device whose
// pulls reached from: cursor, if nothing but the push's writes lies
// between; "" if other writes may (or a time does not parse: a server
// that does not say).
func followOn(from, previous, cursor string) string {
	f, errF := time.Parse(time.RFC3339Nano, from)
	p, errP := time.Parse(time.RFC3339Nano, previous)
	c, errC := time.Parse(time.RFC3339Nano, cursor)
	switch {
	case errF != nil || errP != nil || errC != nil || f.Before(p):
		return ""
	case f.After(c):
		return from // already past the push
	}
	return cursor
}

// encodePush writes the body of a push, grouping the writes by table in
// the order each table first appears.
func encodePush(writes []drivesync.ServerWrite) []byte {
	var tables []string
	byTable := map[string][]int{}
	var dels []int
	for i, w := range writes {
		if w.Deleted && w.Clock == nil {
			dels = append(dels, i)
			continue
		}
		if _, ok := byTable[w.Table]; !ok {
			tables = append(tables, w.Table)
		}
		byTable[w.Table] = append(byTable[w.Table], i)
	}
	b := []byte(`{"ops":{`)
	for ti, t := range tables {
		if ti > 0 {
			b = append(b, ',')
		}
		b = jsonv.AppendString(b, t)
		b = append(b, ":["...)
		for j, i := range byTable[t] {
			if j > 0 {
				b = append(b, ',')
			}
			w := writes[i]
			b = append(b, `{"op":"upsert","id":`...)
			b = jsonv.AppendString(b, w.Record)
			if w.Clock != nil {
				b = append(b, `,"drivesync":{"state":{"data":`...)
				b = append(b, w.Patch...)
				b = append(b, `,"clock":`...)
				b = append(b, w.Clock...)
				b = append(b, `,"deleted":`...)
				b = strconv.AppendBool(b, w.Deleted)
				b = append(b, "}}}"...)
				continue
			}
			b = appendStamp(append(b, `,"drivesync":{`...), w.Version, w.Device)
			b = append(b, `,"patch":`...)
			b = append(b, w.Patch...)
			if len(w.Seen) > 0 {
				b = append(b, `,"seen":`...)
				b = append(b, w.Seen...)
			}
			if w.Replaces {
				b = append(b, `,"replaces":true,"reset":{`...)
				b = appendStamp(b, w.ResetVersion, w.ResetDevice)
				b = append(b, '}')
			}
			b = append(b, "}}"...)
		}
		b = append(b, ']')
	}
	if len(dels) > 0 {
		if len(tables) > 0 {
			b = append(b, ',')
		}
		b = append(b, `"deletions":[`...)
		for j, i := range dels {
			if j > 0 {
				b = append(b, ',')
			}
			w := writes[i]
			b = append(b, `{"table":`...)
			b = jsonv.AppendString(b, w.Table)
			b = append(b, `,"id":`...)
			b = jsonv.AppendString(b, w.Record)
			b = appendStamp(append(b, `,"drivesync":{`...), w.Version, w.Device)
			b = append(b, "}}"...)
		}
		b = append(b, ']')
	}
	return append(b, "}}"...)
}

func appendStamp(b []byte, version int64, device string) []byte {
	b = append(b, `"version":`...)
	b = strconv.AppendInt(b, version, 10)
	b = append(b, `,"device":`...)
	return jsonv.AppendString(b, device)
}

// Pull asks for one page of the records written after cursor.
func (c *Client) Pull(ctx context.Context, storeID, cursor string) (*drivesync.PullPage, error) {
	if c.err != nil {
		return nil, c.err
	}
	q := url.Values{"store": {c.opts.Store}, "limit": {strconv.Itoa(c.opts.PageSize)}, "view": {"drivesync"}}
	if storeID != "" {
		q.Set("store_id", storeID)
	}
	if cursor != "" {
		q.Set("since", cursor)
	}
	var res struct {
		Changes map[string][]struct {
			ID        string `json:"id"`
			Drivesync *struct {
				Data    json.RawMessage `json:"data"`
				Clock   json.RawMessage `json:"clock"`
				Deleted bool            `json:"deleted"`
				Seen    json.RawMessage `json:"seen"`
			} `json:"drivesync"`
		} `json:"changes"`
		NextCursor *string `json:"nextCursor"`
		ServerTime string  `json:"server_time"`
		Store      *string `json:"store"`
		Limits     struct {
			MaxRecordBytes int64 `json:"max_record_bytes"`
			MaxBodyBytes   int64 `json:"max_body_bytes"`
		} `json:"limits"`
		Features []string `json:"features"`
	}
	if err := c.call(ctx, "GET", "/sync/pull", q, nil, "", &res); err != nil {
		return nil, err
	}
	p := &drivesync.PullPage{Cursor: res.ServerTime, MaxRecordSize: res.Limits.MaxRecordBytes, MaxBodySize: res.Limits.MaxBodyBytes,
		Seen: slices.Contains(res.Features, "seen")}
	if res.Store != nil {
		p.StoreID = *res.Store
	}
	if res.NextCursor != nil {
		p.Cursor, p.More = *res.NextCursor, true
	}
	for table, rows := range res.Changes {
		for _, r := range rows {
			if r.Drivesync == nil {
				return nil, fmt.Errorf("httpremote: the server sent %s/%s without its state: it does not speak view=drivesync", table, r.ID)
			}
			p.Records = append(p.Records, drivesync.ServerRecord{Table: table, Record: r.ID, Data: r.Drivesync.Data, Clock: r.Drivesync.Clock, Deleted: r.Drivesync.Deleted, Seen: r.Drivesync.Seen})
		}
	}
	return p, nil
}

// A problem is the server's Problem Details for a failed request.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// A statusError is a request the server answered with an error.
type statusError struct {
	status int
	p      problem
	after  time.Duration // Retry-After
	err    error         // what the engine should match
}

func (e *statusError) Error() string {
	msg := e.p.Detail
	if msg == "" {
		msg = http.StatusText(e.status)
	}
	if e.err != nil {
		return fmt.Sprintf("%v: server: %s (%d)", e.err, msg, e.status)
	}
	return fmt.Sprintf("server: %s (%d)", msg, e.status)
}

func (e *statusError) Unwrap() error { return e.err }

// call sends a request, retrying what may pass, and decodes the JSON
// answer into out.
func (c *Client) call(ctx context.Context, method, path string, q url.Values, body []byte, key string, out any) error {
	var rd *io.SectionReader
	if body != nil {
		rd = io.NewSectionReader(bytes.NewReader(body), 0, int64(len(body)))
	}
	return c.pace.Call(ctx, func() error {
		res, err := c.send(ctx, method, path, q, rd, "application/json", key)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, out); err != nil {
			return &statusError{status: res.StatusCode, p: problem{Detail: "unreadable response: " + err.Error()}}
		}
		return nil
	}, retryable)
}

// send makes one attempt at a request with body (if any), and returns the
// server's 200 answer for the caller to read and close, or the error of
// any other.
func (c *Client) send(ctx context.Context, method, path string, q url.Values, body *io.SectionReader, contentType, key string) (*http.Response, error) {
	return c.sendWith(ctx, c.http, method, path, q, body, contentType, key)
}

func (c *Client) sendWith(ctx context.Context, client *http.Client, method, path string, q url.Values, body *io.SectionReader, contentType, key string) (*http.Response, error) {
	u := *c.base
	u.Path += path
	u.RawQuery = q.Encode()
	var rd io.Reader
	var size int64
	if body != nil {
		// Each attempt reads a reader of its own: the transport may
		// still be reading an earlier attempt's body after it failed.
		size = body.Size()
		rd = &bodyReader{r: io.NewSectionReader(body, 0, size)} // not a Closer: the body is the caller's
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		// Sent with its length: a server tells a body cut short from
		// its end.
		req.ContentLength = size
		if size == 0 {
			req.Body = http.NoBody
		}
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := client.Do(req)
	if err != nil {
		if br, ok := rd.(*bodyReader); ok && br.err != nil {
			return nil, &bodyError{br.err}
		}
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		defer res.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		return nil, classifyStatus(res, b)
	}
	return res, nil
}

// bodyReader reads a request's body, keeping the error of the caller's
// reader: a request that failed for it is not the network's failure.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// A bodyError is a request that failed because its body could not be
// read: sending it again would fail again.
type bodyError struct{ err error }

func (e *bodyError) Error() string { return "httpremote: reading the request's body: " + e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

func classifyStatus(res *http.Response, b []byte) error {
	e := &statusError{status: res.StatusCode}
	json.Unmarshal(b, &e.p)
	if s, err := strconv.Atoi(res.Header.Get("Retry-After")); err == nil && s > 0 {
		e.after = time.Duration(s) * time.Second
	}
	switch {
	case res.StatusCode == http.StatusUnauthorized:
		e.err = fmt.Errorf("%w: the sync server refused the token; use one from the server's tokens file", drivesync.ErrAuth)
	case res.StatusCode == http.StatusForbidden:
		e.err = fmt.Errorf("%w: the token's user may not use this store; use the token of the user whose store it is", drivesync.ErrAuth)
	case e.p.Type == "urn:drivesync:problem:store-replaced":
		e.err = drivesync.ErrRemoteChanged
	case e.p.Type == "urn:drivesync:problem:stamp-reused":
		e.err = drivesync.ErrDeviceIDShared
	case e.p.Type == "urn:drivesync:problem:files-store" || e.p.Type == "urn:drivesync:problem:records-store":
		// An encrypted store synced without a key, or a store synced
		// without one (whose records the server reads) synced with one.
		e.err = drivesync.ErrWrongKey
	case e.p.Type == "urn:drivesync:problem:file-too-large":
		e.err = drivesync.ErrFileTooLarge
	case e.p.Type == "urn:drivesync:problem:file-exists":
		e.err = fs.ErrExist
	case e.p.Type == "urn:drivesync:problem:no-file":
		e.err = fs.ErrNotExist
	case res.Request != nil && res.Request.Method == http.MethodPost &&
		(res.StatusCode == http.StatusBadRequest || res.StatusCode == http.StatusRequestEntityTooLarge || res.StatusCode == http.StatusUnprocessableEntity):
		e.err = drivesync.ErrServerRefused
	}
	return e
}

// retryable says which failures may pass: the network, the server's
// 5xx and 429.
func retryable(err error) pacer.Retry {
	var se *statusError
	var be *bodyError
	if errors.As(err, &be) {
		return pacer.Retry{}
	}
	if errors.As(err, &se) {
		return pacer.Retry{Again: se.status >= 500 || se.status == http.StatusTooManyRequests, After: se.after}
	}
	return pacer.Retry{Again: true} // the network: the request may not have arrived
}
