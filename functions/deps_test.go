// Package functions_test checks what the deployable functions are built from.
package functions_test

import (
	"os/exec"
	"strings"
	"testing"

	// The functions, imported so that a change to what they import invalidates this test's
	// cached result (go test caches by the test binary's own dependencies).
	_ "github.com/mops/coupon-api/functions/issue"
	_ "github.com/mops/coupon-api/functions/relay"
)

// module is this module's import path prefix.
const module = "github.com/mops/coupon-api/"

// toolOnly are import paths (prefixes) that only couponctl and the tests may use: the isolation
// lab and its plotting, the Silver Week and load drivers, the throwaway PostgreSQL, the LINE
// stand-in, terminal progress bars and the CLI framework.
var toolOnly = []string{
	"github.com/mops/coupon-api/internal/",
	"github.com/mops/coupon-api/cmd/",
	"gonum.org/v1/plot",
	"github.com/tsenart/vegeta",
	"github.com/schollz/progressbar",
	"github.com/spf13/cobra",
	"github.com/peterldowns/pgtestdb",
	"github.com/Shopify/toxiproxy",
}

// TestFunctionsBuildWithoutTools: `go list -deps ./functions/...` (what Cloud Run builds, tests
// excluded) holds no tool-only package, so a reader of functions/ and shared/ sees exactly what
// is deployed.
func TestFunctionsBuildWithoutTools(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "./issue/...", "./relay/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps ./functions/...: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed %d packages: %q", len(deps), deps)
	}
	for _, dep := range deps {
		if deployable := strings.HasPrefix(dep, module+"shared/") || strings.HasPrefix(dep, module+"functions/") ||
			dep == module+"schema"; strings.HasPrefix(dep, module) && !deployable {
			t.Errorf("a function's build depends on %s: only functions/, shared/ and schema/ are deployed", dep)
		}
		for _, bad := range toolOnly {
			if strings.HasPrefix(dep, bad) {
				t.Errorf("a function's build depends on %s (tool-only %s)", dep, bad)
			}
		}
	}
}
