package redemption_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/redemption"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fixture is one test's migrated database: the owner's pool (set-up, counts, broken variants),
// the redemption service logged in as a user of coupon_redeem (as RedeemCoupon runs), and the
// issuance that made the coupons.
type fixture struct {
	url   string
	owner *pgxpool.Pool
	svc   *redemption.Service
	issue *issuance.Service
}

// newFixture migrates a database with campaign CART (500 yen, 30-day coupons) and returns it.
// conns sizes the redemption pool; cfg is the service's budget and timeouts.
func newFixture(t *testing.T, conns int32, cfg issuance.Config) fixture {
	t.Helper()
	ctx := context.Background()
	url := pgtest.URL(t)
	owner := pgtest.PoolAt(t, url, 4)
	if err := campaign.Create(ctx, owner, campaign.Campaign{ID: "CART", DiscountYen: 500, BudgetYen: 1_000_000, CouponValidDays: 30}); err != nil {
		t.Fatal(err)
	}
	svc, err := redemption.New(pgtest.PoolAt(t, pgtest.LoginAs(t, url, "coupon_redeem"), conns), cfg)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := issuance.New(owner, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return fixture{url: url, owner: owner, svc: svc, issue: iss}
}

// coupon issues campaign CART to member and returns the coupon's id.
func (f fixture) coupon(t *testing.T, member string) string {
	t.Helper()
	out, err := f.issue.Issue(context.Background(), member, "CART")
	if err != nil || out.Result != issuance.ResultIssued {
		t.Fatalf("issue CART to %s: %+v, %v", member, out, err)
	}
	return out.CouponID
}

func (f fixture) do(t *testing.T, r redemption.Request) redemption.Outcome {
	t.Helper()
	out, err := f.svc.Do(context.Background(), r)
	if err != nil {
		t.Fatalf("%+v: %v", r, err)
	}
	return out
}

// history is what coupon_redemptions holds for a coupon, in order: "redeem A", "rollback A".
func (f fixture) history(t *testing.T, couponID string) []string {
	t.Helper()
	rows, err := f.owner.Query(context.Background(),
		`SELECT action || ' ' || coalesce(order_id, '(legacy)') FROM coupon_redemptions WHERE coupon_id = $1 ORDER BY redemption_id`, couponID)
	if err != nil {
		t.Fatal(err)
	}
	h, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// drift is reconcile's count of coupons whose redemption disagrees with its history.
func (f fixture) drift(t *testing.T) int64 {
	t.Helper()
	r, err := reconcile.Check(context.Background(), f.owner)
	if err != nil {
		t.Fatal(err)
	}
	if v := r.Violations(); r.RedemptionDrift == 0 && len(v) > 0 {
		t.Errorf("reconcile: %v", v)
	}
	return r.RedemptionDrift
}

// counters is what R1 and R3 count: every campaign's issued yen and every member-month's, summed.
func (f fixture) counters(t *testing.T) (budget, months int64) {
	t.Helper()
	if err := f.owner.QueryRow(context.Background(),
		`SELECT (SELECT sum(issued_yen) FROM campaign_budgets), (SELECT sum(used_yen) FROM member_monthly_usage)`).Scan(&budget, &months); err != nil {
		t.Fatal(err)
	}
	return budget, months
}

func req(a redemption.Action, coupon, member, order string) redemption.Request {
	r := redemption.Request{Action: a, CouponID: coupon, MemberID: member, OrderID: order}
	if a == redemption.Rollback {
		r.Reason = "order " + order + " cancelled"
	}
	return r
}

// TestEveryAnswer walks one coupon through the contract's table (docs/api.md, "RedeemCoupon"):
// each answer, the history it leaves, and R1-R3's counters unmoved by any of it.
func TestEveryAnswer(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4, issuance.Config{})
	c, other := f.coupon(t, "m1"), f.coupon(t, "m2")
	budget, months := f.counters(t)
	var first *time.Time
	for i, step := range []struct {
		r      redemption.Request
		want   redemption.Result
		usable bool
	}{
		{req(redemption.Validate, c, "m1", "A"), redemption.ResultValid, false},
		{req(redemption.Validate, c, "m2", "A"), redemption.ResultUnknownCoupon, false},
		{req(redemption.Redeem, c, "m2", "A"), redemption.ResultUnknownCoupon, false},
		{req(redemption.Redeem, "00000000-0000-4000-8000-000000000000", "m1", "A"), redemption.ResultUnknownCoupon, false},
		{req(redemption.Redeem, c, "m1", "A"), redemption.ResultRedeemed, false},
		{req(redemption.Redeem, c, "m1", "A"), redemption.ResultRedeemed, false},
		{req(redemption.Validate, c, "m1", "B"), redemption.ResultAlreadyRedeemed, false},
		{req(redemption.Redeem, c, "m1", "B"), redemption.ResultAlreadyRedeemed, false},
		{req(redemption.Rollback, c, "m1", "B"), redemption.ResultNotRedeemed, false},
		{req(redemption.Rollback, c, "m2", "A"), redemption.ResultUnknownCoupon, false},
		{req(redemption.Rollback, c, "m1", "A"), redemption.ResultRolledBack, true},
		{req(redemption.Rollback, c, "m1", "A"), redemption.ResultRolledBack, true},
		{req(redemption.Redeem, c, "m1", "A"), redemption.ResultRolledBack, true}, // a cancelled order redeems no more
		{req(redemption.Validate, c, "m1", "A"), redemption.ResultRolledBack, true},
		{req(redemption.Redeem, c, "m1", "B"), redemption.ResultRedeemed, false},
		{req(redemption.Rollback, c, "m1", "A"), redemption.ResultRolledBack, false}, // undone before; B holds it now
	} {
		out := f.do(t, step.r)
		if out.Result != step.want || (out.Result == redemption.ResultRolledBack && out.Usable != step.usable) {
			t.Fatalf("step %d, %s by %s for %s: %+v, want %s (usable %t)", i, step.r.Action, step.r.OrderID, step.r.MemberID, out, step.want, step.usable)
		}
		switch {
		case out.Result == redemption.ResultUnknownCoupon && (out.AmountYen != 0 || out.ExpiresAt != nil || out.RedeemedAt != nil):
			t.Errorf("step %d: UNKNOWN_COUPON tells of the coupon: %+v", i, out)
		case out.Result == redemption.ResultRedeemed && step.r.OrderID == "A" && first == nil:
			first = out.RedeemedAt
		case out.Result == redemption.ResultRedeemed && step.r.OrderID == "A" && !out.RedeemedAt.Equal(*first):
			t.Errorf("step %d: the same order again answers redeemed_at %v, want the first %v", i, out.RedeemedAt, first)
		}
	}
	want := []string{"redeem A", "rollback A", "redeem B"}
	if h := f.history(t, c); fmt.Sprint(h) != fmt.Sprint(want) {
		t.Errorf("history %v, want %v", h, want)
	}
	if _, err := coupon.Void(context.Background(), f.owner, other, "support: member left", false); err != nil {
		t.Fatal(err)
	}
	if out := f.do(t, req(redemption.Redeem, other, "m2", "C")); out.Result != redemption.ResultCouponVoided {
		t.Errorf("redeem a voided coupon: %+v, want COUPON_VOIDED", out)
	}
	if _, err := coupon.Void(context.Background(), f.owner, c, "support", false); !errors.Is(err, coupon.ErrRefused) {
		t.Errorf("void of a redeemed coupon: %v, want refused", err)
	}
	b, m := f.counters(t)
	if b != budget-500 || m != months-500 { // the void alone gave its 500 yen back
		t.Errorf("counters: budget %d, months %d yen; want %d and %d (redemptions move neither)", b, m, budget-500, months-500)
	}
	if d := f.drift(t); d != 0 {
		t.Errorf("reconcile: %d coupons drifted", d)
	}
}

// TestRefusesBadRequests: a request out of the contract's formats is refused before any call
// (the database refuses the same with 22023: redemption_args_check).
func TestRefusesBadRequests(t *testing.T) {
	t.Parallel()
	svc, err := redemption.New(nil, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := "00000000-0000-4000-8000-000000000000"
	long := string(make([]byte, 129))
	for _, r := range []redemption.Request{
		{Action: "use", CouponID: c, MemberID: "m1", OrderID: "A"},
		{Action: redemption.Redeem, CouponID: "{" + c + "}", MemberID: "m1", OrderID: "A"},
		{Action: redemption.Redeem, CouponID: c, MemberID: "", OrderID: "A"},
		{Action: redemption.Redeem, CouponID: c, MemberID: "m1", OrderID: "A 1"},
		{Action: redemption.Redeem, CouponID: c, MemberID: "m1", OrderID: long},
		{Action: redemption.Redeem, CouponID: c, MemberID: "m1", OrderID: "A", Reason: "x"},
		{Action: redemption.Rollback, CouponID: c, MemberID: "m1", OrderID: "A", Reason: "  "},
		{Action: redemption.Rollback, CouponID: c, MemberID: "m1", OrderID: "A"},
		{Action: redemption.Rollback, CouponID: c, MemberID: "m1", OrderID: "A", Reason: "bad \x00 nul"},
		{Action: redemption.Rollback, CouponID: c, MemberID: "m1", OrderID: "A", Reason: "two\nlines \x1b[31mred"},
	} {
		if out, err := svc.Do(context.Background(), r); err == nil || out.Attempts != 0 {
			t.Errorf("%+v: %+v, %v; want an error before any call", r, out, err)
		}
	}
}

// holdCoupon opens a transaction of its own that holds couponID's row FOR UPDATE, as a void in
// flight does, and returns it with its backend's pid.
func holdCoupon(t *testing.T, url, couponID string) (pgx.Tx, int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM issued_coupons WHERE coupon_id = $1 FOR UPDATE`, couponID); err != nil {
		t.Fatal(err)
	}
	return tx, int(conn.PgConn().PID())
}

// doubleSubmit is the double submit of issue 41: 32 clients redeem one coupon with 32 orders at
// once, each waiting behind a holder of the coupon's row until all 32 wait, then let go. It
// returns the redeem rows of the history and the REDEEMED answers.
func doubleSubmit(t *testing.T, f fixture, c string) (rows, redeemed int) {
	t.Helper()
	const clients = 32
	tx, pid := holdCoupon(t, f.url, c)
	var wg sync.WaitGroup
	answers := make(chan redemption.Result, clients)
	start := make(chan struct{})
	for i := range clients {
		wg.Go(func() {
			<-start
			out, err := f.svc.Do(context.Background(), req(redemption.Redeem, c, "m1", fmt.Sprintf("ORDER-%02d", i)))
			if err != nil {
				t.Error(err)
			}
			answers <- out.Result
		})
	}
	close(start)
	pgtest.WaitBlockedBy(t, f.owner, pid, clients)
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(answers)
	for a := range answers {
		if a == redemption.ResultRedeemed {
			redeemed++
		}
	}
	if err := f.owner.QueryRow(context.Background(),
		`SELECT count(*) FROM coupon_redemptions WHERE coupon_id = $1 AND action = 'redeem'`, c).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	return rows, redeemed
}

// doubleSubmitConfig gives each call a lock wait longer than the 32 clients take to line up.
var doubleSubmitConfig = issuance.Config{Budget: issuance.AppTimeout, LockTimeout: 2 * time.Second, StatementTimeout: 2500 * time.Millisecond}

// TestDoubleSubmitRedeemsOnce: of 32 orders redeeming one coupon at once, exactly one is
// REDEEMED, counted in the history. The broken variant, coupon_redeem reading the coupon without
// its lock and then updating it (the check-then-act of Saleor #544 and Medusa #16012), redeems
// it for every order that read it before the first wrote: the count finds it.
func TestDoubleSubmitRedeemsOnce(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%t", broken), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, 33, doubleSubmitConfig)
			c := f.coupon(t, "m1")
			if broken {
				pgtest.BreakFunction(t, f.owner, "coupon_redeem", [2]string{"\n     FOR NO KEY UPDATE;", ";"})
			}
			rows, redeemed := doubleSubmit(t, f, c)
			var problems []string
			if rows != 1 || redeemed != 1 {
				problems = append(problems, fmt.Sprintf("%d redeem rows and %d REDEEMED answers for 32 orders, want 1 and 1", rows, redeemed))
			}
			if d := f.drift(t); d != 0 {
				problems = append(problems, fmt.Sprintf("reconcile: %d coupons whose redemption disagrees with its history", d))
			}
			pgtest.Verdict(t, broken, problems)
		})
	}
}

// TestRollbackUnderTheLock: a rollback of order A waits while another session rolls A back and
// redeems the coupon for order B in one transaction. Once that commits, the waiting rollback
// answers ROLLED_BACK (A's was undone), not usable, and B keeps the coupon. The broken variant,
// a rollback that reads without the lock (Medusa #16595's unlocked revert), read A as the holder
// before B's commit and clears B's redemption: the coupon is free again while order B holds it,
// and reconcile finds the history broken.
func TestRollbackUnderTheLock(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%t", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := newFixture(t, 2, doubleSubmitConfig)
			c := f.coupon(t, "m1")
			if out := f.do(t, req(redemption.Redeem, c, "m1", "A")); out.Result != redemption.ResultRedeemed {
				t.Fatalf("redeem A: %+v", out)
			}
			if broken {
				pgtest.BreakFunction(t, f.owner, "coupon_redemption_rollback", [2]string{"\n     FOR NO KEY UPDATE;", ";"})
			}
			conn, err := pgx.Connect(ctx, f.url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range []string{
				`SELECT coupon_redemption_rollback($1, 'm1', 'A', 'cancelled at the till')`,
				`SELECT coupon_redeem($1, 'm1', 'B')`,
			} {
				if _, err := tx.Exec(ctx, q, c); err != nil {
					t.Fatal(err)
				}
			}
			answer := make(chan redemption.Outcome, 1)
			go func() {
				out, err := f.svc.Do(ctx, req(redemption.Rollback, c, "m1", "A"))
				if err != nil {
					t.Error(err)
				}
				answer <- out
			}()
			pgtest.WaitBlockedBy(t, f.owner, int(conn.PgConn().PID()), 1)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			out := <-answer
			var problems []string
			if out.Result != redemption.ResultRolledBack || out.Usable {
				problems = append(problems, fmt.Sprintf("the waiting rollback of A: %+v, want ROLLED_BACK, not usable", out))
			}
			var redeemed bool
			if err := f.owner.QueryRow(ctx, `SELECT redeemed_at IS NOT NULL FROM issued_coupons WHERE coupon_id = $1`, c).Scan(&redeemed); err != nil {
				t.Fatal(err)
			}
			if !redeemed {
				problems = append(problems, fmt.Sprintf("order B's redemption was undone by A's rollback: history %v", f.history(t, c)))
			}
			if d := f.drift(t); d != 0 {
				problems = append(problems, fmt.Sprintf("reconcile: %d coupons whose redemption disagrees with its history", d))
			}
			pgtest.Verdict(t, broken, problems)
		})
	}
}

// TestExpiryByTheDatabaseClock: a coupon is judged by the database's clock at the write
// (issue_now()), whatever any other clock says: a second before its expiry it is redeemed, and
// rolled back after its expiry it is given back not usable; at its expiry a new redemption is
// COUPON_EXPIRED with the expiry, nothing written. The broken variant judges the expiry by
// another clock (clock_timestamp(), the server's own, as a service judging by its own clock
// would): with the database's clock moved past the expiry, it redeems.
func TestExpiryByTheDatabaseClock(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%t", broken), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, 2, issuance.Config{})
			c, d := f.coupon(t, "m1"), f.coupon(t, "m2")
			var expires time.Time
			if err := f.owner.QueryRow(context.Background(), `SELECT expires_at FROM issued_coupons WHERE coupon_id = $1`, c).Scan(&expires); err != nil {
				t.Fatal(err)
			}
			if broken {
				pgtest.BreakFunction(t, f.owner, "redemption_judge", [2]string{"issue_now()", "clock_timestamp()"})
			}
			var problems []string
			pgtest.SetClock(t, f.owner, expires.Add(-time.Second))
			if out := f.do(t, req(redemption.Redeem, d, "m2", "A")); out.Result != redemption.ResultRedeemed {
				problems = append(problems, fmt.Sprintf("a second before the expiry: %+v, want REDEEMED", out))
			}
			pgtest.SetClock(t, f.owner, expires)
			if out := f.do(t, req(redemption.Redeem, c, "m1", "B")); out.Result != redemption.ResultCouponExpired ||
				out.ExpiresAt == nil || !out.ExpiresAt.Equal(expires) {
				problems = append(problems, fmt.Sprintf("at the expiry: %+v, want COUPON_EXPIRED with expires_at %v", out, expires))
			}
			if out := f.do(t, req(redemption.Rollback, d, "m2", "A")); out.Result != redemption.ResultRolledBack || out.Usable {
				problems = append(problems, fmt.Sprintf("a rollback after the expiry: %+v, want ROLLED_BACK, not usable", out))
			}
			if h := f.history(t, c); len(h) != 0 {
				problems = append(problems, fmt.Sprintf("the expired coupon's history: %v, want none", h))
			}
			pgtest.Verdict(t, broken, problems)
		})
	}
}

// TestVoidAndRedemptionRace: a void and a redemption of each of 16 coupons, sent at once: exactly
// one wins per coupon, and each loser says why (COUPON_VOIDED; the void refused: redeemed).
func TestVoidAndRedemptionRace(t *testing.T) {
	t.Parallel()
	const n = 16
	f := newFixture(t, n, issuance.Config{})
	coupons := make([]string, n)
	for i := range coupons {
		coupons[i] = f.coupon(t, fmt.Sprintf("m%02d", i))
	}
	admin := pgtest.PoolAt(t, pgtest.LoginAs(t, f.url, "coupon_admin"), n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range coupons {
		member := fmt.Sprintf("m%02d", i)
		wg.Go(func() {
			<-start
			if _, err := coupon.Void(context.Background(), admin, c, "race", false); err != nil && !errors.Is(err, coupon.ErrRefused) {
				t.Error(err)
			}
		})
		wg.Go(func() {
			<-start
			out, err := f.svc.Do(context.Background(), req(redemption.Redeem, c, member, "ORDER"))
			if err != nil {
				t.Error(err)
			} else if out.Result != redemption.ResultRedeemed && out.Result != redemption.ResultCouponVoided {
				t.Errorf("redeem: %+v, want REDEEMED or COUPON_VOIDED", out)
			}
		})
	}
	close(start)
	wg.Wait()
	var both, neither, voided int
	if err := f.owner.QueryRow(context.Background(), `
SELECT count(*) FILTER (WHERE voided_at IS NOT NULL AND redeemed_at IS NOT NULL),
       count(*) FILTER (WHERE voided_at IS NULL AND redeemed_at IS NULL),
       count(*) FILTER (WHERE voided_at IS NOT NULL)
  FROM issued_coupons`).Scan(&both, &neither, &voided); err != nil {
		t.Fatal(err)
	}
	if both != 0 || neither != 0 {
		t.Errorf("%d coupons both voided and redeemed, %d neither, want 0 and 0", both, neither)
	}
	if d := f.drift(t); d != 0 {
		t.Errorf("reconcile: %d coupons drifted", d)
	}
	t.Logf("%d voids won, %d redemptions", voided, n-voided)
}

// TestRedemptionNeverMeetsTheIssuance: the redemption's lock is the coupon's row alone. While a
// session holds every budget stripe of the coupon's campaign (a hot campaign's issuance in
// flight), a redemption of its coupon goes through; while a redemption holds a coupon's row,
// the campaign issues to another member. Both under a lock timeout far below the holds'.
func TestRedemptionNeverMeetsTheIssuance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, 2, issuance.Config{Budget: time.Second, LockTimeout: 100 * time.Millisecond, StatementTimeout: 500 * time.Millisecond})
	c := f.coupon(t, "m1")
	hold := pgtest.HoldCampaign(t, f.url, "CART")
	if out := f.do(t, req(redemption.Redeem, c, "m1", "A")); out.Result != redemption.ResultRedeemed {
		t.Errorf("redeem while the campaign's stripes are held: %+v, want REDEEMED", out)
	}
	hold.Release()

	conn, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT coupon_redemption_rollback($1, 'm1', 'A', 'held open')`, c); err != nil {
		t.Fatal(err)
	}
	iss, err := issuance.New(f.owner, issuance.Config{Budget: time.Second, LockTimeout: 100 * time.Millisecond, StatementTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := iss.Issue(ctx, "m2", "CART"); err != nil || out.Result != issuance.ResultIssued || out.Attempts != 1 {
		t.Errorf("issue while a redemption holds a coupon of the campaign: %+v, %v; want ISSUED at the first attempt", out, err)
	}
}
