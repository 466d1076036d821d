// Package reqbody holds the request-body rules the functions share (docs/api.md) and the words
// of their refusals. Each function's decodeRequest judges them in its own order, the size
// always before the content:
//
//   - an answer decided by the headers alone (the method, the Content-Type, the
//     Content-Encoding, a Content-Length over the limit) goes out at once and the connection
//     closes after it, the body unread ([SkipBody]);
//   - a body is sent as is, never compressed: a Content-Encoding other than identity is 415
//     before the body is read ([Encoding]);
//   - a body is JSON: a Content-Type other than application/json is 415 ([IsJSON]);
//   - a body is at most a few KiB and arrives within [ReadTimeout]: the whole body is read up
//     to the limit before any of it is parsed, so a larger one is 413 whatever it holds ([Read]);
//   - a body is one JSON object: not null, not an array or a scalar; each field known, given
//     once and of its type; nothing after the object ([DecodeObject]). Otherwise 400, in words
//     that name the field, never Go's types.
package reqbody

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Encoding returns the first Content-Encoding coding of h other than identity, or "" when the
// body is sent as is (RFC 9110, 8.4 "Content-Encoding").
func Encoding(h http.Header) string {
	for _, v := range h.Values("Content-Encoding") {
		for coding := range strings.SplitSeq(v, ",") {
			if c := strings.TrimSpace(coding); c != "" && !strings.EqualFold(c, "identity") {
				return c
			}
		}
	}
	return ""
}

// SkipBody makes the answer to r, decided by its headers alone, go out at once and close the
// connection, the body unread. Call it before the answer's WriteHeader. net/http reads an
// unread body on its own, up to 256 KiB, to keep the connection for the next request: before
// it writes the answer (unless the answer says Connection: close), and again after it, when it
// closes the body (whatever the answer says). A client that stalls after its headers would get
// no answer, or keep its connection, and with it the server's read, open. So SkipBody sets
// Connection: close and the connection's read deadline to now: the server's read after the
// answer fails at once. A request without a body (Content-Length: 0) keeps its connection.
func SkipBody(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength == 0 { // -1 is a chunked body, or one of a length not given
		return
	}
	w.Header().Set("Connection", "close")
	// A writer that cannot set one (httptest's recorder) has no connection to read.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

// ErrNotJSONType is the refusal of a Content-Type other than application/json (415).
var ErrNotJSONType = errors.New("Content-Type must be application/json")

// IsJSON reports whether h declares the body application/json (parameters such as charset
// aside).
func IsJSON(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == "application/json"
}

// ReadTimeout bounds how long the body may take to arrive once its headers have: the app
// gateway gives up on IssueCoupon after 3 s (issuance.AppTimeout), so no caller waits for a
// body slower than that, and a client that stops sending holds its request only this long,
// inside the shutdown's drain (shared/lifecycle.DrainTimeout).
const ReadTimeout = 3 * time.Second

// Read reads the whole body of r, at most limit bytes, within [ReadTimeout]. A body over limit
// is refused with 413 whatever it holds: at once, unread ([SkipBody]), when its Content-Length
// says so, otherwise when reading passes the limit (http.MaxBytesReader also tells the server to
// close the connection).
// Another read failure, the timeout's included, is 400.
func Read(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, int, error) {
	if r.ContentLength > limit {
		SkipBody(w, r)
		return nil, http.StatusRequestEntityTooLarge, tooLarge(limit)
	}
	if r.Body == nil {
		return nil, 0, nil
	}
	// The deadline is the connection's: cleared once the body is in, or the server's read of
	// the connection after the body would end the request's context when it passed. A writer
	// that cannot set one (httptest's recorder) reads without it.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(ReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The rest of the body is not waited for: not by the server either, which would
		// otherwise read it before answering, on a connection that is then closed.
		w.Header().Set("Connection", "close")
		return nil, http.StatusBadRequest, fmt.Errorf("the body did not arrive within %s", ReadTimeout)
	}
	_ = rc.SetReadDeadline(time.Time{})
	if errors.As(err, new(*http.MaxBytesError)) {
		return nil, http.StatusRequestEntityTooLarge, tooLarge(limit)
	}
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("reading the body: %w", err)
	}
	return body, 0, nil
}

