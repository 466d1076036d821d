// Command issue is IssueCoupon's deployable main, as Cloud Run runs it (built by the Go
// buildpack with GOOGLE_BUILDABLE=./functions/issue/cmd): it starts the functions framework,
// which serves the function registered by functions/issue, at "/" on $PORT (default 8080).
// shared/lifecycle's Main does the rest: the start-up check, the effective settings logged
// once, exit 1 with the reason on failure, and the drain on SIGTERM.
package main

import (
	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/shared/lifecycle"
)

func main() { lifecycle.Main(issue.Function) }
