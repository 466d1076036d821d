// Command relay is RelayOutbox's deployable main, as Cloud Run runs it (built by the Go
// buildpack with GOOGLE_BUILDABLE=./functions/relay/cmd): [lifecycle.Main] starts the functions
// framework on the function functions/relay registers, at "/" on $PORT. Deploy it with a request
// timeout above the relay's run budget (RELAY_RUN_BUDGET).
package main

import (
	"github.com/mops/coupon-api/functions/relay"
	"github.com/mops/coupon-api/shared/lifecycle"
)

func main() { lifecycle.Main(relay.Function) }
