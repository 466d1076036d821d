// Command issue is IssueCoupon's deployable main, as Cloud Run runs it (built by the Go
// buildpack with GOOGLE_BUILDABLE=./functions/issue/cmd): [lifecycle.Main] starts the functions
// framework on the function functions/issue registers, at "/" on $PORT.
package main

import (
	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/shared/lifecycle"
)

func main() { lifecycle.Main(issue.Function) }
