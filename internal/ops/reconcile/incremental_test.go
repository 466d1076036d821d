package reconcile

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/issuance"
)

// t0 is when the fixtures' history is issued; each step of a test moves the database's clock
// (issue_now()) on by an hour, past StampMargin, so that what came before a clean run is older
// than its watermark.
var t0 = time.Date(2026, 11, 10, 3, 0, 0, 0, time.UTC)

// fixture is a migrated database with campaigns A and B (500 yen coupons) and, issued at t0, one
// coupon of A to each of m1..m4 and one of B to m1 and m2, then a clean full run at t0+1h.
type fixture struct {
	pool  *pgxpool.Pool
	svc   *issuance.Service
	month string
	first Pass
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, id := range []string{"A", "B"} {
		if err := campaign.Create(ctx, pool, campaign.Campaign{ID: id, DiscountYen: 500, BudgetYen: 1_000_000}); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := issuance.New(pool, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{pool: pool, svc: svc}
	f.at(t, 0)
	for _, m := range []string{"m1", "m2", "m3", "m4"} {
		f.issue(t, m, "A")
	}
	f.issue(t, "m1", "B")
	f.issue(t, "m2", "B")
	f.at(t, 1)
	f.first = f.run(t, Options{})
	if !f.first.Full || f.first.RunID == 0 || len(f.first.Violations()) != 0 {
		t.Fatalf("the first run: full %v, run %d, %v; want a clean full run, recorded", f.first.Full, f.first.RunID, f.first.Violations())
	}
	return f
}

// at sets the database's clock to t0 plus hours.
func (f *fixture) at(t *testing.T, hours int) {
	t.Helper()
	pgtest.SetClock(t, f.pool, t0.Add(time.Duration(hours)*time.Hour))
}

func (f *fixture) issue(t *testing.T, member, campaignID string) string {
	t.Helper()
	out, err := f.svc.Issue(context.Background(), member, campaignID)
	if err != nil || out.Result != issuance.ResultIssued {
		t.Fatalf("issue %s to %s: %+v, %v", campaignID, member, out, err)
	}
	f.month = out.Month
	return out.CouponID
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (f *fixture) run(t *testing.T, opts Options) Pass {
	t.Helper()
	p, err := Run(context.Background(), f.pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestIncrementalFindsEachKind: after a clean run, a drift of each kind made since is found by
// the incremental run that follows, which examines only what changed (not the six coupons issued
// before), and records nothing; --full finds it too.
func TestIncrementalFindsEachKind(t *testing.T) {
	kinds := []struct {
		name  string
		drift func(t *testing.T, f *fixture)
		want  string
	}{
		{"budget counter", func(t *testing.T, f *fixture) {
			f.exec(t, `UPDATE campaign_budgets SET issued_yen = issued_yen + 300 WHERE campaign_id = 'B'`)
		}, "R1 B: counter 1300 yen but live coupons sum to 1000 yen (drift +300 yen)"},
		{"monthly usage row", func(t *testing.T, f *fixture) {
			f.issue(t, "n1", "A")
			f.exec(t, `UPDATE member_monthly_usage SET used_yen = used_yen + 100 WHERE member_id = 'n1'`)
		}, "R3: 1 member-months whose used_yen differs from their live coupons"},
		{"missing outbox row", func(t *testing.T, f *fixture) {
			id := f.issue(t, "n2", "A")
			f.exec(t, `DELETE FROM notification_outbox WHERE coupon_id = $1`, id)
		}, "outbox: 1 coupons without an outbox row"},
		{"extra outbox row", func(t *testing.T, f *fixture) {
			f.exec(t, `ALTER TABLE notification_outbox DROP CONSTRAINT notification_outbox_coupon_id_fkey`)
			f.exec(t, `INSERT INTO notification_outbox (coupon_id, member_id) VALUES (gen_random_uuid(), 'n3')`)
		}, "outbox: 1 outbox rows without a coupon"},
		{"void of an old coupon", func(t *testing.T, f *fixture) {
			f.exec(t, `UPDATE issued_coupons SET voided_at = issue_now(), void_reason = 'by hand' WHERE member_id = 'm3'`)
		}, "R1 A: counter 2000 yen but live coupons sum to 1500 yen (drift +500 yen)"},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.at(t, 2)
			k.drift(t, f)
			f.at(t, 3)
			p := f.run(t, Options{})
			if p.Full || p.Since == nil || !p.Since.Equal(f.first.Watermark) {
				t.Fatalf("the second run: full %v since %v; want incremental since %s", p.Full, p.Since, f.first.Watermark)
			}
			if p.ChangedCoupons > 1 {
				t.Errorf("the incremental run examined %d coupons; want at most the one changed since", p.ChangedCoupons)
			}
			if !slices.Contains(p.Violations(), k.want) || p.RunID != 0 {
				t.Errorf("incremental: %q, recorded run %d; want %q and nothing recorded", p.Violations(), p.RunID, k.want)
			}
			if full := f.run(t, Options{Full: true}); !slices.Contains(full.Violations(), k.want) {
				t.Errorf("--full: %q; want %q", full.Violations(), k.want)
			}
		})
	}
}

// TestIncrementalSeesLateCommit: a coupon whose transaction began, stamped its issue time and
// wrote before a clean run, and committed after it, with a drift in its member-month (usage
// 100 yen over its coupon), is found by that run or the next. The run waits for the transaction
// (its horizon), then sees it; StampMargin is set to 0, so the wait alone does it. Shown red on
// the broken variant, a watermark that trusts the clock: that run neither waits nor sees the
// coupon, and the next looks only at coupons stamped after its watermark, so no run finds it.
func TestIncrementalSeesLateCommit(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			saved, savedMargin := watermarkAt, stampMargin
			t.Cleanup(func() { watermarkAt, stampMargin = saved, savedMargin })
			stampMargin = 0
			if broken {
				watermarkAt = naiveWatermark
			}
			ctx := context.Background()
			f := newFixture(t)
			f.at(t, 2)
			late, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = late.Rollback(ctx) }()
			for _, sql := range []string{
				`INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen) VALUES ('A', 'late', $1, 500)`,
				`INSERT INTO notification_outbox (coupon_id, member_id) SELECT coupon_id, member_id FROM issued_coupons WHERE member_id = 'late'`,
				`INSERT INTO member_monthly_usage (member_id, month, used_yen) VALUES ('late', $1, 600)`,
				`UPDATE campaign_budgets SET issued_yen = issued_yen + 500 WHERE campaign_id = 'A'`,
			} {
				var args []any
				if strings.Contains(sql, "$1") {
					args = append(args, f.month)
				}
				if _, err := late.Exec(ctx, sql, args...); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			f.at(t, 3)
			type result struct {
				p   Pass
				err error
			}
			cfg := f.pool.Config()
			cfg.ConnConfig.RuntimeParams["application_name"] = "reconcile-beside-late"
			runPool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer runPool.Close()
			done := make(chan result, 1)
			go func() {
				p, err := Run(ctx, runPool, Options{})
				done <- result{p, err}
			}()
			// The barrier: the run has read its horizon and waits (the broken one does not
			// wait: it may have finished), then the late transaction commits.
			var second result
			ended := false
			pgtest.Eventually(t, pgtest.PollTimeout, func() error {
				select {
				case second = <-done:
					ended = true
					return nil
				default:
				}
				var waiting bool
				err := f.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
					WHERE application_name = 'reconcile-beside-late' AND query = $1)`, sqlHorizonPassed).Scan(&waiting)
				if err == nil && !waiting {
					err = fmt.Errorf("the run neither waits for the late transaction nor has ended")
				}
				return err
			})
			if err := late.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if !ended {
				second = <-done
			}
			if second.err != nil {
				t.Fatal(second.err)
			}
			f.at(t, 4)
			third := f.run(t, Options{})
			found := func(p Pass) bool {
				return slices.ContainsFunc(p.MonthsNamed, func(m MemberMonth) bool { return m.MemberID == "late" })
			}
			t.Logf("the run beside the late commit: %q; the next: %q", second.p.Violations(), third.Violations())
			if broken {
				if found(second.p) || found(third) {
					t.Error("the broken variant found the late member-month: the test would not see a watermark trusted naively")
				}
				return
			}
			if !found(second.p) {
				t.Errorf("the run beside the late commit named %v; want the member-month of 'late'", second.p.MonthsNamed)
			}
		})
	}
}

// naiveWatermark is the broken variant of waitHorizon: the clock as the run begins, trusted, with
// no wait for the transactions in progress.
func naiveWatermark(ctx context.Context, q db.Querier, _ time.Duration, _ func(string, ...any)) (time.Time, error) {
	var at time.Time
	err := q.QueryRow(ctx, `SELECT issue_now()`).Scan(&at)
	return at, err
}

// TestIncrementalStaysExact: runs in a row, with coupons issued and voided (through the void
// function, old and new coupons, with reissue) between them, stay clean, and each incremental
// run's campaigns, rebuilt from the baseline, equal a full count of the rows.
func TestIncrementalStaysExact(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	void := func(member, campaignID string, reissue bool) {
		t.Helper()
		var result string
		err := f.pool.QueryRow(ctx, `SELECT result FROM coupon_void(
			(SELECT coupon_id FROM issued_coupons WHERE member_id = $1 AND campaign_id = $2 AND voided_at IS NULL), 'test', $3)`,
			member, campaignID, reissue).Scan(&result)
		if err != nil || result != "VOIDED" {
			t.Fatalf("void %s %s: %s, %v", member, campaignID, result, err)
		}
	}
	steps := []func(){
		func() { f.issue(t, "n1", "A"); f.issue(t, "n2", "B"); void("m1", "A", false) },
		func() { void("n1", "A", true); f.issue(t, "n1", "A"); void("m2", "B", false) },
		func() {},
		func() { f.issue(t, "n3", "A"); void("n3", "A", false); void("m4", "A", false) },
	}
	for i, step := range steps {
		f.at(t, 2+2*i)
		step()
		f.at(t, 3+2*i)
		p := f.run(t, Options{})
		if p.Full || len(p.Violations()) != 0 || p.RunID == 0 {
			t.Fatalf("step %d: full %v, %q, run %d; want a clean incremental run, recorded", i, p.Full, p.Violations(), p.RunID)
		}
		full, err := Check(ctx, f.pool)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p.Campaigns, full.Campaigns) || p.Coupons != full.Coupons {
			t.Errorf("step %d: incremental %+v (%d coupons); a full count %+v (%d)", i, p.Campaigns, p.Coupons, full.Campaigns, full.Coupons)
		}
	}
}

// TestFullChecksEverything: a counter of an old member-month edited by hand, with no coupon
// issued or voided beside it, leaves no stamp: the incremental run does not see it (the limit
// docs/operations.md states); --full does.
func TestFullChecksEverything(t *testing.T) {
	f := newFixture(t)
	f.at(t, 2)
	f.exec(t, `UPDATE member_monthly_usage SET used_yen = used_yen + 100 WHERE member_id = 'm4'`)
	f.at(t, 3)
	if p := f.run(t, Options{}); len(p.Violations()) != 0 {
		t.Fatalf("incremental: %q; the edit left no stamp, so none was expected (if it sees it now, update docs/operations.md)", p.Violations())
	}
	f.at(t, 4)
	p := f.run(t, Options{Full: true})
	want := MemberMonth{MemberID: "m4", Month: f.month, UsedYen: 600, LiveYen: 500}
	if !p.Full || !slices.Equal(p.MonthsNamed, []MemberMonth{want}) || p.RunID != 0 {
		t.Errorf("--full: full %v, named %v, run %d; want %v and nothing recorded", p.Full, p.MonthsNamed, p.RunID, want)
	}
}

// TestRecordOnlyThroughTheFunction: coupon_admin reads reconcile_runs and may not write it but
// through reconcile_run_record.
func TestRecordOnlyThroughTheFunction(t *testing.T) {
	ctx := context.Background()
	owner, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = owner.Close(ctx) })
	admin, err := pgxpool.New(ctx, pgtest.LoginAs(t, owner.Config().ConnString(), "coupon_admin"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	p, err := Run(ctx, admin, Options{})
	if err != nil || p.RunID == 0 {
		t.Fatalf("reconcile as coupon_admin: run %d, %v; want a recorded clean run", p.RunID, err)
	}
	_, err = admin.Exec(ctx, `INSERT INTO reconcile_runs (full_pass, watermark, campaigns, coupons, months, started_at)
		VALUES (true, now(), '{}', 0, 0, now())`)
	if err == nil || !strings.Contains(err.Error(), "42501") {
		t.Errorf("a direct insert as coupon_admin: %v; want 42501", err)
	}
}
