// Command cmd is the console's deployable main, as Cloud Run's coupon-console service runs it
// (built by the Go buildpack with GOOGLE_BUILDABLE=./console/cmd): [lifecycle.Main] serves
// [console.Function] at "/" on $PORT, IAP assertions verified against Google's keys.
package main

import (
	"github.com/mops/coupon-api/console"
	"github.com/mops/coupon-api/shared/lifecycle"
)

func main() { lifecycle.Main(console.Function) }
