// Command withoutskipbody is the broken variant of this deployable main kept as a test fixture
// (TestStalledClientsDoNotHoldTheShutdown): IssueCoupon answering as before 333c614, without
// reqbody.SkipBody (proctest.WithoutSkipBody), so that a client that stalls before its body
// gets no answer and holds the drain at SIGTERM (issue 29). Under testdata, go build ./... and
// go test ./... leave it out; the test builds it.
package main

import (
	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/shared/lifecycle"
)

func main() { lifecycle.Main(proctest.WithoutSkipBody(issue.Function.Name(), issue.Open)) }
