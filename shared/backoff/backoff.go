// Package backoff computes retry waits with full jitter (M. Brooker, "Exponential Backoff And
// Jitter", AWS Architecture Blog, 2015): the wait before retry n is uniform in
// [0, min(cap, base*2^(n-1))), so clients that failed together do not retry together.
package backoff

import (
	"math/rand/v2"
	"time"
)

// FullJitter returns the wait after failed attempt n (n >= 1), uniform in
// [0, min(capWait, base*2^(n-1))); it is 0 when base is 0 (retry at once, or on the next run).
func FullJitter(base, capWait time.Duration, n int) time.Duration {
	ceiling := capWait
	if shift := n - 1; shift >= 0 && shift < 62 && base <= capWait>>shift {
		ceiling = base << shift
	}
	if ceiling <= 0 {
		return 0
	}
	return rand.N(ceiling)
}
