package main

import (
	"fmt"
	"testing"
)

// verdict collects what a check found, so that the check can be run twice: on the code as it is,
// where it must find nothing, and on a broken variant of it, where it must find something.
type verdict struct{ problems []string }

// Errorf records a problem.
func (v *verdict) Errorf(format string, args ...any) {
	v.problems = append(v.problems, fmt.Sprintf(format, args...))
}

// brokenVariant is a broken form of a fix kept as a fixture: name says what it does wrong, and
// install swaps it in for the rest of the (sub)test (it restores the code with t.Cleanup).
type brokenVariant struct {
	name    string
	install func(t *testing.T)
}

// swap sets *hook to broken until t ends: how a test installs a variant kept in a _test.go file
// through a package variable of the production code.
func swap[T any](t *testing.T, hook *T, broken T) {
	t.Helper()
	saved := *hook
	*hook = broken
	t.Cleanup(func() { *hook = saved })
}

// checkAndBreak runs check on the code as it is, where every problem it records fails t, then
// once with each broken variant installed, where it must record at least one problem: a check that
// passes a variant would not see the bug it stands for, and fails t. The subtests are named
// "fixed" and "broken=NAME" (go test -run 'TestX/broken' runs the variants alone).
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
			b.install(t)
			var v verdict
			check(t, &v)
			if len(v.problems) == 0 {
				t.Errorf("the check passed the broken variant %q: it would not see it", b.name)
				return
			}
			t.Logf("the broken variant %q is found: %d problems, the first: %s", b.name, len(v.problems), v.problems[0])
		})
	}
}
