package envconf

import (
	"strings"
	"testing"
	"time"
)

// TestZeroIsNotDefault: an explicit zero or negative value of a positive setting is refused with
// the variable's name, never taken for "unset"; unset or empty takes the default.
func TestZeroIsNotDefault(t *testing.T) {
	for _, v := range []string{"0", "-1"} {
		t.Setenv("X_INT", v)
		if _, err := PositiveInt("X_INT", 7); err == nil || !strings.Contains(err.Error(), "X_INT") {
			t.Errorf("PositiveInt(X_INT=%s): %v, want an error naming X_INT", v, err)
		}
	}
	for _, v := range []string{"0s", "0", "-1ms"} {
		t.Setenv("X_DUR", v)
		if _, err := PositiveDuration("X_DUR", time.Second); err == nil || !strings.Contains(err.Error(), "X_DUR") {
			t.Errorf("PositiveDuration(X_DUR=%s): %v, want an error naming X_DUR", v, err)
		}
	}
	t.Setenv("X_INT", "")
	t.Setenv("X_DUR", "")
	if n, err := PositiveInt("X_INT", 7); n != 7 || err != nil {
		t.Errorf("unset X_INT: %d %v, want the default 7", n, err)
	}
	if d, err := PositiveDuration("X_DUR", time.Second); d != time.Second || err != nil {
		t.Errorf("unset X_DUR: %s %v, want the default 1s", d, err)
	}
	t.Setenv("X_DUR", "250ms")
	if d, err := PositiveDuration("X_DUR", time.Second); d != 250*time.Millisecond || err != nil {
		t.Errorf("X_DUR=250ms: %s %v", d, err)
	}
}
