package reconcile

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestCheckNamesMemberMonths: a member's month counter changed by hand is named in the report,
// member and month with both figures, and the member whose month is right is not (before: only
// the count, "1 member-months"). Shown red on the broken variant, a report that names none.
func TestCheckNamesMemberMonths(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			if broken {
				saved := monthsNamed
				monthsNamed = 0
				t.Cleanup(func() { monthsNamed = saved })
			}
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "N", DiscountYen: 500, BudgetYen: 1_000_000}); err != nil {
				t.Fatal(err)
			}
			svc, err := issuance.New(pool, issuance.Config{})
			if err != nil {
				t.Fatal(err)
			}
			var month string
			for _, m := range []string{"n1", "n2"} {
				out, err := svc.Issue(ctx, m, "N")
				if err != nil || out.Result != issuance.ResultIssued {
					t.Fatalf("issue N to %s: %+v, %v", m, out, err)
				}
				month = out.Month
			}
			if _, err := pool.Exec(ctx, `UPDATE member_monthly_usage SET used_yen = 1500 WHERE member_id = 'n2'`); err != nil {
				t.Fatal(err)
			}
			r, err := Check(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			want := []MemberMonth{{MemberID: "n2", Month: month, UsedYen: 1500, LiveYen: 500}}
			named := r.UsageDrift == 1 && slices.Equal(r.MonthsNamed, want)
			if broken {
				if named {
					t.Error("the broken variant named the member-month: the test would not see a report that names none")
				}
				t.Logf("the broken variant: %d drifted, named %v", r.UsageDrift, r.MonthsNamed)
				return
			}
			if !named {
				t.Errorf("drift %d, named %v; want 1, %v", r.UsageDrift, r.MonthsNamed, want)
			}
		})
	}
}
