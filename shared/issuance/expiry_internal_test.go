package issuance

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestCoalescedEndsAtCouponExpiry: the coalesced path, IssueCoupon's service as coupon_issue. The
// campaign's call in flight is a request of member L, held at R3 by a transaction of the test that
// issues L another campaign worth the whole month (so L's own answer is MONTHLY_CAP whatever the
// expiry, and its call, a batch of one, writes nothing). Meanwhile the campaign's fixed coupon
// expiry passes, and 12 members ask at once, released from a barrier; once all 12 wait in the
// campaign's queue, the test commits, and they go as coalesced calls of issue_coupons_batch_v2.
// Each is answered CAMPAIGN_NOT_ACTIVE (ENDED), and nothing of the campaign is written (coupons,
// outbox, budget, usage, by SQL). The broken variant, blind to the expiry (pgtest.BlindToExpiry),
// issues them.
func TestCoalescedEndsAtCouponExpiry(t *testing.T) {
	t.Parallel()
	const members = 12
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ownerURL := pgtest.URL(t)
			owner, err := pgxpool.New(ctx, ownerURL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(owner.Close)
			in := time.Now().Add(time.Hour)
			for _, c := range []campaign.Campaign{{ID: "E", DiscountYen: 1000, BudgetYen: 1_000_000, Stripes: 4, CouponsExpireAt: &in},
				{ID: "RIVAL", DiscountYen: DefaultMonthlyCapYen, BudgetYen: 1_000_000}} {
				if err := campaign.Create(ctx, owner, c); err != nil {
					t.Fatal(err)
				}
			}
			if broken {
				pgtest.BlindToExpiry(t, owner)
			}
			pool, err := pgxpool.New(ctx, pgtest.LoginAs(t, ownerURL, "coupon_issue"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			svc, err := New(pool, Config{BatchMax: 16})
			if err != nil {
				t.Fatal(err)
			}

			rival, err := pgx.Connect(ctx, ownerURL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rival.Close(context.Background()) })
			tx, err := rival.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `SELECT * FROM issue_coupon(gen_random_uuid(), 'RIVAL', 'L', now(), $1, NULL)`, DefaultMonthlyCapYen); err != nil {
				t.Fatal(err)
			}
			lone := make(chan Outcome, 1)
			go func() {
				out, err := svc.Issue(ctx, "L", "E")
				if err != nil {
					t.Error(err)
				}
				lone <- out
			}()
			pgtest.WaitBlockedBy(t, owner, int(rival.PgConn().PID()), 1)
			if _, err := owner.Exec(ctx, `UPDATE campaign_budgets SET coupons_expire_at = now() WHERE campaign_id = 'E'`); err != nil {
				t.Fatal(err)
			}

			answers := make([]Outcome, members)
			var wg sync.WaitGroup
			barrier := make(chan struct{})
			for i := range members {
				wg.Go(func() {
					<-barrier
					out, err := svc.Issue(ctx, fmt.Sprintf("m%02d", i), "E")
					if err != nil {
						t.Error(err)
					}
					answers[i] = out
				})
			}
			close(barrier)
			pgtest.Eventually(t, pgtest.PollTimeout, func() error {
				svc.co.mu.Lock()
				defer svc.co.mu.Unlock()
				if q := svc.co.queues["E"]; q == nil || len(q.waiting) != members {
					return fmt.Errorf("the campaign's queue does not hold the %d members yet", members)
				}
				return nil
			})
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if out := <-lone; out.Result != ResultMonthlyCap {
				t.Fatalf("L, the call in flight: %+v, want MONTHLY_CAP (its month taken by RIVAL)", out)
			}
			var coupons, outbox, budgetYen, usageYen int
			if err := owner.QueryRow(ctx, `SELECT
			    (SELECT count(*)::int FROM issued_coupons WHERE campaign_id = 'E'),
			    (SELECT count(*)::int FROM notification_outbox o JOIN issued_coupons i USING (coupon_id) WHERE i.campaign_id = 'E'),
			    (SELECT sum(issued_yen)::int FROM campaign_budgets WHERE campaign_id = 'E'),
			    (SELECT coalesce(sum(used_yen), 0)::int FROM member_monthly_usage WHERE member_id <> 'L')`).
				Scan(&coupons, &outbox, &budgetYen, &usageYen); err != nil {
				t.Fatal(err)
			}
			if broken {
				if coupons == 0 {
					t.Error("the broken variant issued nothing past the expiry: the test would not see it")
				}
				return
			}
			for i, out := range answers {
				if out.Result != ResultCampaignNotActive || out.Reason != ReasonEnded {
					t.Errorf("m%02d: %+v, want CAMPAIGN_NOT_ACTIVE (ENDED)", i, out)
				}
			}
			if coupons+outbox+budgetYen+usageYen != 0 {
				t.Errorf("written: %d coupons, %d outbox rows, %d yen of budget, %d yen of usage; want nothing", coupons, outbox, budgetYen, usageYen)
			}
		})
	}
}
