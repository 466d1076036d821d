// Package codecheck holds checks of the project's own source.
package codecheck

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"

	"github.com/fzipp/gocyclo"
)

// maxComplexity is the most cyclomatic complexity a production function may have (issue 29).
const maxComplexity = 12

// production are the trees of code that runs deployed or at an operator's hand: the two
// functions and what they share, the schema's Go, the console, the commands (couponctl,
// couponops) and the operations they run, and the drill couponctl runs. internal/lab (the
// isolation lab and the audit) and internal/testkit are test and lab code.
var production = []string{"shared", "functions", "schema", "console", "cmd", "internal/ops", "internal/lab/drill"}

// TestNoProductionFunctionAboveComplexity12 measures every function of the production trees with
// gocyclo (tests excluded) and names each one above maxComplexity.
func TestNoProductionFunctionAboveComplexity12(t *testing.T) {
	over := analyze(t, production).SortAndFilter(-1, maxComplexity)
	for _, s := range over {
		t.Errorf("%s: %s.%s has cyclomatic complexity %d, above %d", s.Pos, s.PkgName, s.FuncName, s.Complexity, maxComplexity)
	}
}

// TestComplexityCheckSeesTheLab shows the check can fail: the lab's audit, outside the production
// trees, has functions above maxComplexity.
func TestComplexityCheckSeesTheLab(t *testing.T) {
	if over := analyze(t, []string{"internal/lab/audit"}).SortAndFilter(-1, maxComplexity); len(over) == 0 {
		t.Fatal("no function of internal/lab/audit is above 12: the check would pass anything")
	}
}

// analyze is gocyclo's statistics of the non-test Go files under dirs, relative to the module root.
func analyze(t *testing.T, dirs []string) gocyclo.Stats {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	paths := make([]string, len(dirs))
	for i, d := range dirs {
		paths[i] = filepath.Join(root, d)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Fatal(err) // gocyclo.Analyze skips a path it cannot read
		}
	}
	return gocyclo.Analyze(paths, regexp.MustCompile(`_test\.go$`))
}
