package lifecycle

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"
)

// TestServeDrainsThenCancelsThenCloses: at the stop, a request that finishes within the drain
// bound is answered; one that outlasts it sees its context cancelled (a relay run then stops
// claiming) and still answers; then the closers run, in order, and Serve returns nil.
func TestServeDrainsThenCancelsThenCloses(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	entered := make(chan struct{}, 2)
	finish := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/quick", func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-finish
		io.WriteString(w, "done")
	})
	mux.HandleFunc("/long", func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-r.Context().Done()
		io.WriteString(w, "cancelled")
	})
	var closed []string
	closer := func(name string) Closer {
		return Closer{Name: name, Close: func(context.Context) error { closed = append(closed, name); return nil }}
	}
	stop := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		served <- Serve(context.Background(), Server{Addr: addr, Handler: mux, Stop: stop, Drain: 300 * time.Millisecond,
			Closers: []Closer{closer("telemetry"), closer("pool")}, Log: slog.New(slog.DiscardHandler)})
	}()
	waitUntil(t, "Serve accepts connections", func() bool { return accepts(addr) })
	answers := make(chan string, 2)
	for _, path := range []string{"/quick", "/long"} {
		go func() {
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				answers <- path + ": " + err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers <- path + ": " + string(b)
		}()
	}
	<-entered
	<-entered
	close(stop)
	waitUntil(t, "the shutdown closes the listener", func() bool { return !accepts(addr) })
	close(finish)
	got := []string{<-answers, <-answers}
	slices.Sort(got)
	if want := []string{"/long: cancelled", "/quick: done"}; !slices.Equal(got, want) {
		t.Errorf("answers %v, want %v", got, want)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v, want nil", err)
	}
	if want := []string{"telemetry", "pool"}; !slices.Equal(closed, want) {
		t.Errorf("closers ran %v, want %v", closed, want)
	}
}

// accepts reports whether something accepts TCP connections at addr.
func accepts(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// waitUntil polls cond every 5 ms until it holds, and fails the test if it does not within 5 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
