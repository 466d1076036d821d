// Package apispec checks real HTTP handler answers against the repository's OpenAPI document,
// docs/openapi.yaml, with github.com/getkin/kin-openapi: every answer's status, headers and body
// must be the document's, and every request a handler accepted must be one the document allows.
// It also records which (status, result) pairs a test produced, so that the test can fail on a
// documented answer it never saw. The functions' tests use it; production code never does.
package apispec

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// Path returns the absolute path of docs/openapi.yaml, found from this file's place in the
// repository (internal/testkit/apispec).
func Path() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "docs", "openapi.yaml")
}

// Checker validates one operation's answers and remembers which it saw.
type Checker struct {
	doc    *openapi3.T
	router routers.Router
	path   string // the operation's path in the document, e.g. /IssueCoupon

	mu   sync.Mutex
	seen map[string]bool // "status result", or "status" for bodies without result
}

// New loads and validates docs/openapi.yaml and returns a Checker for the POST operation at
// path. The document's servers are dropped, so that requests to any host match by path alone.
func New(t testing.TB, path string) *Checker {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(Path())
	if err != nil {
		t.Fatalf("load %s: %v", Path(), err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("%s is not a valid OpenAPI document: %v", Path(), err)
	}
	if doc.Paths.Find(path) == nil || doc.Paths.Find(path).Post == nil {
		t.Fatalf("%s: no POST %s", Path(), path)
	}
	doc.Servers = nil
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &Checker{doc: doc, router: router, path: path, seen: map[string]bool{}}
}

// Do sends req (its URL path is replaced by the operation's) to h, validates the answer against
// the document, fails t if it does not match, and returns the answer. A request answered 2xx
// must also be one the document's request schema accepts.
func (c *Checker) Do(t testing.TB, h http.Handler, req *http.Request) *http.Response {
	t.Helper()
	req.URL.Path = c.path
	var reqBody []byte
	if req.Body != nil {
		reqBody, _ = io.ReadAll(req.Body)
	}
	req.Body = io.NopCloser(bytes.NewReader(reqBody))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	resp := rec.Result()
	body := rec.Body.Bytes()

	// The route is the POST operation even when the method was not POST: the 405 answer is
	// documented there.
	probe := httptest.NewRequest(http.MethodPost, c.path, bytes.NewReader(reqBody))
	probe.Header = req.Header.Clone()
	route, params, err := c.router.FindRoute(probe)
	if err != nil {
		t.Fatalf("route POST %s: %v", c.path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: probe, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	if resp.StatusCode/100 == 2 {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			t.Errorf("%s %s %q was answered %d, but the document refuses the request: %v",
				req.Method, c.path, reqBody, resp.StatusCode, err)
		}
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode,
		Header: resp.Header, Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		t.Errorf("%s %s %q: answer %d %s does not match %s: %v",
			req.Method, c.path, reqBody, resp.StatusCode, body, filepath.Base(Path()), err)
	}
	c.record(resp.StatusCode, body)
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp
}

func (c *Checker) record(status int, body []byte) {
	var v struct {
		Result string `json:"result"`
	}
	_ = json.Unmarshal(body, &v)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[key(status, v.Result)] = true
}

func key(status int, result string) string {
	if result == "" {
		return fmt.Sprint(status)
	}
	return fmt.Sprintf("%d %s", status, result)
}

// Documented lists the answers the document gives the operation: "status result" for each
// value of a body's result enum, or "status" for a body without result.
func (c *Checker) Documented() []string {
	var out []string
	for status, ref := range c.doc.Paths.Find(c.path).Post.Responses.Map() {
		var results []string
		if mt := ref.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil {
			results = resultEnum(mt.Schema.Value)
		}
		if len(results) == 0 {
			out = append(out, status)
		}
		for _, r := range results {
			out = append(out, status+" "+r)
		}
	}
	sort.Strings(out)
	return out
}

// resultEnum lists the values of the result property of a body schema, or of each of its oneOf
// alternatives.
func resultEnum(s *openapi3.Schema) []string {
	var out []string
	if r := s.Properties["result"]; r != nil {
		for _, e := range r.Value.Enum {
			out = append(out, fmt.Sprint(e))
		}
	}
	for _, alt := range s.OneOf {
		out = append(out, resultEnum(alt.Value)...)
	}
	return out
}

// Unseen lists the documented answers that no call to Do produced.
func (c *Checker) Unseen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, d := range c.Documented() {
		if !c.seen[d] {
			out = append(out, d)
		}
	}
	return slices.Clip(out)
}
