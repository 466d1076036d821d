package main

import (
	"testing"

	"github.com/mops/coupon-api/internal/testkit/depcheck"
)

// consoleBuild is what the console's deployable main may be built from: of this module, the
// console, the deployed code (shared/, schema) and the operator code it changes campaigns and
// coupons with (internal/ops/), not the labs (internal/lab/), the test kits (internal/testkit/)
// nor the commands; a service, none of the tools' libraries nor the CLI framework.
var consoleBuild = depcheck.Build{Own: []string{"console", "console/cmd", "schema", "shared/", "internal/ops/"}, Service: true}

// TestBuildsWithoutTools: `go list -deps .` (what Cloud Run's coupon-console service is built
// from, tests excluded) holds only what consoleBuild allows.
func TestBuildsWithoutTools(t *testing.T) {
	t.Parallel()
	n, bad := consoleBuild.Refused(t, ".")
	for _, b := range bad {
		t.Errorf("the console's build depends on %s", b)
	}
	t.Logf("console/cmd builds from %d packages", n)
}

// TestToolDepsRefusesCouponctl: the check, run on couponctl's build, which serves the same
// console locally (`couponctl console`) beside the labs and the throwaway PostgreSQL, refuses a
// lab, a test kit, another command's package, and vegeta, toxiproxy, gonum and cobra.
func TestToolDepsRefusesCouponctl(t *testing.T) {
	t.Parallel()
	n, bad := consoleBuild.Refused(t, "../../cmd/couponctl")
	t.Logf("couponctl builds from %d packages, %d of them refused", n, len(bad))
	depcheck.MustRefuse(t, bad, depcheck.Module+"internal/lab/", depcheck.Module+"internal/testkit/",
		depcheck.Module+"cmd/couponctl", "github.com/tsenart/vegeta", "github.com/Shopify/toxiproxy", "gonum.org/v1/",
		"github.com/spf13/cobra")
}
