// Package openapicheck checks HTTP exchanges against the sync server's
// OpenAPI document: that the response's status is one the document lists
// for the operation, that its body matches that response's schema, and
// that the body of a request the server took matches the request's.
package openapicheck

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// A Checker checks exchanges against one document.
type Checker struct {
	doc  map[string]any
	c    *jsonschema.Compiler
	mu   sync.Mutex
	seen map[string]*jsonschema.Schema
	// Checked counts the exchanges checked, by "METHOD path status".
	Checked map[string]int
}

const docURL = "file:///openapi.json"

// Load reads the document at path.
func Load(path string) (*Checker, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(docURL, doc); err != nil {
		return nil, err
	}
	return &Checker{doc: doc.(map[string]any), c: c, seen: map[string]*jsonschema.Schema{}, Checked: map[string]int{}}, nil
}

func escape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func (k *Checker) schema(ptr string) (*jsonschema.Schema, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if s, ok := k.seen[ptr]; ok {
		return s, nil
	}
	s, err := k.c.Compile(docURL + "#" + ptr)
	if err != nil {
		return nil, err
	}
	k.seen[ptr] = s
	return s, nil
}

// operation returns the document's operation for method and path.
func (k *Checker) operation(method, path string) (map[string]any, error) {
	paths, _ := k.doc["paths"].(map[string]any)
	item, ok := paths[path].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s is not in the document", path)
	}
	op, ok := item[strings.ToLower(method)].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s %s is not in the document", method, path)
	}
	return op, nil
}

var (
	loadedMu sync.Mutex
	loaded   = map[string]*Checker{}
)

// For returns the Checker of the document at path, loaded once per test
// binary; a document that does not load fails t.
func For(t testing.TB, path string) *Checker {
	t.Helper()
	loadedMu.Lock()
	defer loadedMu.Unlock()
	if k, ok := loaded[path]; ok {
		return k
	}
	k, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	loaded[path] = k
	return k
}

// Check checks one exchange. reqBody is checked only when the status is
// 200: a request the server refused may be wrong on purpose.
func (k *Checker) Check(method, path string, reqBody []byte, status int, contentType string, body []byte) error {
	op, err := k.operation(method, path)
	if err != nil {
		return err
	}
	base := "/paths/" + escape(path) + "/" + strings.ToLower(method)
	responses, _ := op["responses"].(map[string]any)
	resp, ok := responses[strconv.Itoa(status)].(map[string]any)
	if !ok {
		return fmt.Errorf("%s %s answered %d, which the document does not list", method, path, status)
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return fmt.Errorf("%s %s %d: Content-Type %q: %v", method, path, status, contentType, err)
	}
	content, _ := resp["content"].(map[string]any)
	if _, ok := content[mt]; !ok {
		return fmt.Errorf("%s %s %d: Content-Type %s is not the document's", method, path, status, mt)
	}
	// Bytes (a file's content) have no schema to check.
	if mt != "application/octet-stream" {
		if err := k.validate(base+"/responses/"+strconv.Itoa(status)+"/content/"+escape(mt)+"/schema", body); err != nil {
			return fmt.Errorf("%s %s %d response: %v\n%s", method, path, status, err, body)
		}
	}
	rb, _ := op["requestBody"].(map[string]any)
	rc, _ := rb["content"].(map[string]any)
	if _, json := rc["application/json"]; json && status == http.StatusOK && len(reqBody) > 0 {
		if err := k.validate(base+"/requestBody/content/application~1json/schema", reqBody); err != nil {
			return fmt.Errorf("%s %s request: %v\n%s", method, path, err, reqBody)
		}
	}
	k.mu.Lock()
	k.Checked[fmt.Sprintf("%s %s %d", method, path, status)]++
	k.mu.Unlock()
	return nil
}

func (k *Checker) validate(ptr string, body []byte) error {
	s, err := k.schema(ptr)
	if err != nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("not JSON: %v", err)
	}
	return s.Validate(v)
}

// Handler wraps h so that every exchange it serves is checked; a failed
// check fails t.
func (k *Checker) Handler(t testing.TB, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req []byte
		if r.Body != nil {
			req, _ = io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(req))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if r.Context().Err() != nil {
			return // the client went away: no one reads the response
		}
		if err := k.Check(r.Method, r.URL.Path, req, rec.Code, rec.Header().Get("Content-Type"), rec.Body.Bytes()); err != nil {
			t.Errorf("the exchange does not conform to the OpenAPI document: %v", err)
		}
		for key, v := range rec.Header() {
			w.Header()[key] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	})
}
