package lifecycle

import (
	"context"
	"log/slog"
	"net/http"
	"os"

	"github.com/mops/coupon-api/shared/telemetry"
)

// StartFunc builds a function's handler, instrumented, on the pool that open opens, and returns
// it with the key-value pairs of its settings for the start-up line.
type StartFunc func(ctx context.Context, open func(context.Context) (*DB, error)) (http.Handler, []any, error)

// Main is the body of a deployable main, for the function called name: it sets up telemetry
// from the OTEL_* environment, starts the function with [OpenDB] (the database reachable and
// migrated), logs the effective settings once and [Serve]s on $PORT until SIGTERM. On any
// failure before serving it logs the reason and exits 1.
func Main(name string, start StartFunc) {
	if err := run(context.Background(), name, start); err != nil {
		slog.Error(name + ": " + err.Error())
		os.Exit(1)
	}
}

func run(ctx context.Context, name string, start StartFunc) error {
	shutdownTelemetry, err := telemetry.Setup(ctx)
	if err != nil {
		return err
	}
	var d *DB // opened by start once the function's settings are valid
	open := func(ctx context.Context) (*DB, error) {
		var err error
		d, err = OpenDB(ctx)
		return d, err
	}
	h, settings, err := start(ctx, open)
	if err != nil {
		return err
	}
	addr := ":" + Port()
	slog.Info(name+": serving", append(append([]any{"addr", addr}, settings...), "db", d.Settings, "drain", DrainTimeout)...)
	return Serve(ctx, Server{Addr: addr, Handler: h, Closers: []Closer{TelemetryFlush(shutdownTelemetry), d.Closer}})
}
