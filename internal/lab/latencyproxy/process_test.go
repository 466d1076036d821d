package latencyproxy

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
)

// TestServe: the child's side of [Process]: it names its address, answers each round trip with
// "ok" or the error, and returns when its input ends, closing the proxy.
func TestServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- Serve(ln.Addr().String(), inR, outW); outW.Close() }()
	out := bufio.NewReader(outR)
	line, err := out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening 127.0.0.1:") {
		t.Fatalf("first line %q %v, want listening 127.0.0.1:PORT", line, err)
	}
	for _, c := range []struct{ send, want string }{
		{"1ms", "ok"}, {"500us", "ok"}, {"0", "ok"},
		{"-1ms", "error: latencyproxy: round trip -1ms: must not be negative"},
		{"soon", `error: time: invalid duration "soon"`},
	} {
		if _, err := io.WriteString(inW, c.send+"\n"); err != nil {
			t.Fatal(err)
		}
		if got, err := out.ReadString('\n'); err != nil || strings.TrimSpace(got) != c.want {
			t.Errorf("%s: %q %v, want %q", c.send, got, err, c.want)
		}
	}
	inW.Close()
	if err := <-done; err != nil {
		t.Errorf("Serve after its input ended: %v", err)
	}
}
