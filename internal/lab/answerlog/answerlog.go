// Package answerlog is the answer log of IssueCoupon traffic: one JSON line per answer, with
// when the request was sent, how long the answer took, which (campaign, member) it was for and
// what came back. `couponctl load --record` and `couponctl drill` write it; `couponctl audit`
// (internal/lab/audit) reads it and checks it against the tables.
//
// A line, every field always present (docs/api.md, couponctl's table):
//
//	{"t":"2026-11-30T07:38:01.123456789Z","ms":8.412,"member_id":"m0001","campaign_id":"SW-A",
//	 "status":201,"result":"ISSUED","coupon_id":"0b8f6b1e-...","error":""}
//
// status is 0 and error the transport error's text when no HTTP answer came (connection refused,
// reset, the client's timeout); result and coupon_id are "" when the body has none.
package answerlog

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Answer is one line of the log.
type Answer struct {
	// T is when the request was sent.
	T time.Time `json:"t"`
	// Ms is the latency, from sending to the whole answer read (or the transport error), in
	// milliseconds.
	Ms         float64 `json:"ms"`
	MemberID   string  `json:"member_id"`
	CampaignID string  `json:"campaign_id"`
	// Status is the HTTP status, 0 when no answer came.
	Status int `json:"status"`
	// Result is the body's "result" (docs/api.md's result code), "" when there is none.
	Result string `json:"result"`
	// CouponID is the body's "coupon_id", "" when there is none.
	CouponID string `json:"coupon_id"`
	// Reason is the body's "reason" (CAMPAIGN_NOT_ACTIVE's NOT_STARTED, ENDED or PAUSED), ""
	// when there is none.
	Reason string `json:"reason,omitempty"`
	// Error is the transport error's text when Status is 0, else "".
	Error string `json:"error"`
}

// Latency is Ms as a duration.
func (a Answer) Latency() time.Duration { return time.Duration(a.Ms * float64(time.Millisecond)) }

// New makes the answer to a request for (memberID, campaignID) sent at sent that took latency:
// an HTTP answer with status and body (its "result" and "coupon_id" are read from it when it is
// JSON), or, when transportErr is not nil, no answer at all (status and body are ignored).
func New(sent time.Time, latency time.Duration, memberID, campaignID string, status int, body []byte, transportErr error) Answer {
	a := Answer{T: sent, Ms: float64(latency) / float64(time.Millisecond), MemberID: memberID, CampaignID: campaignID}
	if transportErr != nil {
		a.Error = transportErr.Error()
		return a
	}
	var b struct {
		Result   string `json:"result"`
		CouponID string `json:"coupon_id"`
		Reason   string `json:"reason"`
	}
	_ = json.Unmarshal(body, &b) // a body that is not JSON has no result: "" says so
	a.Status, a.Result, a.CouponID, a.Reason = status, b.Result, b.CouponID, b.Reason
	return a
}

// Writer appends answers to a file, one JSON line each. It is safe for concurrent use.
type Writer struct {
	mu   sync.Mutex
	f    *os.File
	buf  *bufio.Writer
	enc  *json.Encoder
	n    int
	werr error // the first write error: later writes are refused with it
	done bool  // closed
	cerr error // what Close returned
}

// Create creates (or truncates) the log file at path.
func Create(path string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("answerlog: %w", err)
	}
	buf := bufio.NewWriter(f)
	return &Writer{f: f, buf: buf, enc: json.NewEncoder(buf)}, nil
}

// Name is the file's path.
func (w *Writer) Name() string { return w.f.Name() }

// Write appends a. After a failed write every later one fails with the same error.
func (w *Writer) Write(a Answer) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.werr != nil {
		return w.werr
	}
	if w.done {
		return fmt.Errorf("answerlog: %s: write after close", w.f.Name())
	}
	if err := w.enc.Encode(a); err != nil {
		w.werr = fmt.Errorf("answerlog: %s: %w", w.f.Name(), err)
		return w.werr
	}
	w.n++
	return nil
}

// Count is how many answers were written.
func (w *Writer) Count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// Close flushes and closes the file, returning the first error of any write, the flush or the
// close. Closing again does nothing and returns the same.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.done = true
		w.cerr = errors.Join(w.werr, w.buf.Flush(), w.f.Close())
	}
	return w.cerr
}

// maxLine bounds one line of a log, in bytes: an answer is about 250 bytes; a transport error's
// text is the longest field.
const maxLine = 64 << 10

// Read reads a whole log. A line that is not an answer (not JSON, or without t, member_id or
// campaign_id) is an error naming its line number.
func Read(r io.Reader) ([]Answer, error) {
	var answers []Answer
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var a Answer
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			return nil, fmt.Errorf("answerlog: line %d: %w", line, err)
		}
		if a.T.IsZero() || a.MemberID == "" || a.CampaignID == "" {
			return nil, fmt.Errorf("answerlog: line %d: want t, member_id and campaign_id", line)
		}
		answers = append(answers, a)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("answerlog: %w", err)
	}
	return answers, nil
}

// ReadFile reads the log at path (see [Read]).
func ReadFile(path string) ([]Answer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("answerlog: %w", err)
	}
	defer f.Close()
	answers, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return answers, nil
}
