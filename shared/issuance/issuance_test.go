package issuance_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// silverWeekDay is a fixed clock inside Silver Week 2026, 10:00 JST on 20 September.
var silverWeekDay = time.Date(2026, 9, 20, 10, 0, 0, 0, issuance.Tokyo)

type bundle struct {
	pool *pgxpool.Pool
	svc  *issuance.Service
}

// setup gives a test its own migrated database with the Silver Week campaigns (SW-A's budget
// replaced by budgetA yen when positive) and a Service on a pool of maxConns connections.
func setup(t *testing.T, maxConns int32, budgetA int, cfg issuance.Config) bundle {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t, maxConns)
	campaigns := append([]silverweek.Campaign(nil), silverweek.Campaigns...)
	if budgetA > 0 {
		campaigns[0].BudgetYen = budgetA
	}
	if err := silverweek.CreateCampaigns(ctx, pool, campaigns); err != nil {
		t.Fatal(err)
	}
	pgtest.SetClock(t, pool, silverWeekDay)
	svc, err := issuance.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return bundle{pool: pool, svc: svc}
}

func count(t *testing.T, q queryRower, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := q.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func issue(t *testing.T, svc *issuance.Service, member, campaignID string) issuance.Outcome {
	t.Helper()
	out, err := svc.Issue(context.Background(), member, campaignID)
	if err != nil {
		t.Fatalf("Issue(%s, %s): %v", member, campaignID, err)
	}
	return out
}

// issueResending is one request as the app sends it: re-sent while it answers RETRY_EXHAUSTED
// (nothing written, safe to re-send), at most silverweek.MaxResends times.
func issueResending(svc *issuance.Service, member, campaignID string) (issuance.Outcome, error) {
	for n := 0; ; n++ {
		out, err := svc.Issue(context.Background(), member, campaignID)
		if err != nil || out.Result != issuance.ResultRetryExhausted || n == silverweek.MaxResends {
			return out, err
		}
	}
}

// TestSequentialWalkThrough is the walk-through of docs/design.md, SW-A's budget at 2,000 yen.
func TestSequentialWalkThrough(t *testing.T) {
	t.Parallel()
	b := setup(t, 4, 2000, issuance.Config{})
	steps := []struct {
		member, campaign string
		want             issuance.Result
	}{
		{"m0001", "SW-A", issuance.ResultIssued},
		{"m0001", "SW-A", issuance.ResultAlreadyIssued}, // double tap
		{"m0001", "SW-B", issuance.ResultIssued},
		{"m0001", "SW-C", issuance.ResultMonthlyCap}, // third coupon of the month
		{"m0002", "SW-A", issuance.ResultIssued},
		{"m0003", "SW-A", issuance.ResultBudgetExceeded}, // SW-A's 2,000 yen are spent
	}
	var first issuance.Outcome
	for i, s := range steps {
		out := issue(t, b.svc, s.member, s.campaign)
		if out.Result != s.want {
			t.Fatalf("step %d %s %s: got %s, want %s", i+1, s.member, s.campaign, out.Result, s.want)
		}
		switch i {
		case 0:
			first = out
			if out.AmountYen != 1000 || out.Month != "2026-09" || out.CouponID == "" {
				t.Fatalf("ISSUED outcome %+v: want 1000 yen in 2026-09 with a coupon id", out)
			}
		case 1:
			if out.CouponID != first.CouponID {
				t.Fatalf("ALREADY_ISSUED carries %q, want the first coupon %q", out.CouponID, first.CouponID)
			}
		}
	}
	if n := count(t, b.pool, `SELECT count(*) FROM issued_coupons`); n != 3 {
		t.Errorf("coupons: %d, want 3", n)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notification_outbox`); n != 3 {
		t.Errorf("outbox rows: %d, want 3", n)
	}
	// The rejected m0003 created its usage row in step (2) of the transaction; the rollback of
	// BUDGET_EXCEEDED must have taken it away again.
	if n := count(t, b.pool, `SELECT count(*) FROM member_monthly_usage WHERE member_id = 'm0003'`); n != 0 {
		t.Errorf("m0003 usage rows: %d, want 0 (a rejected request writes nothing)", n)
	}
	if n := count(t, b.pool, `SELECT used_yen FROM member_monthly_usage WHERE member_id = 'm0001'`); n != 2000 {
		t.Errorf("m0001 used_yen: %d, want 2000", n)
	}
	st, err := campaign.Show(context.Background(), b.pool, "SW-A")
	if err != nil || st.IssuedYen != 2000 {
		t.Errorf("SW-A: %+v, %v; want 2000 yen issued", st, err)
	}
	assertRulesHeld(t, b.pool)
}

func assertRulesHeld(t *testing.T, pool *pgxpool.Pool) reconcile.Report {
	t.Helper()
	rep, err := reconcile.Check(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if v := rep.Violations(); len(v) > 0 {
		t.Fatalf("rules broken:\n%v", v)
	}
	return rep
}

// runSilverWeek replays the scenario through issue with workers released from a barrier. Like the
// app, it re-sends a request that answered RETRY_EXHAUSTED (silverweek.Resending), so a loaded
// machine changes how often requests are re-sent, never the outcome the tables must show.
func runSilverWeek(t *testing.T, workers int, issueFn silverweek.IssueFunc) (silverweek.Stats, int64) {
	t.Helper()
	reqs := silverweek.Requests(silverweek.DefaultMembers, silverweek.Campaigns, silverweek.DefaultTapGap, uint64(workers))
	var resends atomic.Int64
	stats := silverweek.Run(context.Background(), reqs, workers, silverweek.Resending(issueFn, &resends), nil)
	return stats, resends.Load()
}

// TestSilverWeekConcurrency replays the Silver Week traffic and counts the tables: exactly 600
// coupons, each member two, SW-A at exactly its budget, counters equal to sums, one outbox row
// per coupon. Every answer is a final business result (re-sends included), and the ISSUED
// answers match the coupons in the table.
func TestSilverWeekConcurrency(t *testing.T) {
	for _, workers := range []int{8, 32, 64} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			b := setup(t, int32(workers), 0, issuance.Config{})
			stats, resends := runSilverWeek(t, workers, func(ctx context.Context, r silverweek.Request) (string, error) {
				out, err := b.svc.Issue(ctx, r.MemberID, r.CampaignID)
				return string(out.Result), err
			})
			if stats.Errors > 0 {
				t.Fatalf("%d requests failed, first: %v", stats.Errors, stats.FirstErr)
			}
			t.Logf("results %v after %d re-sends of RETRY_EXHAUSTED", stats.Results, resends)
			for res, n := range stats.Results {
				switch issuance.Result(res) {
				case issuance.ResultIssued, issuance.ResultAlreadyIssued, issuance.ResultMonthlyCap, issuance.ResultBudgetExceeded:
				default:
					t.Errorf("%d answers %s: want only ISSUED, ALREADY_ISSUED, MONTHLY_CAP, BUDGET_EXCEEDED", n, res)
				}
			}
			wrong, err := silverweek.Verify(context.Background(), b.pool, silverweek.DefaultMembers)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range wrong {
				t.Error(w)
			}
			if n := stats.Results[string(issuance.ResultIssued)]; n != 600 {
				t.Errorf("ISSUED answers: %d, want 600 (one per coupon in the table)", n)
			}
		})
	}
}

// TestLastCouponOfTheBudget: a budget for exactly one coupon and 64 members at once.
func TestLastCouponOfTheBudget(t *testing.T) {
	t.Parallel()
	b := setup(t, 64, 1000, issuance.Config{})
	got := burst(t, b, "SW-A", 64)
	want := map[string]int{string(issuance.ResultIssued): 1, string(issuance.ResultBudgetExceeded): 63}
	if !maps.Equal(got, want) {
		t.Errorf("answers %v, want %v", got, want)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'SW-A'`); n != 1 {
		t.Errorf("SW-A coupons: %d, want exactly 1", n)
	}
	if n := count(t, b.pool, `SELECT budget_yen - issued_yen FROM campaign_budgets WHERE campaign_id = 'SW-A'`); n != 0 {
		t.Errorf("SW-A remaining: %d yen, want 0", n)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notification_outbox`); n != 1 {
		t.Errorf("outbox rows: %d, want 1", n)
	}
	assertRulesHeld(t, b.pool)
}

// TestResends: one request and five re-sends, first one after another, then all at once; one
// coupon, counters moved once, and every answer names the same coupon.
func TestResends(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"sequential", "concurrent"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 6, 0, issuance.Config{})
			outs := make([]issuance.Outcome, 6)
			if mode == "sequential" {
				for i := range outs {
					outs[i] = issue(t, b.svc, "m0001", "SW-B")
				}
			} else {
				var wg sync.WaitGroup
				barrier := make(chan struct{})
				errs := make([]error, 6)
				for i := range outs {
					wg.Go(func() {
						<-barrier
						outs[i], errs[i] = issueResending(b.svc, "m0001", "SW-B")
					})
				}
				close(barrier)
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
			}
			issued := 0
			for _, o := range outs {
				switch o.Result {
				case issuance.ResultIssued:
					issued++
				case issuance.ResultAlreadyIssued:
				default:
					t.Errorf("unexpected result %s", o.Result)
				}
				if o.CouponID != outs[0].CouponID || o.CouponID == "" {
					t.Errorf("coupon ids differ: %q vs %q", o.CouponID, outs[0].CouponID)
				}
			}
			if issued != 1 {
				t.Errorf("ISSUED answers: %d, want 1", issued)
			}
			if n := count(t, b.pool, `SELECT count(*) FROM issued_coupons`); n != 1 {
				t.Errorf("coupons: %d, want 1", n)
			}
			if n := count(t, b.pool, `SELECT issued_yen FROM campaign_budgets WHERE campaign_id = 'SW-B'`); n != 1000 {
				t.Errorf("SW-B counter: %d yen, want 1000", n)
			}
			if n := count(t, b.pool, `SELECT used_yen FROM member_monthly_usage WHERE member_id = 'm0001'`); n != 1000 {
				t.Errorf("m0001 used: %d yen, want 1000", n)
			}
			assertRulesHeld(t, b.pool)
		})
	}
}

// backendPID returns the PostgreSQL backend process id of q's connection.
func backendPID(t *testing.T, q queryRower) int {
	t.Helper()
	return count(t, q, `SELECT pg_backend_pid()`)
}

// queryRower is a connection, pool or transaction to count through.
type queryRower interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// url is the connection URL of b's database, for a session of a test's own (a lock holder).
func (b bundle) url() string { return b.pool.Config().ConnConfig.ConnString() }

// TestInFlightDuplicate: the second request arrives while the first has inserted its coupon but
// not committed. The unique index makes it wait; it then answers by how the first ended.
func TestInFlightDuplicate(t *testing.T) {
	t.Parallel()
	for _, firstEnds := range []string{"commit", "rollback"} {
		t.Run(firstEnds, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 4, 0, issuance.Config{})
			ctx := context.Background()
			first, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Rollback(ctx)
			var firstID string
			if err := first.QueryRow(ctx, `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
				VALUES ('SW-C', 'm0001', '2026-09', 1000) RETURNING coupon_id::text`).Scan(&firstID); err != nil {
				t.Fatal(err)
			}
			done := make(chan issuance.Outcome, 1)
			go func() {
				out, err := b.svc.Issue(ctx, "m0001", "SW-C")
				if err != nil {
					t.Error(err)
				}
				done <- out
			}()
			pgtest.WaitBlockedBy(t, b.pool, backendPID(t, first), 1)
			if firstEnds == "commit" {
				err = first.Commit(ctx)
			} else {
				err = first.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			out := <-done
			switch {
			case firstEnds == "commit" && (out.Result != issuance.ResultAlreadyIssued || out.CouponID != firstID):
				t.Errorf("after the first committed: %+v, want ALREADY_ISSUED with %s", out, firstID)
			case firstEnds == "rollback" && out.Result != issuance.ResultIssued:
				t.Errorf("after the first rolled back: %+v, want ISSUED", out)
			}
			if n := count(t, b.pool, `SELECT count(*) FROM issued_coupons`); n != 1 {
				t.Errorf("coupons: %d, want 1", n)
			}
		})
	}
}

// TestStuckLockHolder: another session holds the campaign row for longer than the budget. The
// request gives up with RETRY_EXHAUSTED inside the budget and writes nothing, and the pool's only
// connection comes back clean: the next request succeeds, and the per-transaction timeouts did
// not leak into the session.
func TestStuckLockHolder(t *testing.T) {
	t.Parallel()
	// Lock timeouts this long let only about three attempts fit in the attempts' 1.2 s (the budget
	// less the cancel grace and the settlement, docs/api.md "The 3 s bound"), well under
	// MaxAttempts: the budget, not the attempt limit, must end the call.
	cfg := issuance.Config{Budget: 1800 * time.Millisecond, LockTimeout: 900 * time.Millisecond, StatementTimeout: 1100 * time.Millisecond}
	b := setup(t, 1, 0, cfg)
	ctx := context.Background()
	var defaults [2]string
	if err := b.pool.QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('statement_timeout')`).
		Scan(&defaults[0], &defaults[1]); err != nil {
		t.Fatal(err)
	}
	hold := pgtest.HoldCampaign(t, b.url(), "SW-A")

	// The holder keeps the row until after Issue returns, so Issue returning at all is the
	// service's own deadline at work (the budget), not a stopwatch of the test's.
	out := issue(t, b.svc, "m0001", "SW-A")
	if out.Result != issuance.ResultRetryExhausted {
		t.Fatalf("with the campaign row held: %+v, want RETRY_EXHAUSTED", out)
	}
	if out.Attempts < 2 || out.Attempts >= issuance.MaxAttempts {
		t.Errorf("attempts: %d, want the lock timeout (55P03) retried, and the budget to end the call before the %d-attempt limit",
			out.Attempts, issuance.MaxAttempts)
	}
	for _, table := range []string{"issued_coupons", "member_monthly_usage", "notification_outbox"} {
		if n := count(t, b.pool, `SELECT count(*) FROM `+table); n != 0 {
			t.Errorf("%s: %d rows, want none", table, n)
		}
	}
	hold.Release()

	if out := issue(t, b.svc, "m0001", "SW-A"); out.Result != issuance.ResultIssued {
		t.Errorf("after the holder let go: %+v, want ISSUED", out)
	}
	var after [2]string
	if err := b.pool.QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('statement_timeout')`).
		Scan(&after[0], &after[1]); err != nil {
		t.Fatal(err)
	}
	if after != defaults {
		t.Errorf("session settings after the request: %v, want the server defaults %v", after, defaults)
	}
}

func TestIsRetryable(t *testing.T) {
	t.Parallel()
	wrap := func(err error, depth int) error {
		for i := range depth {
			if i%2 == 0 {
				err = fmt.Errorf("layer %d: %w", i, err)
			} else {
				err = errors.Join(errors.New("other"), err)
			}
		}
		return err
	}
	for _, tc := range []struct {
		code string
		want bool
	}{
		{pgerrcode.SerializationFailure, true}, {pgerrcode.DeadlockDetected, true}, {pgerrcode.LockNotAvailable, true},
		{pgerrcode.UniqueViolation, false}, {pgerrcode.QueryCanceled, false}, {pgerrcode.InFailedSQLTransaction, false},
	} {
		for depth := 1; depth <= 3; depth++ {
			err := wrap(&pgconn.PgError{Code: tc.code}, depth)
			if got := issuance.IsRetryable(err); got != tc.want {
				t.Errorf("IsRetryable(%s wrapped %d deep) = %v, want %v", tc.code, depth, got, tc.want)
			}
		}
	}
	if issuance.IsRetryable(errors.New("plain")) || issuance.IsRetryable(nil) {
		t.Error("a non-PostgreSQL error is not retryable")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	bad := []issuance.Config{
		{LockTimeout: 2 * time.Second, StatementTimeout: 2 * time.Second},
		{Budget: 4 * time.Second},
		{StatementTimeout: 2600 * time.Millisecond},
		{BatchMax: -1},
	}
	for _, c := range bad {
		if err := c.WithDefaults().Validate(); err == nil {
			t.Errorf("%+v: accepted, want refused", c)
		}
	}
	if err := (issuance.Config{}).WithDefaults().Validate(); err != nil {
		t.Errorf("defaults refused: %v", err)
	}
}

func TestMonthIsTokyo(t *testing.T) {
	t.Parallel()
	// 2026-09-30 16:00 UTC is already 1 October in Tokyo.
	if got := issuance.Month(time.Date(2026, 9, 30, 16, 0, 0, 0, time.UTC)); got != "2026-10" {
		t.Errorf("Month = %s, want 2026-10", got)
	}
}

// TestCallerCancels: the caller gives up while the transaction waits for a lock. Issue returns
// the cancellation, nothing is written, and the pool's only connection carries no transaction
// into the next request.
func TestCallerCancels(t *testing.T) {
	t.Parallel()
	b := setup(t, 1, 0, issuance.Config{})
	ctx := context.Background()
	hold := pgtest.HoldCampaign(t, b.url(), "SW-B")
	callCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := b.svc.Issue(callCtx, "m0001", "SW-B")
		done <- err
	}()
	hold.WaitBlocked(1) // watched on a connection of the holder's: the pool's only one is busy waiting
	cancel()
	if err := waitDone(t, done, "Issue after cancel"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Issue after cancel: %v, want context.Canceled", err)
	}
	hold.Release()
	if out := issue(t, b.svc, "m0001", "SW-B"); out.Result != issuance.ResultIssued {
		t.Errorf("next request: %+v, want ISSUED", out)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM issued_coupons`); n != 1 {
		t.Errorf("coupons: %d, want 1 (the cancelled request wrote nothing)", n)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`); n != 0 {
		t.Errorf("%d sessions idle in a transaction after the cancel", n)
	}
}
