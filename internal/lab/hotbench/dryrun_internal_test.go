package hotbench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// TestDryRunLoopSendsNothingAfterStop: three herd clients behind a limiter of one dry run a
// second; the first dry run closes stop while it is in flight (the load's end), once the other
// two clients wait in the limiter for their turns, 1 s and 2 s after it. No dry run is sent after
// stop: one call in all, its latency counted. The broken variant, the loop before issue 33's
// try (stop looked at only before the limiter's wait), sends the other two when their turns come,
// after the load, and counts them in the dry runs beside it (up to one per herd client a turn:
// `couponctl bench --dry-runs --clients 8 --duration 1s` printed 389 dry runs/s with the herd
// paced at 287-360/s).
func TestDryRunLoopSendsNothingAfterStop(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			t.Parallel()
			loop := dryRunLoop
			if broken {
				loop = dryRunLoopSendingAfterStop
			}
			stop := make(chan struct{})
			limit := rate.NewLimiter(1, 1)
			var once sync.Once
			var calls, late atomic.Int64
			dryRun := func(context.Context, string, string) (string, error) {
				calls.Add(1)
				select {
				case <-stop:
					late.Add(1)
				default:
				}
				once.Do(func() {
					for limit.Tokens() > -1.5 { // until the other two have taken their turns, 1 s and 2 s on
						time.Sleep(time.Millisecond)
					}
					close(stop)
				})
				return "AVAILABLE", nil
			}
			lat, failed := loop(t.Context(), dryRun, 3, "C", limit, stop)
			var wrong []string
			if n := late.Load(); n != 0 {
				wrong = append(wrong, fmt.Sprintf("%d dry runs sent after stop", n))
			}
			if len(lat) != 1 || failed != 0 || calls.Load() != 1 {
				wrong = append(wrong, fmt.Sprintf("%d calls, %d latencies, %d failed: want 1, 1, 0", calls.Load(), len(lat), failed))
			}
			if broken {
				if len(wrong) == 0 {
					t.Fatal("the broken variant passed: the test would not see dry runs sent after the load")
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

// dryRunLoopSendingAfterStop is dryRunLoop before issue 33's try: it looks at stop only before
// the limiter's wait, so a client waiting for its turn at stop still sends its dry run when the
// turn comes, after the load, and counts it.
func dryRunLoopSendingAfterStop(ctx context.Context, dryRun IssueFunc, clients int, campaignID string, limit *rate.Limiter,
	stop <-chan struct{}) ([]time.Duration, int64) {
	var (
		mu      sync.Mutex
		lat     []time.Duration
		failed  atomic.Int64
		members atomic.Int64
		wg      sync.WaitGroup
	)
	for range clients {
		wg.Go(func() {
			var mine []time.Duration
			for ctx.Err() == nil {
				select {
				case <-stop:
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
					return
				default:
				}
				if limit.Wait(ctx) != nil {
					continue
				}
				t0 := time.Now()
				res, err := dryRun(ctx, fmt.Sprintf("d%s-%d", campaignID, members.Add(1)), campaignID)
				if err != nil || res != "AVAILABLE" {
					failed.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
			}
		})
	}
	wg.Wait()
	return lat, failed.Load()
}
