// Package depcheck checks what a deployed build is made of (tests only): the packages `go list
// -deps` lists for it, those of this module held to the trees it may be built from, and none of
// the tools' libraries. The functions' mains (functions/), the console's (console/cmd) and
// cmd/couponops each hold their build to it. go test's cache, keyed on the test binary's own
// dependencies, does not see what go list reads: a check's test imports the packages it checks
// (a main's own test does), so that a change to what they import runs it again.
package depcheck

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Module is this module's import path prefix.
const Module = "github.com/mops/coupon-api/"

// toolLibraries are the tools' libraries (prefixes), which no deployed build may hold: the load
// generator, the latency proxy, the plotting and numerics of the isolation lab, progress bars,
// the test databases.
var toolLibraries = []string{
	"github.com/tsenart/vegeta",
	"github.com/Shopify/toxiproxy",
	"gonum.org/v1/",
	"github.com/schollz/progressbar",
	"github.com/peterldowns/pgtestdb",
}

// cliLibrary is the commands' CLI framework, which a command may hold and a service may not.
const cliLibrary = "github.com/spf13/cobra"

// Build is what a deployed build may be made of.
type Build struct {
	// Own are the packages of this module it may hold: paths below Module, one ending in "/" a
	// tree.
	Own []string
	// Service is a service Cloud Run serves (a function, the console), which may not hold the
	// CLI framework either; a command (cmd/couponops) may.
	Service bool
}

// Refused lists the packages that patterns (go list patterns, from the test's directory) are
// built from, tests excluded, and returns how many there are and which b refuses, each with why:
// a package of this module outside b.Own, a tool's library, or, for a service, the CLI
// framework. It fails t when go list fails, or lists no shared/db, through which every deployed
// build reaches the database: a listing without it is not a build's.
func (b Build) Refused(t testing.TB, patterns ...string) (int, []string) {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-deps"}, patterns...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", strings.Join(patterns, " "), err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, Module+"shared/db") {
		t.Fatalf("go list -deps %s does not list the database package: %q", strings.Join(patterns, " "), deps)
	}
	libraries := toolLibraries
	if b.Service {
		libraries = append(slices.Clip(libraries), cliLibrary)
	}
	var bad []string
	for _, dep := range deps {
		own, ok := strings.CutPrefix(dep, Module)
		if ok && !slices.ContainsFunc(b.Own, func(p string) bool {
			return own == p || strings.HasSuffix(p, "/") && strings.HasPrefix(own, p)
		}) {
			bad = append(bad, dep+" (of this module only "+strings.Join(b.Own, ", ")+")")
		}
		for _, lib := range libraries {
			if strings.HasPrefix(dep, lib) {
				bad = append(bad, dep+" (a tool's library, "+lib+")")
			}
		}
	}
	return len(deps), bad
}

// MustRefuse fails t unless refused, what [Build.Refused] returned for a build it must refuse
// (a negative control), names a package under each of prefixes.
func MustRefuse(t testing.TB, refused []string, prefixes ...string) {
	t.Helper()
	for _, want := range prefixes {
		if !slices.ContainsFunc(refused, func(b string) bool { return strings.HasPrefix(b, want) }) {
			t.Errorf("the check refuses nothing of %s: %q", want, refused)
		}
	}
}
