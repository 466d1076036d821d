package console

import (
	"fmt"
	"testing"
)

// verdict collects what a check found, so that the check can be run twice: on the code as it
// is, where it must find nothing, and on a broken variant, where it must find something.
type verdict struct{ problems []string }

// Errorf records a problem.
func (v *verdict) Errorf(format string, args ...any) {
	v.problems = append(v.problems, fmt.Sprintf(format, args...))
}

// brokenVariant is a broken form of the console kept as a fixture: name says what it does
// wrong, and check runs the check on it.
type brokenVariant struct {
	name  string
	check func(t *testing.T, v *verdict)
}

// checkAndBreak runs check on the console as it is, where every problem fails t, then each
// broken variant, where the check must record at least one problem: a check that passes a
// variant would not see the bug it stands for. The subtests are "fixed" and "broken=NAME".
func checkAndBreak(t *testing.T, check func(t *testing.T, v *verdict), variants ...brokenVariant) {
	t.Helper()
	t.Run("fixed", func(t *testing.T) {
		var v verdict
		check(t, &v)
		for _, p := range v.problems {
			t.Error(p)
		}
	})
	for _, b := range variants {
		t.Run("broken="+b.name, func(t *testing.T) {
			var v verdict
			b.check(t, &v)
			if len(v.problems) == 0 {
				t.Errorf("the check passed the broken variant %q: it would not see it", b.name)
				return
			}
			t.Logf("the broken variant %q is found: %d problems, the first: %s", b.name, len(v.problems), v.problems[0])
		})
	}
}
