package backoff

import (
	"testing"
	"time"
)

func TestFullJitterBounds(t *testing.T) {
	base, capWait := 10*time.Millisecond, 200*time.Millisecond
	for n, ceiling := range map[int]time.Duration{1: 10 * time.Millisecond, 2: 20 * time.Millisecond,
		5: 160 * time.Millisecond, 6: 200 * time.Millisecond, 100: 200 * time.Millisecond} {
		for range 1000 {
			if w := FullJitter(base, capWait, n); w < 0 || w >= ceiling {
				t.Fatalf("FullJitter(n=%d) = %s, want in [0, %s)", n, w, ceiling)
			}
		}
	}
	if w := FullJitter(0, capWait, 3); w != 0 {
		t.Errorf("base 0: %s, want 0", w)
	}
}
