// Package lifecycle starts and stops the functions as Cloud Run expects: [OpenDB] opens the
// pool and checks the database before anything serves, [Serve] serves until SIGTERM, then
// drains and closes what was opened, and [Main] is a deployable main's body, both together.
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

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
)

// Cloud Run's shutdown: SIGTERM, then SIGKILL 10 s later (Cloud Run docs, "Container runtime
// contract: instance shutdown"). The bounds below add up to 9.5 s: drain, cancel, then the
// telemetry flush and the pool's close.
const (
	// DrainTimeout bounds how long in-flight requests may run after SIGTERM before their
	// contexts are cancelled. An IssueCoupon call ends within its 2.5 s budget, well inside it;
	// a relay run is cancelled and releases the rows it has not pushed.
	DrainTimeout = 5 * time.Second
	// CancelledRequestsTimeout bounds how long the requests whose contexts were cancelled at
	// the end of the drain get to answer and hand their connections back (a cancelled query
	// stops within [db.CancelGrace]; a relay releases the rows it has not pushed).
	CancelledRequestsTimeout = 1500 * time.Millisecond
	// FlushTimeout bounds the telemetry flush ([TelemetryFlush]): an instance that was idle may
	// need a new access token and a new TLS connection to Google's Telemetry API before the
	// last spans and metrics go out.
	FlushTimeout = 2 * time.Second
	// CloseTimeout bounds any other closer, such as the pool's close (256 connections took
	// over 0.5 s on the 2-core build machine).
	CloseTimeout = time.Second
)

// Closer is one step of the shutdown sequence, run after the server has stopped. It gets a
// context bounded by Timeout, or [CloseTimeout] when Timeout is zero.
type Closer struct {
	Name    string
	Close   func(context.Context) error
	Timeout time.Duration
}

// TelemetryFlush is the closer that flushes telemetry with shutdown (from telemetry.Setup),
// bounded by [FlushTimeout].
func TelemetryFlush(shutdown func(context.Context) error) Closer {
	return Closer{Name: "telemetry flush", Close: shutdown, Timeout: FlushTimeout}
}

// DB is a pool opened by [OpenDB].
type DB struct {
	// Pool is the pool, checked by [schema.Check].
	Pool *pgxpool.Pool
	// Closer closes Pool (and the Cloud SQL dialer), waiting for its connections to come back.
	Closer Closer
	// Settings is the pool's effective settings, for the start-up line ([db.Config.Describe]).
	Settings string
}

// OpenDB opens the pool from the environment ([db.ConfigFromEnv]: DATABASE_URL or the Cloud
// SQL connector, DB_POOL_MAX_CONNS) and runs [schema.Check] on it. Errors say what is wrong
// (unreachable, refused login, not migrated: run `couponctl migrate`).
func OpenDB(ctx context.Context) (*DB, error) {
	c, err := db.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	pool, closePool, err := db.Open(ctx, c)
	if err != nil {
		return nil, err
	}
	if err := schema.Check(ctx, pool); err != nil {
		closePool()
		return nil, err
	}
	closer := Closer{Name: "database pool", Close: func(ctx context.Context) error {
		closed := make(chan struct{})
		go func() { closePool(); close(closed) }()
		select {
		case <-closed:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("connections still in use: %w", ctx.Err())
		}
	}}
	return &DB{Pool: pool, Closer: closer, Settings: c.Describe(pool)}, nil
}

// Server is what [Serve] runs.
type Server struct {
	// Addr is the listen address, such as ":8080".
	Addr string
	// Handler serves every request.
	Handler http.Handler
	// Closers run in order once the server has stopped: the telemetry flush first, while the
	// pool still serves the gauges that read the database at the last export, then the pool.
	Closers []Closer
	// Log gets the shutdown's progress. Default slog.Default().
	Log *slog.Logger
	// Stop, when set, starts the shutdown when closed, as SIGTERM does (tests).
	Stop <-chan struct{}
	// Drain overrides [DrainTimeout] (tests).
	Drain time.Duration
}

// Serve serves s until SIGTERM or SIGINT (or ctx's end, or s.Stop), then shuts down: it stops
// accepting, waits up to [DrainTimeout] for in-flight requests, cancels the contexts of those
// still running and waits up to [CancelledRequestsTimeout] more, then runs the closers. It
// returns nil after a clean shutdown; the error of the listener or of a closer otherwise.
func Serve(ctx context.Context, s Server) error {
	log := s.Log
	if log == nil {
		log = slog.Default()
	}
	sig, stopSignals := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stopSignals()
	reqCtx, cancelRequests := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRequests()
	srv := &http.Server{
		Addr:              s.Addr,
		Handler:           s.Handler,
		BaseContext:       func(net.Listener) context.Context { return reqCtx },
		ReadHeaderTimeout: 10 * time.Second, // a client that never finishes its headers holds nothing
	}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()

	var errs []error
	select {
	case err := <-served:
		errs = append(errs, fmt.Errorf("lifecycle: serve %s: %w", s.Addr, err))
	case <-sig.Done():
	case <-s.Stop:
	}
	if len(errs) == 0 {
		bound := cmp.Or(s.Drain, DrainTimeout)
		log.Info("shutting down: no new requests; draining those in flight", "drain", bound)
		errs = append(errs, drain(srv, bound, cancelRequests, log))
	}
	for _, c := range s.Closers {
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

// drain stops srv accepting and waits for its in-flight requests: bound as they are, then
// [CancelledRequestsTimeout] after cancelling their contexts.
func drain(srv *http.Server, bound time.Duration, cancelRequests context.CancelFunc, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if err := srv.Shutdown(ctx); err == nil {
		return nil
	}
	log.Warn("drain bound reached: cancelling the requests still running", "grace", CancelledRequestsTimeout)
	cancelRequests()
	ctx, cancel = context.WithTimeout(context.Background(), CancelledRequestsTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		srv.Close()
		return fmt.Errorf("lifecycle: requests still running after the drain and grace: %w", err)
	}
	return nil
}

// Port is $PORT, where Cloud Run and the functions framework say to listen, or 8080.
func Port() string {
	if p := os.Getenv("PORT"); p != "" {
		return p
	}
	return "8080"
}
