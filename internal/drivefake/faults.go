package drivefake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
)

// A Fault makes the server answer matching requests with an error instead of
// serving them. Queue faults with Server.Fail.
type Fault struct {
	// Method and PathPrefix select the requests the fault applies to; an
	// empty field matches anything. PathPrefix is matched against the
	// URL path, e.g. "/drive/v3/files", "/drive/v3/about" or
	// "/upload/drive/v3/files".
	Method, PathPrefix string

	// Status is the HTTP status to answer with, e.g. 403, 429, 500, 503
	// or 401; 0 means 503. The request is not carried out.
	//
	// The client does not retry failed calls by itself, with one
	// exception: it retries the chunks of a resumable upload that get a
	// 429 or 5xx, with backoff.
	Status int

	// Reason is Drive's error reason, Errors[0].Reason in the
	// *googleapi.Error the client returns, e.g. "userRateLimitExceeded",
	// "rateLimitExceeded" or "storageQuotaExceeded". Empty picks the
	// reason Drive gives for Status: "authError" for 401, "forbidden" for
	// 403, "rateLimitExceeded" for 429 and "backendError" for 5xx.
	Reason string

	// RetryAfter, if not empty, is sent as the Retry-After header.
	RetryAfter string

	// Times is the number of matching requests the fault applies to; 0
	// means 1.
	Times int

	// ResetMidBody makes the server carry out the request as usual, send
	// the status line, the headers (with the full Content-Length) and the
	// first half of the body, then close the connection: a connection
	// reset in the middle of a download, or a write that happened although
	// the client saw it fail. Status and Reason are ignored. A response
	// without a body is cut before anything is sent.
	ResetMidBody bool
}

// Fail queues faults. Each incoming request is checked against the queue in
// order; the first fault that matches it is applied to it and used up once
// it has applied Times times.
func (s *Server) Fail(faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range faults {
		f.Times = max(f.Times, 1)
		s.faults = append(s.faults, f)
	}
}

// ClearFaults drops the faults still queued.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// takeFaultLocked returns, and uses up one application of, the first queued
// fault that matches r. s.mu must be held.
func (s *Server) takeFaultLocked(r *http.Request) (Fault, bool) {
	for i := range s.faults {
		f := &s.faults[i]
		if f.Method != "" && !strings.EqualFold(f.Method, r.Method) {
			continue
		}
		if !strings.HasPrefix(r.URL.Path, f.PathPrefix) {
			continue
		}
		taken := *f
		if f.Times--; f.Times == 0 {
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
		}
		return taken, true
	}
	return Fault{}, false
}

// writeFault answers with the error a fault describes.
func writeFault(w http.ResponseWriter, f Fault) {
	status := f.Status
	if status == 0 {
		status = http.StatusServiceUnavailable
	}
	reason := f.Reason
	if reason == "" {
		reason = defaultReason(status)
	}
	if f.RetryAfter != "" {
		w.Header().Set("Retry-After", f.RetryAfter)
	}
	e := newError(status, reason, "")
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="https://accounts.google.com/", error="invalid_token"`)
		e.Errors[0].LocationType = "header"
		e.Errors[0].Location = "Authorization"
	}
	writeError(w, e)
}

// serveTruncated serves r, then sends only the first half of the response
// body and drops the connection.
func (s *Server) serveTruncated(w http.ResponseWriter, r *http.Request) {
	rec := httptest.NewRecorder()
	s.mux.ServeHTTP(rec, r)
	body := rec.Body.Bytes()

	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.t.Errorf("drivefake: cannot hijack the connection to reset it: %v", err)
		return
	}
	defer conn.Close()
	if len(body) == 0 {
		return
	}
	// Write the response by hand: after a hijack the server no longer does.
	// The header promises the whole body, so the client sees an unexpected
	// EOF once the connection closes.
	h := rec.Header().Clone()
	h.Set("Date", w.Header().Get("Date"))
	h.Set("Content-Length", strconv.Itoa(len(body)))
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\n", rec.Code, http.StatusText(rec.Code))
	h.Write(buf)
	buf.WriteString("\r\n")
	buf.Write(body[:len(body)/2])
	buf.Flush()
}

// An apiError is the "error" member of Drive's JSON error body.
type apiError struct {
	Code    int         `json:"code"`
	Message string      `json:"message"`
	Errors  []errorItem `json:"errors"`
}

type errorItem struct {
	Domain       string `json:"domain"`
	Reason       string `json:"reason"`
	Message      string `json:"message"`
	LocationType string `json:"locationType,omitempty"`
	Location     string `json:"location,omitempty"`
}

// newError builds a Drive error. An empty message picks the one Drive uses
// for the reason.
func newError(status int, reason, message string) *apiError {
	domain := "global"
	switch reason {
	case "userRateLimitExceeded", "rateLimitExceeded", "dailyLimitExceeded", "storageQuotaExceeded":
		domain = "usageLimits"
	}
	if message == "" {
		message = reasonMessages[reason]
	}
	if message == "" {
		message = http.StatusText(status)
	}
	return &apiError{
		Code:    status,
		Message: message,
		Errors:  []errorItem{{Domain: domain, Reason: reason, Message: message}},
	}
}

// at records which request parameter an error is about.
func (e *apiError) at(location string) *apiError {
	e.Errors[0].LocationType = "parameter"
	e.Errors[0].Location = location
	return e
}

var reasonMessages = map[string]string{
	"authError":             "Invalid Credentials",
	"userRateLimitExceeded": "User Rate Limit Exceeded",
	"rateLimitExceeded":     "Rate Limit Exceeded",
	"storageQuotaExceeded":  "The user's Drive storage quota has been exceeded.",
	"backendError":          "Backend Error",
	"internalError":         "Internal Error",
	"invalid":               "Invalid Value",
}

func defaultReason(status int) string {
	switch {
	case status == http.StatusBadRequest:
		return "badRequest"
	case status == http.StatusUnauthorized:
		return "authError"
	case status == http.StatusForbidden:
		return "forbidden"
	case status == http.StatusNotFound:
		return "notFound"
	case status == http.StatusTooManyRequests:
		return "rateLimitExceeded"
	case status >= 500:
		return "backendError"
	}
	return "unknown"
}

// notFound is Drive's answer for a file id it does not know.
func notFound(id string) *apiError {
	return newError(http.StatusNotFound, "notFound", fmt.Sprintf("File not found: %s.", id)).at("fileId")
}

// badRequest is a 400 with reason "badRequest".
func badRequest(format string, args ...any) *apiError {
	return newError(http.StatusBadRequest, "badRequest", fmt.Sprintf(format, args...))
}

// invalid is Drive's answer for a bad parameter value, such as a q it cannot
// parse: 400, reason "invalid", message "Invalid Value".
func invalid(param string) *apiError {
	return newError(http.StatusBadRequest, "invalid", "").at(param)
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Code, struct {
		Error *apiError `json:"error"`
	}{e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		panic(err) // only our own types are encoded
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}
