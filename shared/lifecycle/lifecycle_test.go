package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/shared/envconf"
)

// probe is the function these tests serve through the framework, at /Probe: each test sets
// openProbe, its constructor.
var (
	probe     = NewFunction("Probe", func(ctx context.Context) (*Instance, error) { return openProbe(ctx) }, refuseText)
	openProbe func(context.Context) (*Instance, error)
)

func init() { functions.HTTP(probe.Name(), probe.ServeHTTP) }

func refuseText(w http.ResponseWriter, status int) {
	w.WriteHeader(status)
	io.WriteString(w, "refused")
}

// get sends GET url and returns the status and body, or the error as the body.
func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeDrainsThenCancelsThenCloses: served through the functions framework, at the stop a
// new request is refused (503); a request that finishes within the drain bound is answered; one
// that outlasts it sees its context cancelled and still answers; then the closers run, the
// server's first, and Serve returns nil. A later Start builds the function anew.
func TestServeDrainsThenCancelsThenCloses(t *testing.T) {
	entered := make(chan struct{}, 2)
	finish := make(chan struct{})
	var closed []string
	closer := func(name string) Closer {
		return Closer{Name: name, Close: func(context.Context) error { closed = append(closed, name); return nil }}
	}
	var builds atomic.Int32
	openProbe = func(context.Context) (*Instance, error) {
		builds.Add(1)
		return &Instance{Closers: []Closer{closer("pool")}, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Query().Get("wait") {
			case "finish":
				entered <- struct{}{}
				<-finish
				io.WriteString(w, "done")
			case "cancel":
				entered <- struct{}{}
				<-r.Context().Done()
				io.WriteString(w, "cancelled")
			default:
				io.WriteString(w, "pong")
			}
		})}, nil
	}
	port := proctest.FreePort(t)
	base := "http://127.0.0.1:" + port + "/Probe"
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- Serve(ctx, Server{Host: "127.0.0.1", Port: port, Functions: []*Function{probe}, Drain: 300 * time.Millisecond,
			Closers: []Closer{closer("telemetry")}, Log: slog.New(slog.DiscardHandler)})
	}()
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if status, body := get(base); status != http.StatusOK {
			return fmt.Errorf("GET %s: %d %s", base, status, body)
		}
		return nil
	})
	answers := make(chan string, 2)
	for _, wait := range []string{"finish", "cancel"} {
		go func() {
			_, body := get(base + "?wait=" + wait)
			answers <- wait + ": " + body
		}()
	}
	<-entered
	<-entered
	stop()
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if status, body := get(base); status != http.StatusServiceUnavailable || body != "refused" {
			return fmt.Errorf("a new request after the stop: %d %q, want 503 refused", status, body)
		}
		return nil
	})
	close(finish)
	got := []string{<-answers, <-answers}
	slices.Sort(got)
	if want := []string{"cancel: cancelled", "finish: done"}; !slices.Equal(got, want) {
		t.Errorf("answers %v, want %v", got, want)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v, want nil", err)
	}
	if want := []string{"telemetry", "pool"}; !slices.Equal(closed, want) {
		t.Errorf("closers ran %v, want %v", closed, want)
	}
	if _, err := probe.Start(context.Background()); err != nil || builds.Load() != 2 {
		t.Errorf("Start after the shutdown: %v, %d builds; want a second build", err, builds.Load())
	}
	_ = drain([]*Function{probe}, 0, slog.New(slog.DiscardHandler)) // shut down for the next test of probe
}

// TestStartWaitsOnlyAsLongAsItsCaller: a caller whose context ends while the build runs gets its
// context's error at once, without ending the build; the next caller gets what that one build
// made. A failed build is tried again by the next call.
func TestStartWaitsOnlyAsLongAsItsCaller(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var builds atomic.Int32
	inst := &Instance{Handler: http.NotFoundHandler()}
	f := NewFunction("Slow", func(ctx context.Context) (*Instance, error) {
		if builds.Add(1) == 1 {
			return nil, errors.New("first build fails")
		}
		select {
		case <-release:
			return inst, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}, refuseText)
	if _, err := f.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "first build fails") {
		t.Fatalf("first Start: %v, want the build's error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := f.Start(ctx)
		gaveUp <- err
	}()
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if n := builds.Load(); n != 2 {
			return fmt.Errorf("%d builds, want the second under way", n)
		}
		return nil
	})
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("Start after its caller gave up: %v, want context.Canceled", err)
	}
	// The build goes on for the others, unharmed by the first caller's cancel.
	got := make(chan *Instance, 1)
	go func() {
		in, _ := f.Start(context.Background())
		got <- in
	}()
	close(release)
	if in := <-got; in != inst || builds.Load() != 2 {
		t.Errorf("Start = %p after %d builds, want %p from the second", in, builds.Load(), inst)
	}
}

