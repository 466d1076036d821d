package envconf

import (
	"strings"
	"testing"
	"time"
)

// TestBoundsAreNamed: a value outside its range is refused with the variable's name and the
// range, an explicit zero included (never taken for "unset"), and so is an integer beyond int;
// unset or empty takes the default; a value in range is taken.
func TestBoundsAreNamed(t *testing.T) {
	for _, v := range []string{"0", "-1", "11", "3000000000", "99999999999999999999", "ten"} {
		t.Setenv("X_INT", v)
		if _, err := IntIn("X_INT", 7, 1, 10); err == nil || !strings.Contains(err.Error(), "X_INT") || !strings.Contains(err.Error(), "1..10") {
			t.Errorf("IntIn(X_INT=%s, 1..10): %v, want an error naming X_INT and its range", v, err)
		}
	}
	for _, v := range []string{"0s", "0", "-1ms", "999us", "3001ms", "soon"} {
		t.Setenv("X_DUR", v)
		if _, err := DurationIn("X_DUR", time.Second, time.Millisecond, 3*time.Second); err == nil ||
			!strings.Contains(err.Error(), "X_DUR") || !strings.Contains(err.Error(), "1ms..3s") {
			t.Errorf("DurationIn(X_DUR=%s, 1ms..3s): %v, want an error naming X_DUR and its range", v, err)
		}
	}
	t.Setenv("X_INT", "")
	t.Setenv("X_DUR", "")
	if n, err := IntIn("X_INT", 7, 1, 10); n != 7 || err != nil {
		t.Errorf("unset X_INT: %d %v, want the default 7", n, err)
	}
	if d, err := DurationIn("X_DUR", time.Second, time.Millisecond, 3*time.Second); d != time.Second || err != nil {
		t.Errorf("unset X_DUR: %s %v, want the default 1s", d, err)
	}
	t.Setenv("X_INT", "10")
	t.Setenv("X_DUR", "250ms")
	if n, err := IntIn("X_INT", 7, 1, 10); n != 10 || err != nil {
		t.Errorf("X_INT=10: %d %v", n, err)
	}
	if d, err := DurationIn("X_DUR", time.Second, time.Millisecond, 3*time.Second); d != 250*time.Millisecond || err != nil {
		t.Errorf("X_DUR=250ms: %s %v", d, err)
	}
}
