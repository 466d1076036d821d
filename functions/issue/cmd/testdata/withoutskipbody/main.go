// Command withoutskipbody is the broken variant of this deployable main kept as a test fixture
// (TestStalledClientsDoNotHoldTheShutdown): IssueCoupon answering as before 333c614, without
// reqbody.SkipBody (bodywait.Function), so that a client that stalls before its body
// gets no answer and holds the drain at SIGTERM (issue 29). Under testdata, go build ./... and
// go test ./... leave it out; the test builds it.
package main

import (
	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/internal/testkit/bodywait"
	"github.com/mops/coupon-api/shared/lifecycle"
)

func main() { lifecycle.Main(bodywait.Function(issue.Function.Name(), issue.Open)) }
