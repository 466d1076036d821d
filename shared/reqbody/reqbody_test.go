package reqbody_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mops/coupon-api/shared/reqbody"
)

func TestEncoding(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		values []string
		want   string
	}{
		{nil, ""},
		{[]string{"identity"}, ""},
		{[]string{"IDENTITY, identity"}, ""},
		{[]string{"gzip"}, "gzip"},
		{[]string{"identity, br"}, "br"},
		{[]string{"identity", "deflate"}, "deflate"},
	} {
		h := http.Header{}
		for _, v := range tc.values {
			h.Add("Content-Encoding", v)
		}
		if got := reqbody.Encoding(h); got != tc.want {
			t.Errorf("Encoding(%q) = %q, want %q", tc.values, got, tc.want)
		}
	}
}

func TestIsJSON(t *testing.T) {
	t.Parallel()
	for ct, want := range map[string]bool{
		"application/json": true, "application/json; charset=utf-8": true, "Application/JSON": true,
		"": false, "text/plain": false, "application/x-www-form-urlencoded": false, "application/json-seq": false,
		"application/json; charset": false, // a malformed parameter: not a media type
	} {
		h := http.Header{}
		if ct != "" {
			h.Set("Content-Type", ct)
		}
		if got := reqbody.IsJSON(h); got != want {
			t.Errorf("IsJSON(%q) = %t, want %t", ct, got, want)
		}
	}
}

// TestRead: a body over the limit is 413 whatever it holds, by its Content-Length or by
// reading; up to the limit it is read whole.
func TestRead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		body    string
		chunked bool
		status  int
	}{
		{"empty", "", false, 0},
		{"at the limit", strings.Repeat("x", 16), false, 0},
		{"at the limit, chunked", strings.Repeat("x", 16), true, 0},
		{"one over", strings.Repeat("x", 17), false, http.StatusRequestEntityTooLarge},
		{"one over, chunked", strings.Repeat("x", 17), true, http.StatusRequestEntityTooLarge},
	} {
		var body io.Reader = strings.NewReader(c.body)
		if c.chunked {
			body = io.MultiReader(body)
		}
		r := httptest.NewRequest(http.MethodPost, "/", body)
		got, status, err := reqbody.Read(httptest.NewRecorder(), r, 16)
		if status != c.status || (status == 0 && string(got) != c.body) ||
			(status != 0 && (err == nil || err.Error() != "body over 16 bytes")) {
			t.Errorf("%s: %q %d %v, want status %d", c.name, got, status, err, c.status)
		}
	}
}

// TestDecodeObject: one object of known fields, each once and of its type, nothing after it;
// white space alone is ErrEmpty; every refusal names the field or the body, never Go's types.
func TestDecodeObject(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		body, want string // want: "" accepted, "EMPTY" ErrEmpty, else the error
		name       string
		n          int64
	}{
		{"", "EMPTY", "", 0},
		{" \t\n", "EMPTY", "", 0},
		{`{}`, "", "", 0},
		{`{"name": "a", "n": 7}`, "", "a", 7},
		{`{"n": -3}`, "", "", -3},
		{`null`, "body must be a JSON object", "", 0},
		{`[]`, "body must be a JSON object", "", 0},
		{`"x"`, "body must be a JSON object", "", 0},
		{`1`, "body must be a JSON object", "", 0},
		{`x`, "body is not JSON: invalid character 'x' looking for beginning of value", "", 0},
		{`{"n": 1`, "body is not JSON: EOF", "", 0},
		{`{"n" 1}`, "body is not JSON: invalid character '1' after object key", "", 0},
		{`{"m": 1}`, `unknown field "m"`, "", 0},
		{`{"N": 1}`, `unknown field "N"`, "", 0},
		{`{"n": 1, "n": 2}`, `duplicate field "n"`, "", 0},
		{`{"n": null}`, `field "n" must be an integer`, "", 0},
		{`{"n": "1"}`, `field "n" must be an integer`, "", 0},
		{`{"n": 1.0}`, `field "n" must be an integer`, "", 0},
		{`{"n": 1E2}`, `field "n" must be an integer`, "", 0},
		{`{"n": [1]}`, `field "n" must be an integer`, "", 0},
		{`{"n": 11}`, `field "n" must be in -5..10`, "", 0},
		{`{"n": 123456789012345678901234567890}`, `field "n" must be in -5..10`, "", 0},
		{`{"name": null}`, `field "name" must be a string`, "", 0},
		{`{"name": 1}`, `field "name" must be a string`, "", 0},
		{`{"name": {"a": 1}}`, `field "name" must be a string`, "", 0},
		{`{} {}`, "trailing data after the JSON object", "", 0},
		{`{} x`, "trailing data after the JSON object", "", 0},
	} {
		var name string
		var n int64
		err := reqbody.DecodeObject([]byte(c.body), reqbody.Fields{
			"name": func(v reqbody.Value) (err error) { name, err = v.String(); return err },
			"n":    func(v reqbody.Value) (err error) { n, err = v.Int(-5, 10); return err },
		})
		switch {
		case c.want == "EMPTY":
			if !errors.Is(err, reqbody.ErrEmpty) {
				t.Errorf("%q: %v, want ErrEmpty", c.body, err)
			}
		case c.want == "":
			if err != nil || name != c.name || n != c.n {
				t.Errorf("%q: %q %d %v, want %q %d", c.body, name, n, err, c.name, c.n)
			}
		case err == nil || err.Error() != c.want:
			t.Errorf("%q: %v, want %q", c.body, err, c.want)
		}
	}
}
