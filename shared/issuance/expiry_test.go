package issuance_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// expiringCampaign creates campaign id, 1,000 yen coupons on 4 budget stripes, its coupons
// expiring at a fixed instant an hour away, and returns the owner's pool and the URL of a login
// in coupon_issue, IssueCoupon's role.
func expiringCampaign(t *testing.T, id string) (owner *pgxpool.Pool, ownerURL, issueURL string) {
	t.Helper()
	ownerURL = pgtest.URL(t)
	owner = prodPool(t, ownerURL, 4)
	in := time.Now().Add(time.Hour)
	if err := campaign.Create(context.Background(), owner, campaign.Campaign{ID: id, DiscountYen: 1000,
		BudgetYen: 1_000_000, Stripes: 4, CouponsExpireAt: &in}); err != nil {
		t.Fatal(err)
	}
	return owner, ownerURL, pgtest.LoginAs(t, ownerURL, "coupon_issue")
}

// expire moves campaign id's fixed coupon expiry to q's transaction time: the instant passes.
// (campaign update refuses an instant that has passed; the clock is what moves it there.)
func expire(t *testing.T, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, id string) {
	t.Helper()
	if _, err := q.Exec(context.Background(), `UPDATE campaign_budgets SET coupons_expire_at = now() WHERE campaign_id = $1`, id); err != nil {
		t.Fatal(err)
	}
}

// writtenFor counts what campaign id's issuance wrote: coupons, their outbox rows, the yen on
// its budget stripes and the yen on the members' months.
func writtenFor(t *testing.T, owner *pgxpool.Pool, id string) (coupons, outbox, budgetYen, usageYen int) {
	t.Helper()
	if err := owner.QueryRow(context.Background(), `SELECT
	    (SELECT count(*)::int FROM issued_coupons WHERE campaign_id = $1),
	    (SELECT count(*)::int FROM notification_outbox o JOIN issued_coupons i USING (coupon_id) WHERE i.campaign_id = $1),
	    (SELECT sum(issued_yen)::int FROM campaign_budgets WHERE campaign_id = $1),
	    (SELECT coalesce(sum(used_yen), 0)::int FROM member_monthly_usage)`, id).Scan(&coupons, &outbox, &budgetYen, &usageYen); err != nil {
		t.Fatal(err)
	}
	return coupons, outbox, budgetYen, usageYen
}

// TestBatchEndsAtCouponExpiry: issue_coupons_batch, called as coupon_issue for three members of a
// campaign whose fixed coupon expiry has passed, answers each CAMPAIGN_NOT_ACTIVE (ENDED) and
// writes nothing (coupons, outbox, budget, usage, by SQL): "passed" when the committed state
// already shows it at the reads; "while waiting" when the campaign's stripes are held by a
// transaction that moves the expiry to its own start, the call is run until pg_blocking_pids
// shows it waiting for that holder, and the holder commits: the call re-reads the stripe it waits
// for (EvalPlanQual) and refuses there. The broken variant, 00013's body (blind to the expiry),
// issues in both.
func TestBatchEndsAtCouponExpiry(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, when string }{{"fixed", "passed"}, {"fixed", "while waiting"},
		{"broken", "passed"}, {"broken", "while waiting"}} {
		t.Run(c.name+"/"+c.when, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			owner, ownerURL, issueURL := expiringCampaign(t, "E")
			if c.name == "broken" {
				pgtest.BlindToExpiry(t, owner)
			}
			pool := prodPool(t, issueURL, 2)
			var hold *pgtest.Hold
			if c.when == "passed" {
				expire(t, owner, "E")
			} else {
				hold = pgtest.HoldCampaign(t, ownerURL, "E")
				expire(t, hold.Tx(), "E")
			}
			type answer struct {
				result string
				reason *string
			}
			got := make(chan []answer, 1)
			failed := make(chan error, 1)
			go func() {
				rows, err := pool.Query(ctx, `SELECT result, reason FROM issue_coupons_batch('E',
					ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid()], ARRAY['a', 'b', 'c'],
					ARRAY[now(), now(), now()], 2000, ARRAY[NULL, NULL, NULL]::text[])`)
				var as []answer
				if err == nil {
					as, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (a answer, err error) {
						return a, r.Scan(&a.result, &a.reason)
					})
				}
				failed <- err
				got <- as
			}()
			if hold != nil {
				hold.WaitBlocked(1)
				hold.Release()
			}
			if err := <-failed; err != nil {
				t.Fatal(err)
			}
			answers := <-got
			coupons, outbox, budgetYen, usageYen := writtenFor(t, owner, "E")
			if c.name == "broken" {
				if coupons == 0 {
					t.Error("the broken variant issued nothing past the expiry: the test would not see it")
				}
				return
			}
			for i, a := range answers {
				if a.result != string(issuance.ResultCampaignNotActive) || a.reason == nil || *a.reason != issuance.ReasonEnded {
					t.Errorf("member %d: %s %v, want CAMPAIGN_NOT_ACTIVE (ENDED)", i+1, a.result, a.reason)
				}
			}
			if len(answers) != 3 || coupons+outbox+budgetYen+usageYen != 0 {
				t.Errorf("%d answers; written: %d coupons, %d outbox rows, %d yen of budget, %d yen of usage; want 3 answers, nothing written",
					len(answers), coupons, outbox, budgetYen, usageYen)
			}
		})
	}
}

// TestIssueCouponEndsAtCouponExpiry: issue_coupon, the previous release's lone call (a wrapper of
// issue_coupons_batch_v2 since 00014), refuses a campaign whose fixed coupon expiry has passed
// (CAMPAIGN_NOT_ACTIVE, ENDED) and writes nothing; the batch blind to the expiry (pgtest.BlindToExpiry)
// issues through it.
func TestIssueCouponEndsAtCouponExpiry(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "fixed", true: "broken"}[broken], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			owner, _, issueURL := expiringCampaign(t, "E")
			if broken {
				pgtest.BlindToExpiry(t, owner)
			}
			expire(t, owner, "E")
			var result string
			var reason *string
			if err := prodPool(t, issueURL, 1).QueryRow(ctx, `SELECT result, reason FROM issue_coupon(gen_random_uuid(), 'E', 'a', now(), 2000, NULL)`).
				Scan(&result, &reason); err != nil {
				t.Fatal(err)
			}
			coupons, outbox, budgetYen, usageYen := writtenFor(t, owner, "E")
			if broken {
				if coupons == 0 {
					t.Error("the broken variant issued nothing past the expiry through issue_coupon: the test would not see it")
				}
				return
			}
			if result != string(issuance.ResultCampaignNotActive) || reason == nil || *reason != issuance.ReasonEnded {
				t.Errorf("issue_coupon past the expiry: %s %v, want CAMPAIGN_NOT_ACTIVE (ENDED)", result, reason)
			}
			if coupons+outbox+budgetYen+usageYen != 0 {
				t.Errorf("written: %d coupons, %d outbox rows, %d yen of budget, %d yen of usage; want nothing", coupons, outbox, budgetYen, usageYen)
			}
		})
	}
}
