package issuance_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/rules"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// TestLargestCapNeverOverflows: at the largest cap coupon_rules takes (couponctl rules set), a
// member who has used all of it asks for a coupon of the cap's size, and for the largest coupon
// a campaign may hold (2^31-1 yen), through ISSUE_BATCH_MAX=1 and coalesced calls: each answers
// MONTHLY_CAP, never an error (500), and the tables hold the one coupon. The negative control
// lifts coupon_rules' CHECK and sets the cap to 2^31-1: a coupon of 2e9 yen whose issuance's
// judge read the member's month before another of 2e9 yen committed meets it at the usage write,
// and PostgreSQL ends it in 22003, numeric value out of range, the 500 the bound prevents.
func TestLargestCapNeverOverflows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, batchMax := range []int{1, issuance.DefaultBatchMax} {
		pool := pgtest.Pool(t, 4)
		for _, c := range []campaign.Campaign{
			{ID: "CAP-A", DiscountYen: issuance.MaxMonthlyCapYen, BudgetYen: 2 * issuance.MaxMonthlyCapYen},
			{ID: "CAP-B", DiscountYen: issuance.MaxMonthlyCapYen, BudgetYen: 2 * issuance.MaxMonthlyCapYen},
			{ID: "CAP-MAX", DiscountYen: math.MaxInt32, BudgetYen: math.MaxInt32},
		} {
			if err := campaign.Create(ctx, pool, c); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := rules.SetMonthlyCap(ctx, pool, issuance.MaxMonthlyCapYen, "the largest cap"); err != nil {
			t.Fatal(err)
		}
		svc, err := issuance.New(pool, issuance.Config{BatchMax: batchMax})
		if err != nil {
			t.Fatal(err)
		}
		if out := issue(t, svc, "m1", "CAP-A"); out.Result != issuance.ResultIssued {
			t.Fatalf("batch max %d: the cap's worth: %s, want ISSUED", batchMax, out.Result)
		}
		for _, id := range []string{"CAP-B", "CAP-MAX"} {
			if out := issue(t, svc, "m1", id); out.Result != issuance.ResultMonthlyCap {
				t.Errorf("batch max %d: %s on a used-up cap: %s, want MONTHLY_CAP", batchMax, id, out.Result)
			}
		}
		if n := count(t, pool, `SELECT count(*) FROM issued_coupons WHERE member_id = 'm1'`); n != 1 {
			t.Errorf("batch max %d: m1 holds %d coupons, want 1", batchMax, n)
		}
	}

	pool := pgtest.Pool(t, 3) // the first call's, the second's and the watch for its wait
	for _, id := range []string{"BIG-A", "BIG-B"} {
		if err := campaign.Create(ctx, pool, campaign.Campaign{ID: id, DiscountYen: 2_000_000_000, BudgetYen: 2_000_000_000}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := rules.SetMonthlyCap(ctx, pool, math.MaxInt32, "past the bound"); !errors.Is(err, rules.ErrRefused) {
		t.Fatalf("a cap of 2^31-1: %v, want it refused", err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE coupon_rules DROP CONSTRAINT monthly_cap_range;
		UPDATE coupon_rules SET monthly_cap_yen = 2147483647`); err != nil {
		t.Fatal(err)
	}
	// The second call's judge reads m1's month before the first commits (the first holds its
	// usage row), so it reaches the usage write, which adds 2e9 to 2e9 once the first commits.
	call := `SELECT result FROM issue_coupons_batch_v3($1, ARRAY[gen_random_uuid()], ARRAY['m1'], ARRAY[NULL]::text[])`
	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	var result string
	var pid int
	if err := first.QueryRow(ctx, call, "BIG-A").Scan(&result); err != nil || result != "ISSUED" {
		t.Fatalf("negative control, the first coupon at cap 2^31-1: %s %v, want ISSUED", result, err)
	}
	if err := first.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() { second <- pool.QueryRow(ctx, call, "BIG-B").Scan(&result) }()
	pgtest.WaitBlockedBy(t, pool, pid, 1)
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if err := <-second; !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.NumericValueOutOfRange {
		t.Errorf("negative control, the second coupon at cap 2^31-1: %s %v, want 22003: the control no longer shows the overflow", result, err)
	}
}
