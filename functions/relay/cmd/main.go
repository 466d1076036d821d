// Command relay is RelayOutbox's deployable main, as Cloud Run runs it (built by the Go
// buildpack with GOOGLE_BUILDABLE=./functions/relay/cmd): it starts the functions framework,
// which serves the function registered by functions/relay, at "/" on $PORT (default 8080).
// shared/lifecycle's Main does the rest: the start-up check, the effective settings (RELAY_*
// included) logged once, exit 1 with the reason on failure, and the drain on SIGTERM, after
// which a run still in flight is cancelled and releases the rows it has not pushed. Deploy it
// with a request timeout above the relay's run budget (RELAY_RUN_BUDGET).
package main

import (
	"github.com/mops/coupon-api/functions/relay"
	"github.com/mops/coupon-api/shared/lifecycle"
)

func main() { lifecycle.Main(relay.Function) }
