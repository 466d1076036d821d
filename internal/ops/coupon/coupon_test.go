package coupon_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// voidDB is a test's database: the owner's pool IssueCoupon's service runs on, and an
// operator's pool as a user in coupon_admin, as `couponctl coupon void` runs.
type voidDB struct {
	url         string
	pool, admin *pgxpool.Pool
	svc         *issuance.Service
}

func newVoidDB(t *testing.T, campaigns ...campaign.Campaign) *voidDB {
	t.Helper()
	ctx := context.Background()
	d := &voidDB{url: pgtest.URL(t)}
	var err error
	if d.pool, err = pgxpool.New(ctx, d.url+"&pool_max_conns=40"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.pool.Close)
	if d.admin, err = pgxpool.New(ctx, pgtest.LoginAs(t, d.url, "coupon_admin")+"&pool_max_conns=48"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.admin.Close)
	for _, c := range campaigns {
		if err := campaign.Create(ctx, d.pool, c); err != nil {
			t.Fatal(err)
		}
	}
	if d.svc, err = issuance.New(d.pool, issuance.Config{}); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *voidDB) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := d.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// violations is what the tables show wrong: reconcile's findings (every counter equal to the sum
// of the live coupons it counts, R1-R3, the outbox) and any stripe outside 0..its budget.
func (d *voidDB) violations(t *testing.T) []string {
	t.Helper()
	rep, err := reconcile.Check(context.Background(), d.pool)
	if err != nil {
		t.Fatal(err)
	}
	v := rep.Violations()
	if n := d.count(t, `SELECT count(*) FROM campaign_budgets WHERE issued_yen < 0 OR issued_yen > budget_yen`); n > 0 {
		v = append(v, fmt.Sprintf("%d stripes outside 0..their budget", n))
	}
	return v
}

// voidsUnderLoad issues coupons of A (1 stripe) and B (8 stripes) to 200 members, then runs 200
// voids (half with reissue allowed) from 8 operator sessions, 20 of them by two sessions at the
// same instant, while 32 clients keep asking for A and B for the same members. It returns what
// the voids answered: how many coupons were voided, how many of the 20 double voids were voided
// twice, and the voids that failed (other than refused).
func voidsUnderLoad(t *testing.T, d *voidDB) (voided, twice int, failures []error) {
	t.Helper()
	ctx := context.Background()
	member := func(i int) string { return fmt.Sprintf("m%03d", i%200) }
	var ids []string
	for i := range 200 {
		c := "A"
		if i%2 == 1 {
			c = "B"
		}
		out, err := d.svc.Issue(ctx, member(i), c)
		if err != nil || out.Result != issuance.ResultIssued {
			t.Fatalf("issue %s %s: %+v %v", member(i), c, out, err)
		}
		ids = append(ids, out.CouponID)
	}

	stop := make(chan struct{})
	var clients sync.WaitGroup
	var failed atomic.Int64
	for c := range 32 {
		clients.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(c), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				camp := []string{"A", "B"}[rnd.IntN(2)]
				if _, err := d.svc.Issue(ctx, member(rnd.IntN(200)), camp); err != nil {
					failed.Add(1)
				}
			}
		})
	}

	var voidedN, twiceN atomic.Int64
	var errs []error
	var mu sync.Mutex
	note := func(err error) {
		if err != nil && !errors.Is(err, coupon.ErrRefused) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	// 20 double voids: two sessions void the same coupon at the same instant.
	var doubles sync.WaitGroup
	for i := range 20 {
		barrier := make(chan struct{})
		var ok atomic.Int64
		var pair sync.WaitGroup
		for range 2 {
			pair.Go(func() {
				<-barrier
				_, err := coupon.Void(ctx, d.admin, ids[i], "double", i%2 == 0)
				if err == nil {
					ok.Add(1)
					voidedN.Add(1)
				}
				note(err)
			})
		}
		doubles.Go(func() {
			close(barrier)
			pair.Wait()
			if ok.Load() == 2 {
				twiceN.Add(1)
			}
		})
	}
	// 180 single voids from 8 sessions.
	next := atomic.Int64{}
	next.Store(20)
	var voiders sync.WaitGroup
	for range 8 {
		voiders.Go(func() {
			for i := int(next.Add(1) - 1); i < 200; i = int(next.Add(1) - 1) {
				_, err := coupon.Void(ctx, d.admin, ids[i], "single", i%2 == 0)
				if err == nil {
					voidedN.Add(1)
				}
				note(err)
			}
		})
	}
	doubles.Wait()
	voiders.Wait()
	close(stop)
	clients.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d issuances failed", n)
	}
	return int(voidedN.Load()), int(twiceN.Load()), errs
}

