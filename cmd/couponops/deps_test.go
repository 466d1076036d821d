package main

import (
	"testing"

	"github.com/mops/coupon-api/internal/testkit/depcheck"
)

// operatorBuild is what couponops, and every operator package, may be built from: of this
// module, the deployed code (shared/, schema) and the operator code (internal/ops/), not the labs
// (internal/lab/), the test kits (internal/testkit/) nor the other commands; the CLI framework,
// but none of the tools' libraries.
var operatorBuild = depcheck.Build{Own: []string{"cmd/couponops", "schema", "shared/", "internal/ops/"}}

// TestBuildsWithoutTools: `go list -deps .` (what the daily jobs' image is built from, tests
// excluded), and the same of every package under internal/ops/ (what couponctl's operator
// verbs are built from), hold only what operatorBuild allows.
func TestBuildsWithoutTools(t *testing.T) {
	t.Parallel()
	for _, pkg := range []string{".", "../../internal/ops/..."} {
		n, bad := operatorBuild.Refused(t, pkg)
		for _, b := range bad {
			t.Errorf("%s's build depends on %s", pkg, b)
		}
		t.Logf("%s builds from %d packages", pkg, n)
	}
}

// TestToolDepsRefusesCouponctl: the check, run on couponctl's build (what the daily jobs were
// built from before couponops), refuses a lab, a test kit, and vegeta, toxiproxy and gonum.
func TestToolDepsRefusesCouponctl(t *testing.T) {
	t.Parallel()
	n, bad := operatorBuild.Refused(t, "../couponctl")
	t.Logf("couponctl builds from %d packages, %d of them refused", n, len(bad))
	depcheck.MustRefuse(t, bad, depcheck.Module+"internal/lab/", depcheck.Module+"internal/testkit/",
		"github.com/tsenart/vegeta", "github.com/Shopify/toxiproxy", "gonum.org/v1/")
}