// TestFirstRequestStartsTheFunction: served by the framework alone, without a Start, the first
// request builds the function; while its build fails, a request is answered 500 in the
// function's words and the error is logged; the next request builds again and is served.
func TestFirstRequestStartsTheFunction(t *testing.T) {
	t.Parallel()
	var builds atomic.Int32
	f := NewFunction("Lazy", func(context.Context) (*Instance, error) {
		if builds.Add(1) == 1 {
			return nil, errors.New("not migrated: run couponctl migrate")
		}
		return &Instance{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "served") })}, nil
	}, refuseText)
	for _, want := range []struct {
		status int
		body   string
	}{{500, "refused"}, {200, "served"}, {200, "served"}} {
		rec := httptest.NewRecorder()
		f.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if rec.Code != want.status || rec.Body.String() != want.body {
			t.Errorf("%d %q, want %d %q", rec.Code, rec.Body.String(), want.status, want.body)
		}
	}
	if n := builds.Load(); n != 2 {
		t.Errorf("%d builds, want 2 (one failed, one kept)", n)
	}
}

// TestFunctionTargetMustNameTheFunction: the framework serves FUNCTION_TARGET alone, so Serve
// refuses one that names another function, and a main refuses to serve under another's name.
func TestFunctionTargetMustNameTheFunction(t *testing.T) {
	t.Setenv("FUNCTION_TARGET", "Other")
	if err := Serve(context.Background(), Server{Functions: []*Function{probe}}); err == nil || !strings.Contains(err.Error(), "Other") {
		t.Errorf("Serve with FUNCTION_TARGET=Other: %v, want a refusal naming it", err)
	}
	if err := nameTarget("Probe"); err == nil {
		t.Errorf("nameTarget(Probe) under FUNCTION_TARGET=Other: nil, want a refusal")
	}
	t.Setenv("FUNCTION_TARGET", "")
	if err := nameTarget("Probe"); err != nil {
		t.Fatal(err)
	}
	if got := os.Getenv("FUNCTION_TARGET"); got != "Probe" {
		t.Errorf("FUNCTION_TARGET = %q after nameTarget, want Probe", got)
	}
}

// TestPortIsBounded: PORT defaults to 8080, and a value that is not a TCP port is refused,
// naming PORT and the range. The broken variant, unboundedPort, parses PORT without its bound
// (before issue 29, Port took PORT as given): the same checks must refuse it.
func TestPortIsBounded(t *testing.T) {
	for _, broken := range []bool{false, true} {
		port := Port
		if broken {
			port = unboundedPort
		}
		var wrong []string
		t.Setenv("PORT", "")
		if p, err := port(); p != "8080" || err != nil {
			wrong = append(wrong, fmt.Sprintf("unset PORT: %q %v, want 8080", p, err))
		}
		for _, bad := range []string{"0", "65536", "http", "-1"} {
			t.Setenv("PORT", bad)
			if _, err := port(); err == nil || !strings.Contains(err.Error(), "PORT") || !strings.Contains(err.Error(), "1..65535") {
				wrong = append(wrong, fmt.Sprintf("PORT=%s: %v, want an error naming PORT and 1..65535", bad, err))
			}
		}
		switch {
		case broken && len(wrong) == 0:
			t.Error("the broken variant passed: the test would not see a PORT beyond 1..65535 taken")
		case broken:
			t.Logf("the broken variant: %v", wrong)
		default:
			for _, w := range wrong {
				t.Error(w)
			}
		}
	}
}

// unboundedPort is [Port] parsing PORT without its bound (envconf.Int in place of IntIn).
func unboundedPort() (string, error) {
	p, err := envconf.Int("PORT", 8080)
	return strconv.Itoa(p), err
}

// TestPanicAnswers500: a handler that panics gets its caller the function's 500, as the
// functions framework's server gave it, not a dropped connection; the request is counted out.
func TestPanicAnswers500(t *testing.T) {
	t.Parallel()
	f := NewFunction("Panics", func(context.Context) (*Instance, error) {
		return &Instance{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("a bug") })}, nil
	}, refuseText)
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	if status, body := get(srv.URL); status != http.StatusInternalServerError || body != "refused" {
		t.Errorf("a panicking handler: %d %q, want 500 and the function's refusal", status, body)
	}
	if n := f.InFlight(); n != 0 {
		t.Errorf("in flight after the panic: %d, want 0", n)
	}
}
