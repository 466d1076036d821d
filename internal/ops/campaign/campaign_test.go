package campaign_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestList reads back every campaign created, in id order, with its period and issued total.
func TestList(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, 2)
	if got, err := campaign.List(ctx, pool); err != nil || len(got) != 0 {
		t.Fatalf("empty database: %v, %v; want no campaigns", got, err)
	}
	starts := time.Now().Add(-time.Hour).Truncate(time.Second)
	ends := starts.Add(48 * time.Hour)
	want := []campaign.Campaign{
		{ID: "A", DiscountYen: 1000, BudgetYen: 100000},
		{ID: "B", DiscountYen: 500, BudgetYen: 1500, StartsAt: &starts, EndsAt: &ends},
	}
	for _, c := range []campaign.Campaign{want[1], want[0]} {
		if err := campaign.Create(ctx, pool, c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = 1000 WHERE campaign_id = 'B'`); err != nil {
		t.Fatal(err)
	}
	got, err := campaign.List(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("list: %+v, want 2 campaigns", got)
	}
	for i, g := range got {
		w := want[i]
		if g.ID != w.ID || g.DiscountYen != w.DiscountYen || g.BudgetYen != w.BudgetYen ||
			!sameTime(g.StartsAt, w.StartsAt) || !sameTime(g.EndsAt, w.EndsAt) {
			t.Errorf("campaign %d: %+v, want %+v", i, g, w)
		}
	}
	if got[0].IssuedYen != 0 || got[1].IssuedYen != 1000 || got[1].RemainingYen() != 500 {
		t.Errorf("issued: A %d, B %d (remaining %d); want 0, 1000 (500)", got[0].IssuedYen, got[1].IssuedYen, got[1].RemainingYen())
	}
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// TestStripesFor pins the sizing of docs/hot-campaigns.md: one stripe per [campaign.StripeRateTPS]
// requests/s, rounded up, at least 1 and at most [campaign.MaxStripes].
func TestStripesFor(t *testing.T) {
	for _, c := range []struct{ rps, want int }{
		{0, 1}, {1, 1}, {400, 1}, {401, 2}, {1000, 3}, {10000, 25}, {25600, 64}, {100000, 64},
	} {
		if got := campaign.StripesFor(c.rps); got != c.want {
			t.Errorf("StripesFor(%d) = %d, want %d", c.rps, got, c.want)
		}
	}
}

// TestCreateLaysTheBudget: campaign_create lays a budget over its stripes in whole coupons, as
// even as possible, the yen that make no whole coupon on stripe 0, up to the largest budget
// PostgreSQL's integer holds; it refuses an id that exists, and writes one 'create' history row.
func TestCreateLaysTheBudget(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, 2)
	for _, c := range []struct {
		campaign.Campaign
		want []int64
	}{
		{campaign.Campaign{ID: "EVEN", DiscountYen: 1000, BudgetYen: 4000, Stripes: 2}, []int64{2000, 2000}},
		{campaign.Campaign{ID: "ODD", DiscountYen: 1000, BudgetYen: 5500, Stripes: 2}, []int64{3500, 2000}},
		{campaign.Campaign{ID: "MAX", DiscountYen: 1, BudgetYen: math.MaxInt32, Stripes: 2}, []int64{1 << 30, 1<<30 - 1}},
	} {
		if err := campaign.Create(ctx, pool, c.Campaign); err != nil {
			t.Fatalf("create %s: %v", c.ID, err)
		}
		rows, err := pool.Query(ctx, `SELECT budget_yen::bigint FROM campaign_budgets WHERE campaign_id = $1 ORDER BY stripe`, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: stripes %v, %v; want %v", c.ID, got, err, c.want)
		}
		if h, err := campaign.History(ctx, pool, c.ID); err != nil || len(h) != 1 || h[0].What != "create" {
			t.Errorf("%s: history %+v, %v; want one 'create'", c.ID, h, err)
		}
	}
	if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "EVEN", DiscountYen: 1, BudgetYen: 1}); !errors.Is(err, campaign.ErrExists) {
		t.Errorf("create EVEN again: %v, want ErrExists", err)
	}
}
