package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestRedeemedCouponIsNeverPushed: of six coupons, m1's is redeemed at the till (coupon_redeem)
// before the relay's run: the claim closes its row as skipped, reason redeemed, counted apart in
// the run's answer, and LINE never sees it; the five others are pushed. The broken variant, a
// relay blind to redemption (outbox_claim and the lease guard without 00032's rule), pushes the
// coupon the member has already used: the check sees that.
func TestRedeemedCouponIsNeverPushed(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%t", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := pgtest.URL(t)
			pool := pgtest.PoolAt(t, url, 4)
			ids := issueSix(t, pool, time.Minute)
			// Only m1 (live, linked) matters here; the others are issueSix's own cases.
			if _, err := pool.Exec(ctx, `SELECT coupon_redeem($1, 'm1', 'POS-1')`, ids["m1"]); err != nil {
				t.Fatal(err)
			}
			if broken {
				pgtest.BreakFunction(t, pool, "outbox_claim", [2]string{"WHEN i.redeemed_at IS NOT NULL THEN 'redeemed'", ""})
				pgtest.BreakFunction(t, pool, "outbox_lease_refused", [2]string{"OR c.redeemed_at IS NOT NULL ", ""})
			}
			stub := linestub.New()
			srv := httptest.NewServer(stub)
			defer srv.Close()
			r, err := New(pgtest.PoolAt(t, pgtest.LoginAs(t, url, "coupon_relay"), 4), Config{ChannelAccessToken: "t",
				BaseURL: srv.URL, BatchSize: 10, Parallelism: 2, PushTimeout: 5 * time.Second, BatchTimeout: 20 * time.Second,
				Lease: time.Minute, RunBudget: 40 * time.Second, MaxAttempts: 5, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			res, err := r.Run(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			var problems []string
			if n := stub.Calls(ids["m1"]); n != 0 {
				problems = append(problems, fmt.Sprintf("the redeemed coupon: %d push requests at LINE, want none", n))
			}
			if res.SkippedReasons.Redeemed != 1 {
				problems = append(problems, fmt.Sprintf("relay run %+v: want skipped_reasons.redeemed 1", res))
			}
			var row string
			if err := pool.QueryRow(ctx, `SELECT coalesce(skip_reason, 'not skipped') FROM notification_outbox WHERE coupon_id = $1`, ids["m1"]).Scan(&row); err != nil {
				t.Fatal(err)
			}
			if row != "redeemed" {
				problems = append(problems, fmt.Sprintf("the redeemed coupon's outbox row: %s, want skipped, reason redeemed", row))
			}
			pgtest.Verdict(t, broken, problems)
		})
	}
}
