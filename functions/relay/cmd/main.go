// Command relay serves the RelayOutbox function on $PORT (default 8080), as Cloud Run runs it
// (built by the Go buildpack with GOOGLE_BUILDABLE=./functions/relay/cmd). Deploy it with a
// request timeout above the relay's run budget (RELAY_RUN_BUDGET, 50 s by default;
// cloudbuild.yaml sets 90 s).
//
// Before serving it sets up telemetry from the OTEL_* environment (shared/telemetry), starts the
// function as every other entry point does (relay.Start: its settings, then the database,
// reachable and migrated), prints the effective settings once, and exits 1 with the reason if
// anything is wrong. On SIGTERM it stops taking requests, gives a run in flight the drain bound to finish,
// then cancels it (the relay then stops claiming and releases the rows it has not pushed),
// flushes the telemetry, closes the pool and exits 0 (shared/lifecycle).
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/mops/coupon-api/functions/relay"
	"github.com/mops/coupon-api/shared/lifecycle"
	"github.com/mops/coupon-api/shared/telemetry"
)

func main() {
	if err := run(context.Background()); err != nil {
		slog.Error("RelayOutbox: " + err.Error())
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	shutdownTelemetry, err := telemetry.Setup(ctx)
	if err != nil {
		return err
	}
	var d *lifecycle.DB // opened by Start once the settings are valid
	open := func(ctx context.Context) (*lifecycle.DB, error) {
		var err error
		d, err = lifecycle.OpenDB(ctx)
		return d, err
	}
	h, err := relay.Start(ctx, open)
	if err != nil {
		return err
	}
	addr := ":" + lifecycle.Port()
	slog.Info("RelayOutbox: serving", "addr", addr, "db", d.Settings, "drain", lifecycle.DrainTimeout)
	return lifecycle.Serve(ctx, lifecycle.Server{Addr: addr, Handler: relay.Instrument(h), Closers: []lifecycle.Closer{
		lifecycle.TelemetryFlush(shutdownTelemetry),
		d.Closer,
	}})
}
