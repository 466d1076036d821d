// Command issue serves the IssueCoupon function on $PORT (default 8080), as Cloud Run runs it
// (built by the Go buildpack with GOOGLE_BUILDABLE=./functions/issue/cmd).
//
// Before serving it sets up telemetry from the OTEL_* environment (shared/telemetry), starts the
// function as every other entry point does (issue.Start: its settings, then the database,
// reachable and migrated), prints the effective settings once, and exits 1 with the reason if
// anything is wrong. On SIGTERM it drains, flushes the telemetry, closes the pool and exits 0
// (shared/lifecycle).
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/shared/lifecycle"
	"github.com/mops/coupon-api/shared/telemetry"
)

func main() {
	if err := run(context.Background()); err != nil {
		slog.Error("IssueCoupon: " + err.Error())
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
	h, settings, err := issue.Start(ctx, open)
	if err != nil {
		return err
	}
	addr := ":" + lifecycle.Port()
	slog.Info("IssueCoupon: serving", "addr", addr, "issuance", settings, "db", d.Settings,
		"drain", lifecycle.DrainTimeout)
	return lifecycle.Serve(ctx, lifecycle.Server{Addr: addr, Handler: issue.Instrument(h), Closers: []lifecycle.Closer{
		lifecycle.TelemetryFlush(shutdownTelemetry),
		d.Closer,
	}})
}
