package isolationlab_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/lab/isolationlab"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// pushGate makes the incident's races happen instead of hoping for them. The Before code pushes
// inside its transaction, after the coupon's insert and before the counter's write; the gate
// holds the run's first n pushes there until all n have come. The run's first n requests are
// then all in flight at once, each having read the counter, the pair's coupon and the member's
// month before any of them writes the counter or commits: with n the run's workers, each worker
// takes one request, and none is refused before its push, since nothing has committed. Two of
// them of one campaign lose an update of its counter (R1), the two taps of one pair both insert
// (R2: silverweek.Requests puts a member's taps next to each other), and a member's campaigns
// each see the month empty (R3's write skew).
type pushGate struct {
	t       testing.TB
	n       int
	mu      sync.Mutex
	arrived int
	open    chan struct{}
}

func newPushGate(t testing.TB, n int) *pushGate {
	return &pushGate{t: t, n: n, open: make(chan struct{})}
}

// wrap returns push (nil: none) behind the gate. The gate fails the test if the n pushes do not
// all come within pgtest.PollTimeout.
func (g *pushGate) wrap(push func(ctx context.Context, memberID, couponID string)) func(ctx context.Context, memberID, couponID string) {
	return func(ctx context.Context, memberID, couponID string) {
		g.mu.Lock()
		g.arrived++
		k := g.arrived
		if k == g.n {
			close(g.open)
		}
		g.mu.Unlock()
		if k <= g.n {
			select {
			case <-g.open:
			case <-ctx.Done():
			case <-time.After(pgtest.PollTimeout):
				g.mu.Lock()
				g.t.Errorf("the push gate: %d of %d pushes came within %s", g.arrived, g.n, pgtest.PollTimeout)
				g.mu.Unlock()
			}
		}
		if push != nil {
			push(ctx, memberID, couponID)
		}
	}
}

// gated is the lab's strategy name with its first n pushes behind a [pushGate].
func gated(t *testing.T, name string, n int) isolationlab.Strategy {
	t.Helper()
	s, err := isolationlab.StrategyNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	g, newIssue := newPushGate(t, n), s.New
	s.New = func(env isolationlab.Env) (isolationlab.IssueFunc, error) {
		env.Push = g.wrap(env.Push)
		return newIssue(env)
	}
	return s
}
