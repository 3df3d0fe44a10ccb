package syncserver

import (
	"encoding/json"
	"net/http"
)

// Errors are RFC 9457 Problem Details: a JSON object whose type names the
// kind of problem, whose detail says what to do, and, when one input was
// wrong, whose errors name the field.
type problemBody struct {
	Type     string       `json:"type"`
	Title    string       `json:"title"`
	Status   int          `json:"status"`
	Detail   string       `json:"detail"`
	Instance string       `json:"instance,omitempty"`
	TraceID  string       `json:"trace_id,omitempty"`
	Errors   []fieldError `json:"errors,omitempty"`
}

// fieldError names one wrong input: a query parameter, a header, or a
// member of the body as a path such as ops.notes[2].id.
type fieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// problemType is the URI of a kind of problem.
func problemType(kind string) string { return "urn:drivesync:problem:" + kind }

func problem(w http.ResponseWriter, r *http.Request, status int, kind, title, detail string, errs ...fieldError) {
	writeProblem(w, r, problemBody{Type: problemType(kind), Title: title, Status: status, Detail: detail, Errors: errs})
}

func writeProblem(w http.ResponseWriter, r *http.Request, p problemBody) {
	p.Instance = r.URL.Path
	p.TraceID = TraceID(r.Context())
	if info := info(r); info.err == nil {
		info.err = &problemError{p}
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Del("Idempotent-Replayed")
	w.WriteHeader(p.Status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(p)
}

// A problemError is a request's problem as an error: what the request
// handlers return to have it sent.
type problemError struct{ p problemBody }

func (e *problemError) Error() string {
	s := e.p.Title + ": " + e.p.Detail
	for _, f := range e.p.Errors {
		s += "; " + f.Field + ": " + f.Detail
	}
	return s
}

func badField(field, detail string) *problemError {
	return &problemError{problemBody{Type: problemType("invalid-request"), Title: "Invalid request", Status: http.StatusBadRequest,
		Detail: field + ": " + detail, Errors: []fieldError{{Field: field, Detail: detail}}}}
}
