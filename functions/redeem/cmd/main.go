// Command redeem is RedeemCoupon's deployable main, as Cloud Run runs it (built by the Go
// buildpack with GOOGLE_BUILDABLE=./functions/redeem/cmd): [lifecycle.Main] starts the functions
// framework on the function functions/redeem registers, at "/" on $PORT.
package main

import (
	"github.com/mops/coupon-api/functions/redeem"
	"github.com/mops/coupon-api/shared/lifecycle"
)

func main() { lifecycle.Main(redeem.Function) }
