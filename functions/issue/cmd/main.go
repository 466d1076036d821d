// Command issue serves the IssueCoupon function on $PORT (default 8080), as Cloud Run runs it
// (built by the Go buildpack with GOOGLE_BUILDABLE=./functions/issue/cmd).
//
// Before serving it sets up telemetry from the OTEL_* environment (shared/telemetry), reads and
// validates its settings (MONTHLY_CAP_YEN, ISSUE_BUDGET, ISSUE_LOCK_TIMEOUT,
// ISSUE_STATEMENT_TIMEOUT, DATABASE_URL or the Cloud SQL variables, DB_POOL_MAX_CONNS), checks
// that the database is reachable and migrated, prints the effective settings once, and exits 1
// with the reason if anything is wrong. On SIGTERM it drains, flushes the telemetry, closes
// the pool and exits 0 (shared/lifecycle).
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/shared/issuance"
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
	cfg, err := issuance.ConfigFromEnv()
	if err != nil {
		return err
	}
	pool, closePool, dbSettings, err := lifecycle.OpenDB(ctx)
	if err != nil {
		return err
	}
	h, err := issue.NewHandler(pool, cfg)
	if err != nil {
		return err
	}
	if err := issue.RegisterGauges(pool); err != nil {
		return err
	}
	addr := ":" + lifecycle.Port()
	slog.Info("IssueCoupon: serving", "addr", addr, "issuance", cfg.String(), "db", dbSettings,
		"drain", lifecycle.DrainTimeout)
	return lifecycle.Serve(ctx, lifecycle.Server{Addr: addr, Handler: issue.Instrument(h), Closers: []lifecycle.Closer{
		lifecycle.TelemetryFlush(shutdownTelemetry),
		closePool,
	}})
}
