// Package lifecycle runs the functions as Cloud Run runs an instance: a [Function] is one
// function as the functions framework serves it (built once per instance, its requests counted),
// [OpenDB] opens the pool and checks the database before anything serves, [Serve] serves
// functions at the framework's paths, on an http.Server that bounds a request's headers, until
// SIGTERM, then drains them and closes what they opened,
// and [Main] is a deployable main's body. docs/design.md, "One request", draws the path.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/envconf"
)

// Cloud Run's shutdown: SIGTERM, then SIGKILL 10 s later (Cloud Run docs, "Container runtime
// contract: instance shutdown"). The bounds below add up to 9.5 s: drain, cancel, then the
// telemetry flush and the pool's close.
const (
	// DrainTimeout bounds how long in-flight requests may run after SIGTERM before their
	// contexts are cancelled. An IssueCoupon call ends within its budget, inside it; a relay
	// run is cancelled and releases the rows it has not pushed.
	DrainTimeout = 5 * time.Second
	// CancelledRequestsTimeout bounds how long the requests whose contexts were cancelled at
	// the end of the drain get to answer and hand their connections back (a cancelled query
	// stops within [db.CancelGrace]; a relay releases the rows it has not pushed).
	CancelledRequestsTimeout = 1500 * time.Millisecond
	// FlushTimeout bounds the telemetry flush ([TelemetryFlush]): an instance that was idle may
	// need a new access token and a new TLS connection to Google's Telemetry API before the
	// last spans and metrics go out.
	FlushTimeout = 2 * time.Second
	// CloseTimeout bounds any other closer, such as the pool's close.
	CloseTimeout = time.Second
)

// Closer is one step of the shutdown sequence, run after the drain. It gets a context bounded
// by Timeout, or [CloseTimeout] when Timeout is zero.
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
	// Read is the read pool opened beside Pool ([OpenReadDB]), closed after it; nil when none.
	Read *DB
}

// OpenDB opens the pool from the environment ([db.ConfigFromEnv]: DATABASE_URL or the Cloud
// SQL connector, DB_POOL_MAX_CONNS) and runs [schema.Check] on it. Errors say what is wrong
// (unreachable, refused login, not migrated: run `couponctl migrate`).
func OpenDB(ctx context.Context) (*DB, error) {
	c, err := db.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return openChecked(ctx, c, "database pool")
}

// OpenReadDB opens the read pool from the environment ([db.ReadConfigFromEnv]:
// DATABASE_READ_URL or READ_INSTANCE_CONNECTION_NAME, with the primary's other settings) and
// runs [schema.Check] on it, as [OpenDB] does; nil, and no error, when neither is set.
func OpenReadDB(ctx context.Context) (*DB, error) {
	c, ok, err := db.ReadConfigFromEnv()
	if err != nil || !ok {
		return nil, err
	}
	d, err := openChecked(ctx, c, "read pool")
	if err != nil {
		return nil, fmt.Errorf("read pool: %w", err)
	}
	return d, nil
}

// openChecked opens the pool of c, checks its schema, and names its closer name.
func openChecked(ctx context.Context, c db.Config, name string) (*DB, error) {
	pool, closePool, err := db.Open(ctx, c)
	if err != nil {
		return nil, err
	}
	if err := schema.Check(ctx, pool); err != nil {
		closePool()
		return nil, err
	}
	closer := Closer{Name: name, Close: func(ctx context.Context) error {
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

// Serving is the last step of a function's constructor: the [Instance] serving h on d, with
// settings and d's own for the start-up line and d's closer (and d.Read's); or, when building h
// failed (err), that error, d (and d.Read) closed.
func (d *DB) Serving(h http.Handler, err error, settings ...any) (*Instance, error) {
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), CloseTimeout)
		defer cancel()
		err = errors.Join(err, d.Closer.Close(ctx))
		if d.Read != nil {
			err = errors.Join(err, d.Read.Closer.Close(ctx))
		}
		return nil, err
	}
	in := &Instance{Handler: h, Settings: append(settings, "db", d.Settings), Closers: []Closer{d.Closer}}
	if d.Read != nil {
		in.Settings = append(in.Settings, "read_db", d.Read.Settings)
		in.Closers = append(in.Closers, d.Read.Closer)
	}
	return in, nil
}

// Port is $PORT, where Cloud Run and the functions framework say to listen, or 8080. Errors: a
// PORT that is not a TCP port, 1..65535, naming it.
func Port() (string, error) {
	p, err := envconf.IntIn("PORT", 8080, 1, 65535)
	return strconv.Itoa(p), err
}
