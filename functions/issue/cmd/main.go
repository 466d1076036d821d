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
	"net/http"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/shared/lifecycle"
)

func main() {
	lifecycle.Main("IssueCoupon", func(ctx context.Context, open func(context.Context) (*lifecycle.DB, error)) (http.Handler, []any, error) {
		h, settings, err := issue.Start(ctx, open)
		if err != nil {
			return nil, nil, err
		}
		return issue.Instrument(h), []any{"issuance", settings}, nil
	})
}
