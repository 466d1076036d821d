package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mops/coupon-api/shared/telemetry"
)

// HeaderTimeout bounds how long a connection may take to send a request's headers, and
// IdleTimeout how long a kept-alive connection may wait for its next request (http.Server's
// ReadHeaderTimeout and IdleTimeout). The app gateway gives up on IssueCoupon after 3 s
// (issuance.AppTimeout), so no caller waits for headers slower than that; a connection whose
// headers never end is closed then instead of being held. The body's own bound is
// reqbody.ReadTimeout.
const (
	HeaderTimeout = 3 * time.Second
	IdleTimeout   = 2 * time.Minute
)

// Server is what [Serve] serves.
type Server struct {
	// Host and Port are where it listens; Host "" is every interface.
	Host, Port string
	// Functions are started in order before anything is served. With FUNCTION_TARGET set,
	// that one function is served at "/", and it must be the only one, as the functions
	// framework does; unset, each is served at "/<Name>".
	Functions []*Function
	// NotFound answers, with FUNCTION_TARGET unset, a path that names no function. Default:
	// net/http's plain 404.
	NotFound http.Handler
	// Closers run after the drain and before the functions' own: the telemetry flush, while
	// the pools still serve the gauges that read the database at the last export.
	Closers []Closer
	// Log gets the start-up line and the shutdown's progress. Default slog.Default().
	Log *slog.Logger
	// Drain overrides [DrainTimeout] (tests).
	Drain time.Duration
}

// Serve starts s's functions, logs each one's effective settings once and serves them at the
// functions framework's paths (see [Server.Functions]) until SIGTERM or SIGINT (or ctx's end),
// on an http.Server of its own: the framework's own server (funcframework.StartHostPort) has
// no timeouts and no way to set one, and this one bounds the headers ([HeaderTimeout]). At the
// stop, new requests are refused (503; Cloud Run has stopped routing to the instance once it
// sends SIGTERM), the requests in flight get [DrainTimeout], those still running then see their
// contexts cancelled and get [CancelledRequestsTimeout] more; then the server closes its
// listener and every connection left (idle ones, and ones whose headers never came), and the
// closers run. It returns nil after a clean shutdown; otherwise the start's error, the
// listener's, or the requests still running and the closers' errors.
func Serve(ctx context.Context, s Server) error {
	log := cmp.Or(s.Log, slog.Default())
	if err := checkTarget(s.Functions); err != nil {
		return err
	}
	sig, stopSignals := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stopSignals()
	var started []*Function
	var closers []Closer
	var errs []error
	for _, f := range s.Functions {
		inst, err := f.Start(ctx)
		if err != nil {
			errs = append(errs, err)
			break
		}
		started = append(started, f)
		closers = append(closers, inst.Closers...)
		log.Info(f.Name()+": serving", append(append([]any{"addr", net.JoinHostPort(s.Host, s.Port)}, inst.Settings...),
			"drain", cmp.Or(s.Drain, DrainTimeout))...)
	}
	srv := &http.Server{Addr: net.JoinHostPort(s.Host, s.Port), Handler: s.handler(),
		ReadHeaderTimeout: HeaderTimeout, IdleTimeout: IdleTimeout}
	if len(errs) == 0 {
		errs = append(errs, listen(sig, srv))
		if sig.Err() != nil {
			var inFlight int64
			for _, f := range started {
				inFlight += f.InFlight()
			}
			log.Info("shutting down: new requests refused; draining those in flight", "in_flight", inFlight,
				"drain", cmp.Or(s.Drain, DrainTimeout))
		}
	}
	errs = append(errs, drain(started, cmp.Or(s.Drain, DrainTimeout), log))
	_ = srv.Close() // after the drain: only connections with no request in flight are left
	for _, c := range append(s.Closers, closers...) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmp.Or(c.Timeout, CloseTimeout))
		if err := c.Close(cctx); err != nil {
			errs = append(errs, fmt.Errorf("lifecycle: close %s: %w", c.Name, err))
		}
		cancel()
	}
	err := errors.Join(errs...)
	if err == nil {
		log.Info("shut down cleanly")
	}
	return err
}

