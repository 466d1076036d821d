package issuance_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// striped gives a test its own database with campaign HOT (1,000 yen coupons, budget coupons x
// 1,000 yen over stripes budget stripes) and a Service on a pool of maxConns connections.
func striped(t *testing.T, maxConns int32, coupons, stripes int) bundle {
	t.Helper()
	pool := pgtest.Pool(t, maxConns)
	c := campaign.Campaign{ID: "HOT", DiscountYen: 1000, BudgetYen: coupons * 1000, Stripes: stripes}
	if err := campaign.Create(context.Background(), pool, c); err != nil {
		t.Fatal(err)
	}
	pgtest.SetClock(t, pool, silverWeekDay)
	svc, err := issuance.New(pool, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return bundle{pool: pool, svc: svc}
}

// burst sends one request for campaignID for each of members members at once, released from a
// barrier, and re-sends RETRY_EXHAUSTED as the app does; it returns the answers by result.
func burst(t *testing.T, b bundle, campaignID string, members int) map[string]int {
	t.Helper()
	var resends atomic.Int64
	issueFn := silverweek.Resending(func(ctx context.Context, r silverweek.Request) (string, error) {
		out, err := b.svc.Issue(ctx, r.MemberID, r.CampaignID)
		return string(out.Result), err
	}, &resends)
	results := make([]string, members)
	errs := make([]error, members)
	var wg sync.WaitGroup
	barrier := make(chan struct{})
	for i := range members {
		wg.Go(func() {
			<-barrier
			results[i], errs[i] = issueFn(context.Background(), silverweek.Request{MemberID: silverweek.MemberID(i + 1), CampaignID: campaignID})
		})
	}
	close(barrier)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range results {
		got[r]++
	}
	t.Logf("answers %v after %d re-sends of RETRY_EXHAUSTED", got, resends.Load())
	return got
}

// assertStripes checks every budget stripe of HOT within its own budget, HOT's counters equal to
// its coupons, and every rule held.
func assertStripes(t *testing.T, pool *pgxpool.Pool, wantStripes, wantIssuedYen int) {
	t.Helper()
	if n := count(t, pool, `SELECT count(*) FROM campaign_budgets WHERE campaign_id = 'HOT'`); n != wantStripes {
		t.Errorf("HOT has %d budget stripe rows, want %d", n, wantStripes)
	}
	if n := count(t, pool, `SELECT count(*) FROM campaign_budgets WHERE issued_yen > budget_yen`); n != 0 {
		t.Errorf("%d stripes over their own budget", n)
	}
	if n := count(t, pool, `SELECT sum(issued_yen) FROM campaign_budgets WHERE campaign_id = 'HOT'`); n != wantIssuedYen {
		t.Errorf("HOT counters sum to %d yen, want %d", n, wantIssuedYen)
	}
	st, err := campaign.Show(context.Background(), pool, "HOT")
	if err != nil || st.IssuedYen != wantIssuedYen || st.Stripes != wantStripes {
		t.Errorf("campaign.Show(HOT) = %+v, %v; want %d yen issued in %d stripes", st, err, wantIssuedYen, wantStripes)
	}
	assertRulesHeld(t, pool)
}

// TestStripesExactBudget: 100 coupons of budget in 16 stripes, 250 members at once: exactly 100
// ISSUED and 150 BUDGET_EXCEEDED; no stripe over its budget; counters equal to the coupons.
func TestStripesExactBudget(t *testing.T) {
	t.Parallel()
	b := striped(t, 32, 100, 16)
	got := burst(t, b, "HOT", 250)
	want := map[string]int{string(issuance.ResultIssued): 100, string(issuance.ResultBudgetExceeded): 150}
	if !maps.Equal(got, want) {
		t.Errorf("answers %v, want %v", got, want)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM issued_coupons`); n != 100 {
		t.Errorf("coupons: %d, want 100", n)
	}
	assertStripes(t, b.pool, 16, 100_000)
}

// TestStripesUneven: 17 coupons in 16 stripes (one stripe holds two) and 40 members at once:
// exactly 17 issued, so the last coupons are found wherever they are.
func TestStripesUneven(t *testing.T) {
	t.Parallel()
	b := striped(t, 16, 17, 16)
	got := burst(t, b, "HOT", 40)
	want := map[string]int{string(issuance.ResultIssued): 17, string(issuance.ResultBudgetExceeded): 23}
	if !maps.Equal(got, want) {
		t.Errorf("answers %v, want %v", got, want)
	}
	assertStripes(t, b.pool, 16, 17_000)
}

// TestStripesNoFalseRejection: 15 of 16 stripes full, the last coupon in the remaining one, and
// that stripe held by another transaction while the request comes: the request waits for it
// instead of answering BUDGET_EXCEEDED; once the holder lets go it is ISSUED, and the next one is
// BUDGET_EXCEEDED.
func TestStripesNoFalseRejection(t *testing.T) {
	t.Parallel()
	b := striped(t, 4, 16, 16)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = budget_yen WHERE campaign_id = 'HOT' AND stripe <> 7`); err != nil {
		t.Fatal(err)
	}
	// Those 15 coupons exist as rows too, so that the tables stay consistent.
	if _, err := b.pool.Exec(ctx, `
		INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
		SELECT 'HOT', 'old' || g, '2026-09', 1000 FROM generate_series(1, 15) g;
		INSERT INTO member_monthly_usage (member_id, month, used_yen)
		SELECT 'old' || g, '2026-09', 1000 FROM generate_series(1, 15) g;
		INSERT INTO notification_outbox (coupon_id, member_id) SELECT coupon_id, member_id FROM issued_coupons`); err != nil {
		t.Fatal(err)
	}
	hold := pgtest.HoldCampaign(t, b.url(), "HOT", 7)
	done := make(chan issuance.Outcome, 1)
	go func() {
		out, err := b.svc.Issue(ctx, "m0001", "HOT")
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	hold.WaitBlocked(1)
	hold.Release()
	if out := waitDone(t, done, "Issue after the stripe was released"); out.Result != issuance.ResultIssued {
		t.Fatalf("the last coupon, its stripe held then released: %+v, want ISSUED", out)
	}
	if out := issue(t, b.svc, "m0002", "HOT"); out.Result != issuance.ResultBudgetExceeded {
		t.Errorf("after the last coupon: %+v, want BUDGET_EXCEEDED", out)
	}
	assertStripes(t, b.pool, 16, 16_000)
}

// TestSilverWeekStriped replays the Silver Week traffic with every campaign in 16 budget stripes:
// the same outcome as with one stripe (TestSilverWeekConcurrency).
func TestSilverWeekStriped(t *testing.T) {
	for _, workers := range []int{8, 32} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			pool := pgtest.Pool(t, int32(workers))
			for _, c := range silverweek.Campaigns {
				if err := campaign.Create(context.Background(), pool, campaign.Campaign{
					ID: c.ID, DiscountYen: c.DiscountYen, BudgetYen: c.BudgetYen, Stripes: 16}); err != nil {
					t.Fatal(err)
				}
			}
			pgtest.SetClock(t, pool, silverWeekDay)
			svc, err := issuance.New(pool, issuance.Config{})
			if err != nil {
				t.Fatal(err)
			}
			stats, resends := runSilverWeek(t, workers, func(ctx context.Context, r silverweek.Request) (string, error) {
				out, err := svc.Issue(ctx, r.MemberID, r.CampaignID)
				return string(out.Result), err
			})
			if stats.Errors > 0 {
				t.Fatalf("%d requests failed, first: %v", stats.Errors, stats.FirstErr)
			}
			t.Logf("results %v after %d re-sends", stats.Results, resends)
			wrong, err := silverweek.Verify(context.Background(), pool, silverweek.DefaultMembers)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range wrong {
				t.Error(w)
			}
		})
	}
}

