package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
)

// progressPromise is the longest silence docs/operations.md promises a long verb's log: a line
// "at least every 5 s, also while nothing is answered".
const progressPromise = 5 * time.Second

// TestGrantProgressWhileStalled: a grant whose requests all wait (a held budget row: the
// database stalled, pg_blocking_pids) still says how far it is once the promised silence has
// passed, on its log: "0/3 members" (before: nothing for 10 minutes, lines only per 10% of the
// members answered). The test delivers the ticks itself (progressTicks), each dated the promise
// after now, so nothing waits for the clock. Shown red on the broken variant, a grant silent for
// an hour while nothing is answered.
func TestGrantProgressWhileStalled(t *testing.T) {
	checkAndBreak(t, grantProgressCheck, brokenVariant{"silent for an hour", func(t *testing.T) {
		swap(t, &progressEvery, time.Hour)
	}})
}

func grantProgressCheck(t *testing.T, v *verdict) {
	d := newGrantDB(t, campaign.Campaign{ID: "PROG", DiscountYen: 500, BudgetYen: 1_000_000})
	t.Setenv("DATABASE_URL", d.admin)
	path, _ := memberFile(t, "p", 3)
	ticks := make(chan time.Time)
	swap(t, &progressTicks, func() (<-chan time.Time, func()) { return ticks, func() {} })
	hold := pgtest.HoldCampaign(t, d.url, "PROG")
	var stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		var stdout bytes.Buffer
		done <- run(context.Background(), []string{"grant", "--campaign", "PROG", "--members", path,
			"--out", filepath.Join(t.TempDir(), "a.csv"), "--concurrency", "1"}, &stdout, &stderr)
	}()
	hold.WaitBlocked(1)
	// The progress takes a tick only once it has handled the one before: after the second, the
	// first one's line, if it was due, is written.
	for range 2 {
		ticks <- time.Now().Add(progressPromise)
	}
	stalled := stderr.String()
	hold.Release()
	if code := <-done; code != 0 {
		t.Fatalf("grant: exit %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stalled, "grant PROG: 0/3 members (0%)") {
		v.Errorf("while every request waited, the grant's log said:\n%s\nwant a line with 0/3 members", stalled)
	}
}
