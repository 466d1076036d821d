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
	"net/http"

	"github.com/mops/coupon-api/functions/relay"
	"github.com/mops/coupon-api/shared/lifecycle"
)

func main() {
	lifecycle.Main("RelayOutbox", func(ctx context.Context, open func(context.Context) (*lifecycle.DB, error)) (http.Handler, []any, error) {
		h, err := relay.Start(ctx, open)
		if err != nil {
			return nil, nil, err
		}
		return relay.Instrument(h), nil, nil
	})
}