// TestStripesStartOverWhenTheWaitedStripeFills: two stripes have one coupon of room each, both
// held by other transactions. The request waits for one of them; that holder takes the stripe's
// last coupon and commits while the other rolls back. The request must start over and take the
// other stripe (ISSUED), not answer BUDGET_EXCEEDED while a coupon of budget remains.
func TestStripesStartOverWhenTheWaitedStripeFills(t *testing.T) {
	t.Parallel()
	b := striped(t, 6, 16, 16)
	ctx := context.Background()
	// 14 coupons issued in stripes other than 7 and 9, as rows too.
	if _, err := b.pool.Exec(ctx, `
		UPDATE campaign_budgets SET issued_yen = budget_yen WHERE campaign_id = 'HOT' AND stripe NOT IN (7, 9);
		INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
		SELECT 'HOT', 'old' || g, '2026-09', 1000 FROM generate_series(1, 14) g;
		INSERT INTO member_monthly_usage (member_id, month, used_yen)
		SELECT 'old' || g, '2026-09', 1000 FROM generate_series(1, 14) g;
		INSERT INTO notification_outbox (coupon_id, member_id) SELECT coupon_id, member_id FROM issued_coupons`); err != nil {
		t.Fatal(err)
	}
	holders := map[int]*pgtest.Hold{}
	for _, stripe := range []int{7, 9} {
		holders[stripe] = pgtest.HoldCampaign(t, b.url(), "HOT", stripe)
	}
	done := make(chan issuance.Outcome, 1)
	go func() {
		out, err := b.svc.Issue(ctx, "m0001", "HOT")
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	// Find the stripe the request waits for.
	waited, other := -1, -1
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		for stripe, hold := range holders {
			if hold.Blocked() > 0 {
				waited = stripe
				return nil
			}
		}
		return fmt.Errorf("the request waits behind neither held stripe")
	})
	for stripe := range holders {
		if stripe != waited {
			other = stripe
		}
	}
	holders[other].Release() // it wrote nothing: as a rollback
	// The waited-for stripe's holder issues its last coupon and commits.
	tx := holders[waited].Tx()
	if _, err := tx.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = budget_yen WHERE campaign_id = 'HOT' AND stripe = $1`, waited); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen) VALUES ('HOT', 'rival', '2026-09', 1000);
		INSERT INTO member_monthly_usage (member_id, month, used_yen) VALUES ('rival', '2026-09', 1000);
		INSERT INTO notification_outbox (coupon_id, member_id) SELECT coupon_id, member_id FROM issued_coupons WHERE member_id = 'rival'`); err != nil {
		t.Fatal(err)
	}
	holders[waited].Release()
	if out := waitDone(t, done, "Issue after the stripes were released"); out.Result != issuance.ResultIssued {
		t.Fatalf("with stripe %d still holding a coupon of room: %+v, want ISSUED", other, out)
	}
	assertStripes(t, b.pool, 16, 16_000)
}
