package proctest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// Stalled is a raw TCP client that has sent part of a request and then nothing more. Its
// reads are bounded by pgtest.PollTimeout, so that an answer that never comes fails the test
// instead of hanging it.
type Stalled struct {
	t    testing.TB
	conn net.Conn
	r    *bufio.Reader
}

// Stall dials addr and sends sent (a request's line and headers, ending in the blank line, or
// headers that never end), then nothing. The connection is closed when the test ends.
func Stall(t testing.TB, addr, sent string) *Stalled {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, sent); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(pgtest.PollTimeout))
	return &Stalled{t: t, conn: c, r: bufio.NewReader(c)}
}

// Answer reads the answer the client got while it stalls, and its body; it fails the test if
// none comes.
func (s *Stalled) Answer() (*http.Response, string) {
	s.t.Helper()
	resp, body, err := s.Answered()
	if err != nil {
		s.t.Fatal(err)
	}
	return resp, body
}

// Answered is [Stalled.Answer] for a check that records what it finds instead of failing the
// test: the answer and its body, or an error when none comes while the client stalls (the
// server closed the connection, or pgtest.PollTimeout passed since [Stall]).
func (s *Stalled) Answered() (*http.Response, string, error) {
	resp, err := http.ReadResponse(s.r, nil)
	if err != nil {
		return nil, "", fmt.Errorf("no answer while the client stalls: %w", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, "", fmt.Errorf("reading the answer's body: %w", err)
	}
	return resp, string(b), nil
}

// Closed reports whether the server has closed the connection, waiting for the server's next
// move: its close (true), or anything else it sends (false). It fails the test if the server
// does neither.
func (s *Stalled) Closed() bool {
	s.t.Helper()
	n, err := s.r.Read(make([]byte, 1))
	// A server that closes a connection with bytes unread in it resets it.
	if n == 0 && err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		s.t.Fatalf("the server neither closed the connection nor sent anything: %v", err)
	}
	return n == 0
}
