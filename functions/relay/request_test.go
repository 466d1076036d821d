package relay_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/functions/relay"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox"
)

// relayAnswer is one RelayOutbox answer: its status and its body's message.
type relayAnswer struct {
	status  int
	message string
}

func post(t *testing.T, h http.Handler, body io.Reader, contentType string) relayAnswer {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/", body)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var v struct {
		Message string `json:"message"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("answer %d is not JSON: %q", rec.Code, rec.Body)
	}
	return relayAnswer{rec.Code, v.Message}
}

// goInternals are words of encoding/json's own errors: a caller must never read them.
var goInternals = []string{"Go value", "Go struct", "struct {", "json:", "unmarshal", "*int"}

// TestRequestRules: RelayOutbox judges its body by IssueCoupon's rules: a null body, a null
// max_rows, a non-object, a duplicate or unknown field, a wrong type and trailing data are 400
// in words without Go's internals; a body over 4 KiB is 413 whatever it holds (with or without a
// Content-Length); an empty body, whitespace and {} are the default run.
func TestRequestRules(t *testing.T) {
	t.Parallel()
	h := requestHandler(t)
	over := strings.Repeat(" ", relay.MaxBodyBytes)
	for _, c := range []struct {
		body   string
		status int
		want   string // in the message; "" for a 200
	}{
		{"", 200, ""},
		{"  \n", 200, ""},
		{`{}`, 200, ""},
		{` { } `, 200, ""},
		{`{"max_rows": 10}`, 200, ""},
		{`{"max_rows": 200000}`, 200, ""},
		{`null`, 400, "body must be a JSON object"},
		{`{"max_rows": null}`, 400, `field "max_rows" must be an integer`},
		{`[]`, 400, "body must be a JSON object"},
		{`[{"max_rows": 10}]`, 400, "body must be a JSON object"},
		{`10`, 400, "body must be a JSON object"},
		{`"max_rows"`, 400, "body must be a JSON object"},
		{`[`, 400, "body must be a JSON object"},
		{`{`, 400, "body is not JSON"},
		{`{"max_rows": 10`, 400, "body is not JSON"},
		{`{"max_rows": "10"}`, 400, `field "max_rows" must be an integer`},
		{`{"max_rows": 1.5}`, 400, `field "max_rows" must be an integer`},
		{`{"max_rows": 1e3}`, 400, `field "max_rows" must be an integer`},
		{`{"max_rows": true}`, 400, `field "max_rows" must be an integer`},
		{`{"max_rows": {}}`, 400, `field "max_rows" must be an integer`},
		{`{"max_rows": [10]}`, 400, `field "max_rows" must be an integer`},
		{`{"max_rows": 0}`, 400, `field "max_rows" must be in 1..200000`},
		{`{"max_rows": -1}`, 400, `field "max_rows" must be in 1..200000`},
		{`{"max_rows": 200001}`, 400, `field "max_rows" must be in 1..200000`},
		{`{"max_rows": 99999999999999999999}`, 400, `field "max_rows" must be in 1..200000`},
		{`{"max_rows": 10, "max_rows": 20}`, 400, `duplicate field "max_rows"`},
		{`{"rows": 10}`, 400, `unknown field "rows"`},
		{`{"MAX_ROWS": 10}`, 400, `unknown field "MAX_ROWS"`},
		{`{"max_rows": 10} {}`, 400, "trailing data after the JSON object"},
		{`{} null`, 400, "trailing data after the JSON object"},
		{`{"max_rows": 10}` + over, 413, "body over 4096 bytes"},
		{`{"max_rows": 0, "x": "` + strings.Repeat("a", 5000) + `"}`, 413, "body over 4096 bytes"},
		{strings.Repeat("[", 5000), 413, "body over 4096 bytes"},
	} {
		for _, chunked := range []bool{false, true} {
			var body io.Reader = strings.NewReader(c.body)
			if chunked { // no Content-Length: the size is found by reading
				body = io.MultiReader(body)
			}
			got := post(t, h, body, "application/json")
			if got.status != c.status || !strings.Contains(got.message, c.want) {
				t.Errorf("%.60q (chunked %t): %d %q, want %d %q", c.body, chunked, got.status, got.message, c.status, c.want)
			}
			for _, w := range goInternals {
				if strings.Contains(got.message, w) {
					t.Errorf("%.60q: the message shows Go's internals (%q): %q", c.body, w, got.message)
				}
			}
		}
	}
}

// TestRequestContentType: a body that is not empty must be declared application/json, as
// IssueCoupon's (415 otherwise, whether or not its length was sent first); an empty body may
// come with any Content-Type or none, as Cloud Scheduler and a bare curl -X POST send it.
func TestRequestContentType(t *testing.T) {
	t.Parallel()
	h := requestHandler(t)
	for _, c := range []struct {
		contentType, body string
		status            int
	}{
		{"", "", 200},
		{"application/octet-stream", "", 200},
		{"application/x-www-form-urlencoded", "", 200},
		{"application/json; charset=utf-8", `{"max_rows": 5}`, 200},
		{"", `{"max_rows": 5}`, 415},
		{"application/x-www-form-urlencoded", `{"max_rows": 5}`, 415},
		{"text/plain", `{}`, 415},
		{"application/json", `{"max_rows": 5}`, 200},
	} {
		for _, chunked := range []bool{false, true} {
			var body io.Reader = strings.NewReader(c.body)
			if chunked {
				body = io.MultiReader(body)
			}
			got := post(t, h, body, c.contentType)
			if got.status != c.status || (c.status == 415 && got.message != "Content-Type must be application/json") {
				t.Errorf("%q %q (chunked %t): %d %q, want %d", c.contentType, c.body, chunked, got.status, got.message, c.status)
			}
		}
	}
}

// TestRequestWordsAsIssueCoupon: where a body is wrong in the same way for both functions,
// RelayOutbox answers with IssueCoupon's status and message.
func TestRequestWordsAsIssueCoupon(t *testing.T) {
	t.Parallel()
	rh := requestHandler(t)
	ih, err := issue.New(issuance.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if relay.MaxBodyBytes != issue.MaxBodyBytes {
		t.Errorf("MaxBodyBytes: relay %d, issue %d", relay.MaxBodyBytes, issue.MaxBodyBytes)
	}
	if r, i := post(t, rh, strings.NewReader(`{}`), "text/plain"), post(t, ih, strings.NewReader(`{}`), "text/plain"); r != i {
		t.Errorf("text/plain: RelayOutbox %d %q, IssueCoupon %d %q", r.status, r.message, i.status, i.message)
	}
	for _, body := range []string{
		`null`, `[]`, `[`, `{`, `"text"`, `12`, `true`, `{"unknown": 1}`, `{} {}`, `{} x`,
		`{"unknown": 1` + strings.Repeat(" ", 5000) + `}`,
	} {
		r, i := post(t, rh, strings.NewReader(body), "application/json"), post(t, ih, strings.NewReader(body), "application/json")
		if r != i {
			t.Errorf("%.40q: RelayOutbox %d %q, IssueCoupon %d %q", body, r.status, r.message, i.status, i.message)
		}
	}
}

// requestHandler is a RelayOutbox handler on a test database that pushes to a LINE stand-in.
func requestHandler(t *testing.T) http.Handler {
	t.Helper()
	srv := httptest.NewServer(linestub.New())
	t.Cleanup(srv.Close)
	h, err := relay.New(outbox.Config{ChannelAccessToken: "t", BaseURL: srv.URL,
		PushTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)}, pgtest.Pool(t, 2))
	if err != nil {
		t.Fatal(err)
	}
	return h
}
