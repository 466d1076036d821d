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
