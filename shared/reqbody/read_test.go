package reqbody_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/shared/reqbody"
)

// TestReadGivesUpOnAStalledBody: a client sends its headers and part of its body, then nothing.
// Read gives up at ReadTimeout with 400, saying so, and the server answers at once and closes
// the connection instead of waiting for the rest. A body that arrives is read whole.
func TestReadGivesUpOnAStalledBody(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, status, err := reqbody.Read(w, r, 4<<10)
		if err != nil {
			w.WriteHeader(status)
			fmt.Fprint(w, err)
			return
		}
		fmt.Fprintf(w, "read %q", body)
	}))
	t.Cleanup(srv.Close)
	ask := func(body string, length int) (*http.Response, string) {
		t.Helper()
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", length, body)
		// A bound so that a missing answer fails the test instead of hanging it.
		_ = c.SetReadDeadline(time.Now().Add(4 * reqbody.ReadTimeout))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer to %q of %d bytes: %v", body, length, err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, got := ask(`{"max_rows": 1}`, 15); resp.StatusCode != http.StatusOK || got != `read "{\"max_rows\": 1}"` {
		t.Errorf("a whole body: %s %s", resp.Status, got)
	}
	resp, got := ask(`{"max_rows"`, 100)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(got, "did not arrive within "+reqbody.ReadTimeout.String()) || !resp.Close {
		t.Errorf("a stalled body: %s %q (close %t), want 400 saying it did not arrive, and the connection closed", resp.Status, got, resp.Close)
	}
}

// readCounter is a listener whose connections report, at their first write (the answer's
// first bytes), how many bytes the server had read from them.
type readCounter struct {
	net.Listener
	readAtAnswer chan int64
}

func (l readCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return &countedConn{Conn: c, readAtAnswer: l.readAtAnswer}, err
}

type countedConn struct {
	net.Conn
	read         int64
	answered     bool
	readAtAnswer chan int64
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read += int64(n)
	return n, err
}

func (c *countedConn) Write(p []byte) (int, error) {
	if !c.answered {
		c.answered = true
		c.readAtAnswer <- c.read
	}
	return c.Conn.Write(p)
}

// TestSkipBodyAnswersAStalledClient: a client sends headers announcing a body, then stalls.
// With SkipBody, the 415 decided by the headers reaches it while it is still stalled, says
// Connection: close, and the server closes the connection, having read the headers alone. The
// broken variant (the same answer without SkipBody) shows what it prevents: the server reads
// the body before it writes the answer, so a client that never sends it is never answered.
func TestSkipBodyAnswersAStalledClient(t *testing.T) {
	t.Parallel()
	const head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\n"
	const body = "0123456789"
	serve := func(skip bool) (addr string, answered chan struct{}, readAtAnswer chan int64) {
		answered, readAtAnswer = make(chan struct{}), make(chan int64, 1)
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer close(answered)
			if skip {
				reqbody.SkipBody(w, r)
			}
			w.WriteHeader(http.StatusUnsupportedMediaType)
			fmt.Fprint(w, reqbody.ErrNotJSONType)
		}))
		srv.Listener = readCounter{Listener: srv.Listener, readAtAnswer: readAtAnswer}
		srv.Start()
		t.Cleanup(srv.Close)
		return srv.Listener.Addr().String(), answered, readAtAnswer
	}
	dial := func(addr string) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
		// A bound so that a missing answer fails the test instead of hanging it.
		_ = c.SetReadDeadline(time.Now().Add(4 * reqbody.ReadTimeout))
		return c
	}

	addr, _, readAtAnswer := serve(true)
	var answered chan struct{}
	c := dial(addr)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("SkipBody: the stalled client got no answer: %v", err)
	}
	_, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusUnsupportedMediaType || !resp.Close {
		t.Errorf("SkipBody: %s (close %t), want 415 with Connection: close", resp.Status, resp.Close)
	}
	if n := <-readAtAnswer; n != int64(len(head)) {
		t.Errorf("SkipBody: the server had read %d bytes when it answered, want the %d of the headers alone", n, len(head))
	}
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("SkipBody: after the answer, read %d bytes, %v; want io.EOF, the connection closed", n, err)
	}

	addr, answered, readAtAnswer = serve(false)
	c = dial(addr)
	<-answered // the handler has returned: its answer waits in the server's buffer
	if _, err := io.WriteString(c, body); err != nil {
		t.Fatal(err)
	}
	if resp, err = http.ReadResponse(bufio.NewReader(c), nil); err != nil {
		t.Fatalf("without SkipBody: no answer once the body was sent: %v", err)
	}
	if n := <-readAtAnswer; n != int64(len(head)+len(body)) || resp.Close {
		t.Errorf("without SkipBody: the server had read %d bytes when it answered (close %t), want %d, the body too, "+
			"on a kept connection: the broken variant no longer shows the wait", n, resp.Close, len(head)+len(body))
	}
}
