package schema_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestCapChangeDividesTheCoupons: an issuance that waits behind coupon_rules_set reads the cap
// that change commits, not the one it replaced (00024). Member m1 holds a 1,000 yen coupon; the
// cap goes from 2,000 to 1,500 yen in an open transaction; m1 asks for another 1,000 yen coupon,
// and the test waits (pg_blocking_pids) until that call waits on the change before committing
// it. The call must answer MONTHLY_CAP and m1 must hold one coupon, counted with SQL. The broken
// variant, 00021's read (one STABLE SQL statement, run in its caller's snapshot, taken before the
// lock it waits for inside), issued the second
// coupon at the old cap: 2,000 yen in a 1,500 yen month.
func TestCapChangeDividesTheCoupons(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := newForgeryDB(t)
			if broken {
				pgtest.BreakFunction(t, d.owner, "monthly_cap_yen", [2]string{
					" LANGUAGE plpgsql\nAS $function$\nBEGIN\n  LOCK TABLE public.coupon_rules IN ACCESS SHARE MODE;\n" +
						"  RETURN (SELECT r.monthly_cap_yen FROM public.coupon_rules r);\nEND\n$function$",
					" LANGUAGE sql STABLE\nRETURN (SELECT r.monthly_cap_yen FROM public.coupon_rules r)"})
			}
			if err := campaign.Create(ctx, d.owner, campaign.Campaign{ID: "C8", DiscountYen: 1000, BudgetYen: 1_000_000}); err != nil {
				t.Fatal(err)
			}
			if _, err := d.issue.Exec(ctx, `SELECT * FROM issue_coupon(gen_random_uuid(), 'B8', 'm1', now(), 2000, NULL)`); err != nil {
				t.Fatal(err)
			}
			change, err := d.admin.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = change.Rollback(ctx) }()
			var changer int
			if err := change.QueryRow(ctx, `SELECT pg_backend_pid() FROM coupon_rules_set(1500, NULL, 'lowered while m1 asks')`).Scan(&changer); err != nil {
				t.Fatal(err)
			}
			answer := make(chan string, 1)
			go func() {
				var result string
				if err := d.issue.QueryRow(ctx, `SELECT result FROM issue_coupon(gen_random_uuid(), 'C8', 'm1', now(), 2000, NULL)`).Scan(&result); err != nil {
					result = err.Error()
				}
				answer <- result
			}()
			pgtest.Eventually(t, pgtest.PollTimeout, func() error {
				var waiting int
				if err := d.owner.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, changer).Scan(&waiting); err != nil {
					return err
				}
				if waiting == 0 {
					return fmt.Errorf("m1's call does not wait on the cap's change yet")
				}
				return nil
			})
			if err := change.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			result := <-answer
			var coupons, used int
			if err := d.owner.QueryRow(ctx, `SELECT (SELECT count(*) FROM issued_coupons WHERE member_id = 'm1'),
				(SELECT coalesce(sum(used_yen), 0) FROM member_monthly_usage WHERE member_id = 'm1')`).Scan(&coupons, &used); err != nil {
				t.Fatal(err)
			}
			held := result == "MONTHLY_CAP" && coupons == 1 && used == 1000
			switch {
			case broken && held:
				t.Error("the broken variant held the new cap: the test would not see a read at the old cap")
			case broken:
				t.Logf("the broken variant: %s, m1 holds %d coupons, %d yen under a 1,500 yen cap", result, coupons, used)
			case !held:
				t.Errorf("m1's call behind the cap's change: %s, m1 holds %d coupons, %d yen; want MONTHLY_CAP, 1 coupon, 1000 yen", result, coupons, used)
			}
		})
	}
}
