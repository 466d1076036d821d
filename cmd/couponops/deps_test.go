package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is this module's import path prefix.
const module = "github.com/mops/coupon-api/"

// operatorPrefixes are the packages (or, ending in "/", the trees) of this module that
// couponops, and every operator package, may be built from: the deployed code (shared/, schema)
// and the operator code (internal/ops/). The labs (internal/lab/), the test kits
// (internal/testkit/) and the commands are not.
var operatorPrefixes = []string{"cmd/couponops", "schema", "shared/", "internal/ops/"}

// toolLibraries are the tools' libraries (prefixes): the load generator, the latency proxy,
// the plotting and numerics of the isolation lab, progress bars, the test databases.
var toolLibraries = []string{
	"github.com/tsenart/vegeta",
	"github.com/Shopify/toxiproxy",
	"gonum.org/v1/",
	"github.com/schollz/progressbar",
	"github.com/peterldowns/pgtestdb",
}

// TestBuildsWithoutTools: `go list -deps .` (what the daily jobs' image is built from, tests
// excluded), and the same of every package under internal/ops/ (what couponctl's operator
// verbs are built from), hold of this module only operatorPrefixes, and none of the tools'
// libraries.
func TestBuildsWithoutTools(t *testing.T) {
	t.Parallel()
	for _, pkg := range []string{".", "../../internal/ops/..."} {
		n, bad := toolDeps(t, pkg)
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
	n, bad := toolDeps(t, "../couponctl")
	t.Logf("couponctl builds from %d packages, %d of them refused", n, len(bad))
	for _, want := range []string{module + "internal/lab/", module + "internal/testkit/",
		"github.com/tsenart/vegeta", "github.com/Shopify/toxiproxy", "gonum.org/v1/"} {
		if !slices.ContainsFunc(bad, func(b string) bool { return strings.HasPrefix(b, want) }) {
			t.Errorf("the check refuses nothing of %s in couponctl's build: %q", want, bad)
		}
	}
}

// toolDeps lists the packages pkg (a go list pattern) is built from and returns how many there
// are and which are refused: of this module outside operatorPrefixes, or of toolLibraries.
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
		if ok && !slices.ContainsFunc(operatorPrefixes, func(p string) bool {
			return own == p || strings.HasSuffix(p, "/") && strings.HasPrefix(own, p)
		}) {
			bad = append(bad, dep+" (of this module only shared/, schema and internal/ops/ are for operators)")
		}
		for _, lib := range toolLibraries {
			if strings.HasPrefix(dep, lib) {
				bad = append(bad, dep+" (a tool's library, "+lib+")")
			}
		}
	}
	return len(deps), bad
}
