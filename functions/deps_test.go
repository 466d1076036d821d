// Package functions_test checks what the deployable functions are built from.
package functions_test

import (
	"testing"

	"github.com/mops/coupon-api/internal/testkit/depcheck"

	// The functions, imported so that a change to what they import invalidates this test's
	// cached result (go test caches by the test binary's own dependencies).
	_ "github.com/mops/coupon-api/functions/issue"
	_ "github.com/mops/coupon-api/functions/redeem"
	_ "github.com/mops/coupon-api/functions/relay"
)

// TestFunctionsBuildWithoutTools: `go list -deps ./functions/...` (what Cloud Run builds, tests
// excluded) holds of this module only functions/, shared/ and schema, and none of the tools'
// libraries nor the CLI framework (depcheck), so a reader of functions/ and shared/ sees exactly
// what is deployed.
func TestFunctionsBuildWithoutTools(t *testing.T) {
	t.Parallel()
	build := depcheck.Build{Own: []string{"functions/", "shared/", "schema"}, Service: true}
	n, bad := build.Refused(t, "./issue/...", "./relay/...", "./redeem/...")
	for _, b := range bad {
		t.Errorf("a function's build depends on %s", b)
	}
	t.Logf("the functions build from %d packages", n)
}