// checkTarget refuses a FUNCTION_TARGET that would leave one of fns unserved: the framework
// serves that function alone.
func checkTarget(fns []*Function) error {
	target := os.Getenv("FUNCTION_TARGET")
	if target == "" || (len(fns) == 1 && fns[0].Name() == target) {
		return nil
	}
	names := make([]string, len(fns))
	for i, f := range fns {
		names[i] = f.Name()
	}
	return fmt.Errorf("FUNCTION_TARGET=%q: the framework would serve only that function, and this serves %v", target, names)
}

// handler routes as the functions framework does (funcframework.StartHostPort): with
// FUNCTION_TARGET set, its function (checkTarget: the only one) at "/"; unset, each function at
// "/<Name>" and [Server.NotFound] at every other path.
func (s Server) handler() http.Handler {
	mux := http.NewServeMux()
	if os.Getenv("FUNCTION_TARGET") != "" && len(s.Functions) == 1 {
		mux.Handle("/", s.Functions[0])
		return mux
	}
	for _, f := range s.Functions {
		mux.Handle("/"+f.Name(), f)
	}
	if s.NotFound != nil {
		mux.Handle("/", s.NotFound)
	}
	return mux
}

// listen serves srv until ctx ends, and returns nil then, or the listener's error (a port in
// use).
func listen(ctx context.Context, srv *http.Server) error {
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	select {
	case err := <-served:
		return fmt.Errorf("lifecycle: serve %s: %w", srv.Addr, err)
	case <-ctx.Done():
		return nil
	}
}

// drain refuses new requests to fns, waits up to bound for those in flight, cancels the
// contexts of those still running and waits up to [CancelledRequestsTimeout] more.
func drain(fns []*Function, bound time.Duration, log *slog.Logger) error {
	var runs []*run
	for _, f := range fns {
		if r := f.live.Load(); r != nil {
			r.draining.Store(true)
			runs = append(runs, r)
		}
	}
	if waitAll(runs, bound) {
		return nil
	}
	log.Warn("drain bound reached: cancelling the requests still running", "grace", CancelledRequestsTimeout)
	for _, r := range runs {
		r.cancelAll()
	}
	if waitAll(runs, CancelledRequestsTimeout) {
		return nil
	}
	var left int64
	for _, r := range runs {
		left += r.inflight.Load()
	}
	return fmt.Errorf("lifecycle: %d requests still running after the drain and its grace", left)
}

// waitAll waits, at most bound in all, until no run has a request in flight.
func waitAll(runs []*run, bound time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	idle := true
	for _, r := range runs {
		idle = r.wait(ctx) && idle
	}
	return idle
}

// Main is the body of a deployable main for f: it names f as the function the framework
// serves, sets up telemetry from the OTEL_* environment, and [Serve]s f on $PORT until SIGTERM:
// the start-up check and f's effective settings logged once, then the drain. It exits 0 after a
// clean shutdown; on any failure it logs the reason and exits 1 (before serving, a revision that
// cannot start never takes traffic).
func Main(f *Function) {
	if err := runMain(context.Background(), f); err != nil {
		slog.Error(f.Name() + ": " + err.Error())
		os.Exit(1)
	}
}

func runMain(ctx context.Context, f *Function) error {
	if err := nameTarget(f.Name()); err != nil {
		return err
	}
	port, err := Port()
	if err != nil {
		return err
	}
	shutdownTelemetry, err := telemetry.Setup(ctx)
	if err != nil {
		return err
	}
	return Serve(ctx, Server{Port: port, Functions: []*Function{f}, Closers: []Closer{TelemetryFlush(shutdownTelemetry)}})
}

// nameTarget sets FUNCTION_TARGET, the framework's way of choosing the function it serves at
// "/" ([Serve] routes as the framework does), to name: a deployable main is built and
// deployed as a service, and Cloud Run sets FUNCTION_TARGET only for the functions it builds
// from source. One naming another function is refused.
func nameTarget(name string) error {
	if t := os.Getenv("FUNCTION_TARGET"); t != "" && t != name {
		return fmt.Errorf("FUNCTION_TARGET=%q: this binary serves %s only; unset it", t, name)
	}
	return os.Setenv("FUNCTION_TARGET", name)
}
