package pgtest_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
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

// serverWideWaiters is the lock-waiter count the lock tests once used, kept as the broken
// variant that [TestWaiterDetectionIsPerHolder] shows fooled (WaitersOf replaced it): every
// ungranted lock of the database plus every ungranted transaction-id lock of the whole server
// (whose database is NULL).
const serverWideWaiters = `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database OR l.database IS NULL
	WHERE NOT l.granted AND d.datname = current_database()`

// TestWaiterDetectionIsPerHolder: a lock waiter in another test's database (a re-send waiting on
// an uncommitted coupon insert) satisfies the server-wide count, but not the count of a holder
// that nobody waits for.
func TestWaiterDetectionIsPerHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ours, other := pgtest.Pool(t, 2), pgtest.Pool(t, 2)
	for _, p := range []*pgxpool.Pool{ours, other} {
		if err := campaign.Create(ctx, p, campaign.Campaign{ID: "SW-A", DiscountYen: 1000, BudgetYen: 100_000}); err != nil {
			t.Fatal(err)
		}
	}

	// The other database: an uncommitted insert and a second insert of the same key waiting on it.
	first, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	insert := `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen) VALUES ('SW-A', 'm0001', '2026-09', 1000)`
	if _, err := first.Exec(ctx, insert); err != nil {
		t.Fatal(err)
	}
	var firstPID int
	if err := first.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&firstPID); err != nil {
		t.Fatal(err)
	}
	waiterDone := make(chan error, 1)
	go func() { _, err := other.Exec(ctx, insert+` ON CONFLICT DO NOTHING`); waiterDone <- err }()
	pgtest.WaitBlockedBy(t, first, firstPID, 1)

	// Ours: a holder of a campaign row that nobody waits for.
	hold := pgtest.HoldCampaign(t, ours.Config().ConnConfig.ConnString(), "SW-A")
	var n int
	if err := ours.QueryRow(ctx, serverWideWaiters).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Errorf("the server-wide count saw no waiter: this test no longer shows it fooled")
	}
	if n := hold.Blocked(); n != 0 {
		t.Errorf("waiters of our holder: %d, want 0: it counted another database's waiter", n)
	}
	if err := first.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waiterDone; err != nil {
		t.Fatal(err)
	}
}