// TestVoidsUnderLoad: 200 voids, 20 of them by two sessions at once, while 32 clients issue for
// the same members and campaigns. Every coupon is voided once (each double void once voided,
// once refused), every counter equals its live coupons, no stripe leaves 0..its budget, and no
// deadlock. The broken variants (a void that reads the month's counter and writes it back, one
// without the coupon row's lock) are shown red by TestVoidBesideAnOpenTransaction, which makes
// their races happen: under load they happen only by chance.
func TestVoidsUnderLoad(t *testing.T) {
	t.Parallel()
	campaigns := []campaign.Campaign{
		{ID: "A", DiscountYen: 500, BudgetYen: 10_000_000},
		{ID: "B", DiscountYen: 700, BudgetYen: 10_000_000, Stripes: 8},
	}
	for round := range 2 {
		t.Run(fmt.Sprint("round ", round+1), func(t *testing.T) {
			t.Parallel()
			d := newVoidDB(t, campaigns...)
			voided, twice, failures := voidsUnderLoad(t, d)
			if err := errors.Join(failures...); err != nil {
				t.Fatal(err)
			}
			if voided != 200 || twice != 0 {
				t.Errorf("%d voids answered VOIDED (%d coupons voided twice), want 200 and 0", voided, twice)
			}
			if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE voided_at IS NOT NULL`); n != 200 {
				t.Errorf("%d coupons voided, want 200", n)
			}
			for _, v := range d.violations(t) {
				t.Error(v)
			}
			d.pool.Close()
			d.admin.Close()
			if n := pgtest.Deadlocks(t, d.url); n != 0 {
				t.Errorf("%d deadlocks (40P01)", n)
			}
		})
	}
}

// The broken variants of coupon_void that TestVoidBesideAnOpenTransaction shows red.
var (
	// readThenWrite reads the month's counter and writes back what it read less the coupon.
	readThenWrite = [][2]string{
		{"  v_stripe smallint;\n", "  v_stripe smallint;\n  v_used   integer;\n"},
		{`  UPDATE member_monthly_usage u SET used_yen = u.used_yen - v_c.amount_yen
   WHERE u.member_id = v_c.member_id AND u.month = v_c.month AND u.used_yen >= v_c.amount_yen;`,
			`  SELECT u.used_yen INTO v_used FROM member_monthly_usage u WHERE u.member_id = v_c.member_id AND u.month = v_c.month;
  UPDATE member_monthly_usage u SET used_yen = v_used - v_c.amount_yen
   WHERE u.member_id = v_c.member_id AND u.month = v_c.month AND v_used >= v_c.amount_yen;`},
	}
	// noCouponLock reads the coupon row without locking it.
	noCouponLock = [][2]string{{"WHERE c.coupon_id = p_coupon_id FOR UPDATE;", "WHERE c.coupon_id = p_coupon_id;"}}
)

// TestVoidBesideAnOpenTransaction: the two races a void must win, each made to happen, not hoped
// for: a transaction is left open at the point of the race, the void runs until it waits for that
// transaction (pg_blocking_pids), and then the transaction commits.
//   - A second void of the same coupon while the first is uncommitted: it waits for the coupon
//     row and is refused (already voided); the yen came back once. Red without the row's lock:
//     both read the coupon live and give its yen back twice.
//   - A void while an issuance of another campaign for the member holds the member's month: the void's
//     counter write waits and then subtracts from the issuance's figure. Red for a void that
//     reads the counter first and writes back what it read: the issuance's yen are lost.
func TestVoidBesideAnOpenTransaction(t *testing.T) {
	t.Parallel()
	races := []struct {
		name   string
		broken [][2]string
		// open runs the first transaction up to the race, on its own connection; it returns
		// how to commit it.
		open func(t *testing.T, d *voidDB, couponID string) pgx.Tx
		// refused is whether the void that waits is refused once the first has committed.
		refused bool
	}{
		{"a second void", noCouponLock, func(t *testing.T, d *voidDB, couponID string) pgx.Tx {
			tx := begin(t, d.admin)
			if _, err := tx.Exec(context.Background(), `SELECT * FROM coupon_void($1, 'first', false)`, couponID); err != nil {
				t.Fatal(err)
			}
			return tx
		}, true},
		{"an issuance of the member's month", readThenWrite, func(t *testing.T, d *voidDB, _ string) pgx.Tx {
			tx := begin(t, d.pool)
			if _, err := tx.Exec(context.Background(), `SELECT * FROM issue_coupon(gen_random_uuid(), 'C', 'm1', now(), 2000, NULL)`); err != nil {
				t.Fatal(err)
			}
			return tx
		}, false},
	}
	for _, r := range races {
		for _, broken := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s broken=%v", r.name, broken), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				d := newVoidDB(t, campaign.Campaign{ID: "A", DiscountYen: 500, BudgetYen: 100_000},
					campaign.Campaign{ID: "B", DiscountYen: 700, BudgetYen: 100_000},
					campaign.Campaign{ID: "C", DiscountYen: 300, BudgetYen: 100_000})
				if broken {
					pgtest.BreakFunction(t, d.pool, "coupon_void", r.broken...)
				}
				// The coupon voided, m1's A, shares its stripe with m2's A and its month with m1's
				// B: a second give-back finds the yen to take from both, and fails nothing.
				var out issuance.Outcome
				for _, p := range [][2]string{{"m2", "A"}, {"m1", "B"}, {"m1", "A"}} {
					var err error
					if out, err = d.svc.Issue(ctx, p[0], p[1]); err != nil || out.Result != issuance.ResultIssued {
						t.Fatalf("issue %v: %+v %v", p, out, err)
					}
				}
				first := r.open(t, d, out.CouponID)
				var pid uint32
				if err := first.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					t.Fatal(err)
				}
				voided := make(chan error, 1)
				go func() { _, err := coupon.Void(ctx, d.admin, out.CouponID, "second", false); voided <- err }()
				pgtest.Eventually(t, pgtest.PollTimeout, func() error {
					if n := d.count(t, `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))`, pid); n != 1 {
						return fmt.Errorf("%d sessions wait for the open transaction, want the void", n)
					}
					return nil
				})
				if err := first.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				err := <-voided
				wrong := d.violations(t)
				if r.refused && !broken && !errors.Is(err, coupon.ErrRefused) {
					wrong = append(wrong, fmt.Sprintf("the waiting void: %v, want refused", err))
				}
				if !r.refused && err != nil {
					wrong = append(wrong, fmt.Sprintf("the void: %v", err))
				}
				switch {
				case broken && len(wrong) == 0:
					t.Error("the broken variant passed: the test would not see it")
				case broken:
					t.Logf("the broken variant: %v", wrong)
				default:
					for _, w := range wrong {
						t.Error(w)
					}
				}
			})
		}
	}
}

func begin(t *testing.T, db *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := db.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	return tx
}

// TestReissueAfterVoid: a voided pair answers COUPON_VOIDED with the voided coupon's id, never
// ALREADY_ISSUED; with reissue allowed the member is issued a new coupon, under the cap: the void
// gave the month its yen back. A second void, and a void of a coupon that does not exist, are
// refused and change nothing.
func TestReissueAfterVoid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newVoidDB(t,
		campaign.Campaign{ID: "KEEP", DiscountYen: 1000, BudgetYen: 100_000},
		campaign.Campaign{ID: "AGAIN", DiscountYen: 1000, BudgetYen: 100_000},
		campaign.Campaign{ID: "THIRD", DiscountYen: 1000, BudgetYen: 100_000})
	issue := func(m, c string) issuance.Outcome {
		t.Helper()
		out, err := d.svc.Issue(ctx, m, c)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	keep, again := issue("m1", "KEEP"), issue("m1", "AGAIN")
	if out := issue("m1", "THIRD"); out.Result != issuance.ResultMonthlyCap {
		t.Fatalf("a third coupon: %+v, want MONTHLY_CAP (2,000 yen held)", out)
	}
	if _, err := coupon.Void(ctx, d.admin, keep.CouponID, "wrong account", false); err != nil {
		t.Fatal(err)
	}
	if _, err := coupon.Void(ctx, d.admin, again.CouponID, "wrong account", true); err != nil {
		t.Fatal(err)
	}
	if out := issue("m1", "KEEP"); out.Result != issuance.ResultCouponVoided || out.CouponID != keep.CouponID {
		t.Errorf("re-send of a voided pair: %+v, want COUPON_VOIDED with %s", out, keep.CouponID)
	}
	fresh := issue("m1", "AGAIN")
	if fresh.Result != issuance.ResultIssued || fresh.CouponID == again.CouponID {
		t.Errorf("after a void with reissue: %+v, want a new coupon", fresh)
	}
	if out := issue("m1", "AGAIN"); out.Result != issuance.ResultAlreadyIssued || out.CouponID != fresh.CouponID {
		t.Errorf("re-send after the reissue: %+v, want ALREADY_ISSUED with %s", out, fresh.CouponID)
	}
	if out := issue("m1", "THIRD"); out.Result != issuance.ResultIssued {
		t.Errorf("a third coupon once a void gave 1,000 yen back: %+v, want ISSUED", out)
	}
	if _, err := coupon.Void(ctx, d.admin, keep.CouponID, "again", false); !errors.Is(err, coupon.ErrRefused) {
		t.Errorf("a second void: %v, want refused", err)
	}
	if _, err := coupon.Void(ctx, d.admin, "00000000-0000-4000-8000-000000000000", "none", false); !errors.Is(err, coupon.ErrNotFound) {
		t.Errorf("a void of no coupon: %v, want not found", err)
	}
	if _, err := d.pool.Exec(ctx, `SELECT coupon_redeem($1, member_id, 'ORDER-1') FROM issued_coupons WHERE coupon_id = $1`, fresh.CouponID); err != nil {
		t.Fatal(err)
	}
	if _, err := coupon.Void(ctx, d.admin, fresh.CouponID, "redeemed", false); !errors.Is(err, coupon.ErrRefused) {
		t.Errorf("a void of a redeemed coupon: %v, want refused", err)
	}
	c, err := coupon.Show(ctx, d.admin, keep.CouponID)
	if err != nil || c.VoidedAt == nil || c.VoidReason != "wrong account" || c.ReissueAllowed || c.VoidedBy == "" {
		t.Errorf("coupon show: %+v %v", c, err)
	}
	for _, v := range d.violations(t) {
		t.Error(v)
	}
}

// TestExpiry: a coupon is stamped with the start of the Tokyo day D days after its issue day
// (the issue day is the first), across a day and a month boundary (issued at 23:59:59 JST on the
// last day of November), or with the campaign's fixed instant, or with nothing; ALREADY_ISSUED
// answers the same expiry.
func TestExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fixed := time.Date(2027, 1, 31, 0, 0, 0, 0, issuance.Tokyo)
	d := newVoidDB(t,
		campaign.Campaign{ID: "DAYS1", DiscountYen: 100, BudgetYen: 100_000, CouponValidDays: 1},
		campaign.Campaign{ID: "DAYS7", DiscountYen: 100, BudgetYen: 100_000, CouponValidDays: 7},
		campaign.Campaign{ID: "FIXED", DiscountYen: 100, BudgetYen: 100_000, CouponsExpireAt: &fixed},
		campaign.Campaign{ID: "NONE", DiscountYen: 100, BudgetYen: 100_000})
	for _, c := range []struct {
		at       time.Time
		campaign string
		want     *time.Time
	}{
		{time.Date(2026, 11, 30, 23, 59, 59, 0, issuance.Tokyo), "DAYS1", ptr(time.Date(2026, 12, 1, 0, 0, 0, 0, issuance.Tokyo))},
		{time.Date(2026, 11, 30, 23, 59, 59, 0, issuance.Tokyo), "DAYS7", ptr(time.Date(2026, 12, 7, 0, 0, 0, 0, issuance.Tokyo))},
		{time.Date(2026, 12, 1, 0, 0, 0, 0, issuance.Tokyo), "DAYS1", ptr(time.Date(2026, 12, 2, 0, 0, 0, 0, issuance.Tokyo))},
		{time.Date(2026, 11, 30, 14, 59, 59, 0, time.UTC), "DAYS1", ptr(time.Date(2026, 12, 1, 0, 0, 0, 0, issuance.Tokyo))}, // 23:59:59 JST, given in UTC
		{time.Date(2026, 11, 30, 23, 59, 59, 0, issuance.Tokyo), "FIXED", &fixed},
		{time.Date(2026, 11, 30, 23, 59, 59, 0, issuance.Tokyo), "NONE", nil},
	} {
		pgtest.SetClock(t, d.pool, c.at)
		svc, err := issuance.New(d.pool, issuance.Config{})
		if err != nil {
			t.Fatal(err)
		}
		member := fmt.Sprintf("m%d-%s", c.at.UnixNano(), c.at.Location())
		for _, want := range []issuance.Result{issuance.ResultIssued, issuance.ResultAlreadyIssued} {
			out, err := svc.Issue(ctx, member, c.campaign)
			if err != nil || out.Result != want || !sameTime(out.ExpiresAt, c.want) {
				t.Errorf("%s issued at %s: %+v %v, want %s expiring %v", c.campaign, c.at, out, err, want, c.want)
			}
		}
		// Expired is the database's judgement at its clock: not a microsecond before the expiry,
		// at it.
		if c.want == nil {
			continue
		}
		list, err := coupon.ForMember(ctx, d.pool, member, c.campaign)
		if err != nil || len(list) != 1 {
			t.Fatalf("%s's coupons: %v %v", member, list, err)
		}
		for _, at := range []struct {
			clock   time.Time
			expired bool
		}{{c.want.Add(-time.Microsecond), false}, {*c.want, true}} {
			pgtest.SetClock(t, d.pool, at.clock)
			if got, err := coupon.Show(ctx, d.pool, list[0].ID); err != nil || got.Expired != at.expired {
				t.Errorf("%s's coupon at %s: expired %t (%v), want %t", member, at.clock, got.Expired, err, at.expired)
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// claims are the relay's claims of every release that may run beside this one, each answering
// the coupon ids it leased: outbox_claim (this release, a function that also closes rows it
// must not push), and the previous release's inline claim, which leases every due row.
var claims = map[string]string{
	"outbox_claim": `SELECT coalesce(array_agg(coupon_id) FILTER (WHERE skip_reason IS NULL), '{}')
		FROM outbox_claim(100, gen_random_uuid(), interval '30 seconds', now(), interval '23 hours')`,
	"previous inline claim": `WITH due AS MATERIALIZED (
		  SELECT coupon_id FROM notification_outbox
		   WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL AND next_attempt_at <= now()
		   ORDER BY next_attempt_at LIMIT 100 FOR UPDATE SKIP LOCKED),
		leased AS (UPDATE notification_outbox o SET next_attempt_at = now() + interval '30 seconds', claimed_by = gen_random_uuid()
		  FROM due WHERE o.coupon_id = due.coupon_id RETURNING o.coupon_id::text)
		SELECT coalesce(array_agg(coupon_id), '{}') FROM leased`,
}

// TestVoidClosesItsOutboxRow: a claim, of this release or the previous one, made while a void of
// the coupon is open (its transaction left open after coupon_void returned) leases nothing of
// that coupon, and once the void commits its row is closed as skipped (reason voided), so no
// claim ever leases it: the race is made to happen, not hoped for. The broken variant, 00011's
// void that only reads the outbox row, lets the claim lease the voided coupon's row, and the
// relay would push it.
func TestVoidClosesItsOutboxRow(t *testing.T) {
	t.Parallel()
	// notClosed is 00011's behaviour: the outbox row read, not locked, and left open.
	notClosed := [][2]string{
		{"AND o.parked_at IS NULL\n     FOR UPDATE;", "AND o.parked_at IS NULL;"},
		{"IF push = 'not sent' THEN", "IF false THEN"},
	}
	for name, claim := range claims {
		for _, broken := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s broken=%v", name, broken), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				d := newVoidDB(t, campaign.Campaign{ID: "A", DiscountYen: 500, BudgetYen: 100_000})
				if broken {
					pgtest.BreakFunction(t, d.pool, "coupon_void", notClosed...)
				}
				// Linked to LINE, so that outbox_claim would push it, not close it as unlinked.
				if _, err := d.pool.Exec(ctx, `INSERT INTO member_line_accounts (member_id, line_user_id) VALUES ('m1', 'U' || repeat('0', 32))`); err != nil {
					t.Fatal(err)
				}
				out, err := d.svc.Issue(ctx, "m1", "A")
				if err != nil || out.Result != issuance.ResultIssued {
					t.Fatalf("issue: %+v %v", out, err)
				}
				void := begin(t, d.admin)
				var push string
				if err := void.QueryRow(ctx, `SELECT push FROM coupon_void($1, 'support ticket', false)`, out.CouponID).Scan(&push); err != nil {
					t.Fatal(err)
				}
				var during, after []string
				if err := d.pool.QueryRow(ctx, claim).Scan(&during); err != nil {
					t.Fatal(err)
				}
				if err := void.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				if err := d.pool.QueryRow(ctx, claim).Scan(&after); err != nil {
					t.Fatal(err)
				}
				var wrong []string
				if len(during) != 0 || len(after) != 0 {
					wrong = append(wrong, fmt.Sprintf("the claim leased %v while the void was open and %v after it; want nothing (the void said %q)", during, after, push))
				}
				if n := d.count(t, `SELECT count(*) FROM notification_outbox WHERE coupon_id = $1 AND skipped_at IS NOT NULL AND skip_reason = 'voided'`, out.CouponID); n != 1 {
					wrong = append(wrong, "the voided coupon's outbox row is not closed as skipped (voided)")
				}
				switch {
				case broken && len(wrong) == 0:
					t.Error("the broken variant passed: the test would not see a voided coupon leased for its push")
				case broken:
					t.Logf("the broken variant: %v", wrong)
				default:
					for _, w := range wrong {
						t.Error(w)
					}
					if push != "not sent" {
						t.Errorf("the void said push %q, want not sent", push)
					}
				}
			})
		}
	}
}