// tooLarge is Read's refusal of a body over limit bytes: made only then, not for every body.
func tooLarge(limit int64) error { return fmt.Errorf("body over %d bytes", limit) }

// ErrEmpty is [DecodeObject]'s answer to a body of nothing but white space: each function says
// what that means (IssueCoupon refuses it, RelayOutbox runs with its defaults).
var ErrEmpty = errors.New("body is empty")

// Fields are the fields a JSON object may hold, each with what reads its value.
type Fields map[string]func(Value) error

// Value is one field's value in the object [DecodeObject] walks.
type Value struct {
	key string
	tok json.Token
}

// String returns the value as a string, or an error naming the field when it is not a JSON
// string (null included).
func (v Value) String() (string, error) {
	s, ok := v.tok.(string)
	if !ok {
		return "", fmt.Errorf("field %q must be a string", v.key)
	}
	return s, nil
}

// Bool returns the value as a boolean, or an error naming the field when it is not JSON true or
// false (null included).
func (v Value) Bool() (bool, error) {
	b, ok := v.tok.(bool)
	if !ok {
		return false, fmt.Errorf("field %q must be true or false", v.key)
	}
	return b, nil
}

// Int returns the value as an integer in lo..hi, or an error naming the field when it is not a
// JSON integer (null, a string, a fraction or an exponent included) or outside lo..hi.
func (v Value) Int(lo, hi int64) (int64, error) {
	num, ok := v.tok.(json.Number)
	if !ok || strings.ContainsAny(string(num), ".eE") {
		return 0, fmt.Errorf("field %q must be an integer", v.key)
	}
	n, err := strconv.ParseInt(string(num), 10, 64)
	if err != nil || n < lo || n > hi { // err: an integer beyond int64, far outside any range
		return 0, fmt.Errorf("field %q must be in %d..%d", v.key, lo, hi)
	}
	return n, nil
}

// readField reads the next field of the object dec is in and hands its value to its reader in
// fields, refusing a field not in fields, one in seen, and a nested value.
func readField(dec *json.Decoder, fields Fields, seen map[string]bool) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("body is not JSON: %w", err)
	}
	key := tok.(string) // inside an object, json.Decoder yields keys as strings
	read, ok := fields[key]
	if !ok {
		return fmt.Errorf("unknown field %q", key)
	}
	if seen[key] {
		return fmt.Errorf("duplicate field %q", key)
	}
	seen[key] = true
	if tok, err = dec.Token(); err != nil {
		return fmt.Errorf("body is not JSON: %w", err)
	}
	if err := read(Value{key: key, tok: tok}); err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); ok && (d == '{' || d == '[') {
		// A reader that took an object or an array as its value would have to walk it; none
		// does, and each refuses it by its type above.
		return fmt.Errorf("field %q: nested values are not read", key)
	}
	return nil
}

// DecodeObject walks body as one JSON object token by token, and hands each field's value to
// its reader in fields. It refuses what encoding/json alone would accept or word in Go's terms:
// null and any other non-object, a field not in fields (names are case-sensitive), a field given
// twice, a value of the wrong type, and data after the object. A body of white space alone is
// [ErrEmpty]. Which fields are required is the caller's rule.
func DecodeObject(body []byte, fields Fields) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err == io.EOF {
		return ErrEmpty
	} else if err != nil {
		return fmt.Errorf("body is not JSON: %w", err)
	} else if tok != json.Delim('{') {
		return errors.New("body must be a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		if err := readField(dec, fields, seen); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return fmt.Errorf("body is not JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}
