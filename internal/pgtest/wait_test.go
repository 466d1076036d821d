package pgtest_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/campaign"
	"github.com/mops/coupon-api/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestHoldCountsEveryWaiterBehindIt: three sessions update a held campaign row. Only the first
// waits for the holder's transaction itself (pg_blocking_pids names the holder for it alone);
// the others queue behind it for the row's tuple lock. The hold counts all three, and nothing of
// another holder in another database.
func TestHoldCountsEveryWaiterBehindIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, other := pgtest.Pool(t, 4), pgtest.Pool(t, 1)
	for _, p := range []*pgxpool.Pool{pool, other} {
		if err := campaign.Create(ctx, p, campaign.Campaign{ID: "HELD", DiscountYen: 100, BudgetYen: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	hold := pgtest.HoldCampaign(t, pool.Config().ConnConfig.ConnString(), "HELD")
	idle := pgtest.HoldCampaign(t, other.Config().ConnConfig.ConnString(), "HELD")
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if _, err := pool.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = issued_yen WHERE campaign_id = 'HELD'`); err != nil {
				t.Error(err)
			}
		})
	}
	waiters := hold.WaitBlocked(3)
	var direct int
	if err := pool.QueryRow(ctx, `SELECT count(*)::int FROM pg_locks WHERE NOT granted AND $1::int = ANY (pg_blocking_pids(pid))`,
		hold.PID()).Scan(&direct); err != nil {
		t.Fatal(err)
	}
	if direct != 1 {
		t.Errorf("%d waiters name the holder in pg_blocking_pids, want 1 (the others queue behind the first)", direct)
	}
	if n := idle.Blocked(); n != 0 {
		t.Errorf("the holder in the other database has %d waiters, want 0", n)
	}
	if !pgtest.SamePIDs(waiters, hold.Waiters()) {
		t.Errorf("waiters changed while nothing moved")
	}
	hold.Release()
	wg.Wait()
	if n := hold.Blocked(); n != 0 {
		t.Errorf("%d waiters after the release", n)
	}
}
