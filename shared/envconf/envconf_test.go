package envconf

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestBoundsAreNamed: a value outside its range is refused with the variable's name and the
// range, an explicit zero included (never taken for "unset"), and so is an integer beyond int;
// unset or empty takes the default; a value in range is taken. The broken variant is the parse
// without its bound (Int and Duration in place of IntIn and DurationIn), as settings were read
// before issue 29, when MONTHLY_CAP_YEN=3000000000 started a server whose every request
// answered 503: the same checks must refuse it.
func TestBoundsAreNamed(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			intIn, durationIn := IntIn, DurationIn
			if broken {
				intIn, durationIn = unboundedInt, unboundedDuration
			}
			wrong := boundsAreNamed(t, intIn, durationIn)
			if broken {
				if len(wrong) == 0 {
					t.Fatal("the broken variant passed: the test would not see a setting beyond its range taken")
				}
				t.Logf("the broken variant: %v", wrong)
				return
			}
			for _, w := range wrong {
				t.Error(w)
			}
		})
	}
}

// boundsAreNamed runs TestBoundsAreNamed's checks on intIn and durationIn and returns what they
// found wrong.
func boundsAreNamed(t *testing.T, intIn func(string, int, int, int) (int, error),
	durationIn func(string, time.Duration, time.Duration, time.Duration) (time.Duration, error)) (wrong []string) {
	for _, v := range []string{"0", "-1", "11", "3000000000", "99999999999999999999", "ten"} {
		t.Setenv("X_INT", v)
		if _, err := intIn("X_INT", 7, 1, 10); err == nil || !strings.Contains(err.Error(), "X_INT") || !strings.Contains(err.Error(), "1..10") {
			wrong = append(wrong, fmt.Sprintf("IntIn(X_INT=%s, 1..10): %v, want an error naming X_INT and its range", v, err))
		}
	}
	for _, v := range []string{"0s", "0", "-1ms", "999us", "3001ms", "soon"} {
		t.Setenv("X_DUR", v)
		if _, err := durationIn("X_DUR", time.Second, time.Millisecond, 3*time.Second); err == nil ||
			!strings.Contains(err.Error(), "X_DUR") || !strings.Contains(err.Error(), "1ms..3s") {
			wrong = append(wrong, fmt.Sprintf("DurationIn(X_DUR=%s, 1ms..3s): %v, want an error naming X_DUR and its range", v, err))
		}
	}
	t.Setenv("X_INT", "")
	t.Setenv("X_DUR", "")
	if n, err := intIn("X_INT", 7, 1, 10); n != 7 || err != nil {
		wrong = append(wrong, fmt.Sprintf("unset X_INT: %d %v, want the default 7", n, err))
	}
	if d, err := durationIn("X_DUR", time.Second, time.Millisecond, 3*time.Second); d != time.Second || err != nil {
		wrong = append(wrong, fmt.Sprintf("unset X_DUR: %s %v, want the default 1s", d, err))
	}
	t.Setenv("X_INT", "10")
	t.Setenv("X_DUR", "250ms")
	if n, err := intIn("X_INT", 7, 1, 10); n != 10 || err != nil {
		wrong = append(wrong, fmt.Sprintf("X_INT=10: %d %v", n, err))
	}
	if d, err := durationIn("X_DUR", time.Second, time.Millisecond, 3*time.Second); d != 250*time.Millisecond || err != nil {
		wrong = append(wrong, fmt.Sprintf("X_DUR=250ms: %s %v", d, err))
	}
	return wrong
}

// unboundedInt is IntIn without its bound: the plain parse, lo and hi unused.
func unboundedInt(name string, def, _, _ int) (int, error) { return Int(name, def) }

// unboundedDuration is DurationIn without its bound: the plain parse, lo and hi unused.
func unboundedDuration(name string, def, _, _ time.Duration) (time.Duration, error) {
	return Duration(name, def)
}
