package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is this module's import path prefix.
const module = "github.com/mops/coupon-api/"

// operatorPackages are the packages of this module that couponops may be built from: the
// deployed code (shared/, schema), the operator verbs and the reconciliation they run.
var operatorPackages = []string{"cmd/couponops", "internal/ops/opsverbs", "internal/ops/reconcile", "schema"}

// toolLibraries are the tools' libraries (prefixes): the load generator, the latency proxy,
// the plotting of the isolation lab, progress bars, the test databases.
var toolLibraries = []string{
	"github.com/tsenart/vegeta",
	"github.com/Shopify/toxiproxy",
	"gonum.org/v1/plot",
	"github.com/schollz/progressbar",
	"github.com/peterldowns/pgtestdb",
}

// TestBuildsWithoutTools: `go list -deps .` (what the daily jobs' image is built from, tests
// excluded) holds, of this module, only shared/ and operatorPackages: no load generator, proxy,
// plotting, drill, isolation lab, throwaway PostgreSQL or couponctl, and none of the tools'
// libraries. The same check on couponctl, which the jobs were built from before, finds them.
func TestBuildsWithoutTools(t *testing.T) {
	t.Parallel()
	n, bad := toolDeps(t, ".")
	for _, b := range bad {
		t.Error("couponops's build depends on " + b)
	}
	t.Logf("couponops builds from %d packages", n)
	n, bad = toolDeps(t, "../couponctl")
	if len(bad) == 0 {
		t.Error("the check finds no tool in couponctl's build")
	}
	t.Logf("couponctl builds from %d packages, %d of them tools'", n, len(bad))
}

// toolDeps lists the packages pkg is built from and returns how many there are and which are
// the tools' (of this module outside shared/ and operatorPackages, or toolLibraries).
func toolDeps(t *testing.T, pkg string) (int, []string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"shared/db") {
		t.Fatalf("go list -deps %s does not list the database package: %q", pkg, deps)
	}
	var bad []string
	for _, dep := range deps {
		own, ok := strings.CutPrefix(dep, module)
		if ok && !strings.HasPrefix(own, "shared/") && !slices.Contains(operatorPackages, own) {
			bad = append(bad, dep+" (only shared/ and the operator packages are for production)")
		}
		for _, lib := range toolLibraries {
			if strings.HasPrefix(dep, lib) {
				bad = append(bad, dep+" (a tool's library, "+lib+")")
			}
		}
	}
	return len(deps), bad
}
