package schema_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/ops/legacy"
	"github.com/mops/coupon-api/internal/ops/outboxadmin"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox"
)

// The roles tests (00008_roles.sql, docs/roles.md) log in as a user of each group role, as the
// deploy scripts make the runtime users, run the role's real work through the real code, and
// prove that every write the role must not make fails with 42501 (insufficient privilege).

// rolesDay is a fixed clock for the issuances, 10:00 JST on 20 September 2026.
var rolesDay = time.Date(2026, 9, 20, 10, 0, 0, 0, issuance.Tokyo)

// roleDB is one test's migrated database: a pool as its owner (the migration's user, for the
// set-up and the counts) and a pool as a login user in role, named user.
type roleDB struct {
	owner, as *pgxpool.Pool
	user      string
}

func newRoleDB(t *testing.T, role string) roleDB {
	t.Helper()
	dbURL := pgtest.URL(t)
	as := openPool(t, pgtest.LoginAs(t, dbURL, role))
	return roleDB{owner: openPool(t, dbURL), as: as, user: as.Config().ConnConfig.User}
}

func ptr[T any](v T) *T { return &v }

// forbidden is a write the role must not make, and why.
type forbidden struct {
	why, sql string
}

// refusals runs each statement on pool and returns one line per statement that was not
// refused with 42501: run, or failed otherwise.
func refusals(ctx context.Context, pool *pgxpool.Pool, writes []forbidden) []string {
	var wrong []string
	for _, w := range writes {
		_, err := pool.Exec(ctx, w.sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.InsufficientPrivilege {
			wrong = append(wrong, fmt.Sprintf("%s (%s): %v, want 42501", w.why, w.sql, err))
		}
	}
	return wrong
}

func checkRefused(t *testing.T, pool *pgxpool.Pool, writes []forbidden) {
	t.Helper()
	for _, w := range refusals(context.Background(), pool, writes) {
		t.Error(w)
	}
}

// collectGauges reads the gauges registered by register through pool once; a query the role
// may not make fails the collection.
func collectGauges(ctx context.Context, pool *pgxpool.Pool,
	register func(*sdkmetric.MeterProvider, *pgxpool.Pool) error) error {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	if err := register(mp, pool); err != nil {
		return err
	}
	var rm metricdata.ResourceMetrics
	return reader.Collect(ctx, &rm)
}

// issueWork is IssueCoupon's real work as pool's user: the start-up check, then issuances
// answered ISSUED, ALREADY_ISSUED, MONTHLY_CAP, BUDGET_EXCEEDED (on one row and on budget
// stripes) and UNKNOWN_CAMPAIGN, then the budget gauge. Campaigns ONE (2,000 yen, one stripe),
// STRIPED (2,000 yen over 2 stripes) and THIRD must exist.
func issueWork(ctx context.Context, pool *pgxpool.Pool) error {
	if err := schema.Check(ctx, pool); err != nil {
		return err
	}
	svc, err := issuance.New(pool, issuance.Config{})
	if err != nil {
		return err
	}
	for _, step := range []struct {
		member, campaign string
		want             issuance.Result
	}{
		{"m1", "ONE", issuance.ResultIssued},
		{"m1", "ONE", issuance.ResultAlreadyIssued},
		{"m2", "ONE", issuance.ResultIssued},
		{"m3", "ONE", issuance.ResultBudgetExceeded},
		{"m1", "STRIPED", issuance.ResultIssued},
		{"m1", "THIRD", issuance.ResultMonthlyCap},
		{"m2", "STRIPED", issuance.ResultIssued},
		{"m3", "STRIPED", issuance.ResultBudgetExceeded},
		{"m3", "NONE", issuance.ResultUnknownCampaign},
	} {
		out, err := svc.Issue(ctx, step.member, step.campaign)
		if err != nil || out.Result != step.want {
			return fmt.Errorf("issue %s %s: %+v, %v; want %s", step.member, step.campaign, out, err, step.want)
		}
	}
	return collectGauges(ctx, pool, func(mp *sdkmetric.MeterProvider, p *pgxpool.Pool) error {
		_, err := issuance.RegisterBudgetGauge(mp, p)
		return err
	})
}

func createIssueCampaigns(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, c := range []campaign.Campaign{
		{ID: "ONE", DiscountYen: 1000, BudgetYen: 2000},
		{ID: "STRIPED", DiscountYen: 1000, BudgetYen: 2000, Stripes: 2},
		{ID: "THIRD", DiscountYen: 1000, BudgetYen: 100_000},
	} {
		if err := campaign.Create(context.Background(), pool, c); err != nil {
			t.Fatal(err)
		}
	}
}

// issueForbidden: never a budget, a campaign or a coupon after the fact, never the relay's
// columns or a LINE account, never a delete.
var issueForbidden = []forbidden{
	{"a budget", `UPDATE campaign_budgets SET budget_yen = budget_yen + 1000`},
	{"a discount", `UPDATE campaign_budgets SET discount_yen = 1`},
	{"a period", `UPDATE campaign_budgets SET ends_at = NULL`},
	{"a pause", `UPDATE campaign_budgets SET paused_at = now()`},
	{"a budget change", `SELECT * FROM campaign_change_budget('ONE', 5000, NULL, NULL, 'raise')`},
	{"a pause through the function", `SELECT * FROM campaign_change_state('ONE', 'pause', NULL, NULL, false, false, 'stop')`},
	{"a void", `SELECT * FROM coupon_void(gen_random_uuid(), 'x', false)`},
	{"a grant", `SELECT * FROM grant_coupon(gen_random_uuid(), 'ONE', 'm9', now(), 2000, NULL)`},
	{"a grant of a batch", `SELECT * FROM grant_coupons_batch('ONE', ARRAY[gen_random_uuid()], ARRAY['m9'], ARRAY[now()], 2000, ARRAY[NULL])`},
	{"a validity change", `SELECT * FROM campaign_change_validity('ONE', 7, NULL, 'x')`},
	{"the monthly cap", `SELECT * FROM coupon_rules_set(1000000, NULL, 'x')`},
	{"the monthly cap's row", `UPDATE coupon_rules SET monthly_cap_yen = 1000000`},
	{"a coupon's prune mark", `UPDATE issued_coupons SET outbox_pruned_at = now()`},
	{"a history row", `INSERT INTO campaign_changes (campaign_id, changed_at, changed_by, what, before, after, reason) VALUES ('ONE', now(), 'x', 'pause', '{}', '{}', 'x')`},
	{"the history read", `SELECT reason FROM campaign_changes`},
	{"a new campaign", `INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('X', 1, 1)`},
	{"a new budget row", `INSERT INTO campaign_budgets (campaign_id, stripe, discount_yen, budget_yen) VALUES ('ONE', 9, 1, 1)`},
	{"a campaign", `UPDATE campaigns SET budget_yen = 1`},
	{"a coupon's value", `UPDATE issued_coupons SET amount_yen = 1`},
	{"a coupon voided", `UPDATE issued_coupons SET voided_at = now()`},
	{"a coupon redeemed", `UPDATE issued_coupons SET redeemed_at = now()`},
	{"a coupon's member", `UPDATE issued_coupons SET member_id = 'x'`},
	{"a usage row's key", `UPDATE member_monthly_usage SET month = '2026-01'`},
	{"the relay's sent_at", `UPDATE notification_outbox SET sent_at = now()`},
	{"the relay's parked_at", `UPDATE notification_outbox SET parked_at = now()`},
	{"the relay's next_attempt_at", `INSERT INTO notification_outbox (coupon_id, member_id, next_attempt_at) VALUES (gen_random_uuid(), 'm1', now())`},
	{"a LINE account", `INSERT INTO member_line_accounts (member_id, line_user_id) VALUES ('m1', 'U0123456789abcdef0123456789abcdef')`},
	{"delete a coupon", `DELETE FROM issued_coupons`},
	{"delete a budget", `DELETE FROM campaign_budgets`},
	{"delete usage", `DELETE FROM member_monthly_usage`},
	{"delete an outbox row", `DELETE FROM notification_outbox`},
	{"truncate", `TRUNCATE issued_coupons`},
	{"a coupon's redemption read", `SELECT redeemed_at FROM issued_coupons`},
	{"the schema", `ALTER TABLE campaign_budgets ADD COLUMN x integer`},
}

// TestIssueRole: a user in coupon_issue passes the start-up check, issues (ISSUED,
// ALREADY_ISSUED, MONTHLY_CAP, BUDGET_EXCEEDED on one row and on stripes, UNKNOWN_CAMPAIGN)
// through the issuance functions alone and reads the budget gauge; every forbidden write, and
// every write of an issuance made by a statement of its own, is refused with 42501.
func TestIssueRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newRoleDB(t, "coupon_issue")
	createIssueCampaigns(t, db.owner)
	pgtest.SetClock(t, db.owner, rolesDay) // issueWork issues on rolesDay
	if err := issueWork(ctx, db.as); err != nil {
		t.Fatal(err)
	}
	rep, err := reconcile.Check(ctx, db.owner)
	if err != nil {
		t.Fatal(err)
	}
	if v := rep.Violations(); len(v) != 0 || rep.Coupons != 4 {
		t.Errorf("after the issuances: %d coupons, violations %v; want 4, none", rep.Coupons, v)
	}
	checkRefused(t, db.as, append(issueOutsideTheFunction, issueForbidden...))
}

// issueOutsideTheFunction: the writes of an issuance, made as statements of their own, which
// 00016_issue_role_contract.sql revoked (00009 kept them for the revision before it).
var issueOutsideTheFunction = []forbidden{
	{"a coupon outside issue_coupon", `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen, issued_at) VALUES ('THIRD', 'x', '2026-09', 1000, now())`},
	{"a usage row outside issue_coupon", `INSERT INTO member_monthly_usage (member_id, month) VALUES ('x', '2026-09')`},
	{"a usage add outside issue_coupon", `UPDATE member_monthly_usage SET used_yen = used_yen + 1000`},
	{"a budget add outside issue_coupon", `UPDATE campaign_budgets SET issued_yen = issued_yen + 1000 WHERE campaign_id = 'THIRD'`},
	{"an outbox row outside issue_coupon", `INSERT INTO notification_outbox (coupon_id, member_id) VALUES (gen_random_uuid(), 'm1')`},
	{"a budget counter reset", `UPDATE campaign_budgets SET issued_yen = 0`},
	{"a 1,000,000-yen coupon with no usage, budget or outbox row", `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen, issued_at) VALUES ('ONE', 'rich', '2026-09', 1000000, now())`},
	{"a member's month reset", `UPDATE member_monthly_usage SET used_yen = 0`},
	{"a usage row deleted", `DELETE FROM member_monthly_usage`},
}

// TestRolesTestSeesWrongGrants is the roles tests' own check, red by construction: on a
// database where coupon_issue was granted too much (a budget's UPDATE), the forbidden-write
// check reports the budget write, and where coupon_console was granted the CLI's pause
// (campaign_change_state, a change that names no person), the console's check reports that
// call; where it was granted too little (no EXECUTE of issue_coupons_batch_v3, which IssueCoupon
// calls), its real work fails.
func TestRolesTestSeesWrongGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	tooMuch := newRoleDB(t, "coupon_issue")
	createIssueCampaigns(t, tooMuch.owner)
	if _, err := tooMuch.owner.Exec(ctx, `GRANT UPDATE (budget_yen) ON campaign_budgets TO coupon_issue`); err != nil {
		t.Fatal(err)
	}
	if wrong := refusals(ctx, tooMuch.as, issueForbidden); len(wrong) != 1 {
		t.Errorf("granted UPDATE (budget_yen): the check reports %q, want the budget write alone", wrong)
	}

	consoleTooMuch := newRoleDB(t, "coupon_console")
	if _, err := consoleTooMuch.owner.Exec(ctx, `GRANT EXECUTE ON FUNCTION campaign_change_state TO coupon_console`); err != nil {
		t.Fatal(err)
	}
	if wrong := refusals(ctx, consoleTooMuch.as, consoleForbidden); len(wrong) != 1 || !strings.Contains(wrong[0], "a pause through the CLI's function") {
		t.Errorf("granted the console EXECUTE of campaign_change_state (a change without the person): the check reports %q, want that call alone", wrong)
	}

	tooLittle := newRoleDB(t, "coupon_issue")
	createIssueCampaigns(t, tooLittle.owner)
	if _, err := tooLittle.owner.Exec(ctx, `REVOKE EXECUTE ON FUNCTION issue_coupons_batch_v3 FROM coupon_issue`); err != nil {
		t.Fatal(err)
	}
	if err := issueWork(ctx, tooLittle.as); err == nil {
		t.Error("without EXECUTE of issue_coupons_batch_v3: the issuances passed, want them to fail")
	}
}

// TestRelayRole: a user in coupon_relay passes the start-up check, runs a real relay run against
// the LINE stand-in that sends the linked members' rows and skips the unlinked one, parks a row
// LINE refuses, and reads the outbox gauges; every forbidden write is refused with 42501, the
// prune included.
func TestRelayRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newRoleDB(t, "coupon_relay")
	if err := campaign.Create(ctx, db.owner, campaign.Campaign{ID: "RELAY", DiscountYen: 1000, BudgetYen: 100_000}); err != nil {
		t.Fatal(err)
	}
	svc, err := issuance.New(db.owner, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	coupons := map[string]string{}
	for _, m := range []string{"m1", "m2", "m3", "m4"} {
		out, err := svc.Issue(ctx, m, "RELAY")
		if err != nil || out.Result != issuance.ResultIssued {
			t.Fatalf("issue %s: %+v, %v", m, out, err)
		}
		coupons[m] = out.CouponID
	}
	for _, m := range []string{"m1", "m2", "m4"} {
		if err := outboxadmin.Link(ctx, db.owner, m, fmt.Sprintf("U%032x", len(m)+int(m[1]))); err != nil {
			t.Fatal(err)
		}
	}
	stub := linestub.New()
	stub.Always(coupons["m4"], linestub.Response{Status: 400, Message: "refused"})
	srv := httptest.NewServer(stub)
	t.Cleanup(srv.Close)

	if err := schema.Check(ctx, db.as); err != nil {
		t.Fatal(err)
	}
	r, err := outbox.New(db.as, outbox.Config{ChannelAccessToken: "test-token", BaseURL: srv.URL,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(ctx, 0)
	if err != nil || res != (outbox.Result{Sent: 2, Skipped: 1, Parked: 1, SkippedReasons: outbox.SkippedReasons{NoLINEAccount: 1}}) {
		t.Errorf("relay run: %+v, %v; want 2 sent, 1 skipped (m3), 1 parked (m4)", res, err)
	}
	// The marks' failures are only logged: judge the rows themselves.
	var states string
	if err := db.owner.QueryRow(ctx, `SELECT string_agg(member_id || ':' || CASE
	    WHEN sent_at IS NOT NULL THEN 'sent' WHEN skipped_at IS NOT NULL THEN 'skipped'
	    WHEN parked_at IS NOT NULL THEN 'parked' ELSE 'open' END, ' ' ORDER BY member_id)
	  FROM notification_outbox WHERE claimed_by IS NULL`).Scan(&states); err != nil {
		t.Fatal(err)
	}
	if want := "m1:sent m2:sent m3:skipped m4:parked"; states != want {
		t.Errorf("outbox rows after the run: %q, want %q", states, want)
	}
	if err := collectGauges(ctx, db.as, func(mp *sdkmetric.MeterProvider, p *pgxpool.Pool) error {
		_, err := outbox.RegisterGauges(mp, p)
		return err
	}); err != nil {
		t.Errorf("outbox gauges: %v", err)
	}

	if _, err := outbox.Prune(ctx, db.as, time.Nanosecond, outbox.PruneBatch); !isRefused(err) {
		t.Errorf("prune as coupon_relay: %v, want 42501 (the relay deletes nothing)", err)
	}
	checkRefused(t, db.as, []forbidden{
		{"a coupon", `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen) VALUES ('RELAY', 'm9', '2026-11', 1000)`},
		{"a coupon's value", `UPDATE issued_coupons SET amount_yen = 1`},
		{"a coupon's redemption read", `SELECT redeemed_at FROM issued_coupons`},
		{"a void", `SELECT * FROM coupon_void(gen_random_uuid(), 'x', false)`},
		{"a grant", `SELECT * FROM grant_coupon(gen_random_uuid(), 'RELAY', 'm9', now(), 2000, NULL)`},
		{"an issuance", `SELECT * FROM issue_coupon(gen_random_uuid(), 'RELAY', 'm9', now(), 2000, NULL)`},
		{"an issuance of a batch", `SELECT * FROM issue_coupons_batch('RELAY', ARRAY[gen_random_uuid()], ARRAY['m9'], ARRAY[now()], 2000, ARRAY[NULL])`},
		{"a grant of a batch", `SELECT * FROM grant_coupons_batch('RELAY', ARRAY[gen_random_uuid()], ARRAY['m9'], ARRAY[now()], 2000, ARRAY[NULL])`},
		{"a budget counter", `UPDATE campaign_budgets SET issued_yen = 0`},
		{"a budget read", `SELECT budget_yen FROM campaign_budgets`},
		{"a usage read", `SELECT used_yen FROM member_monthly_usage`},
		{"an outbox row", `INSERT INTO notification_outbox (coupon_id, member_id) SELECT coupon_id, 'x' FROM notification_outbox`},
		{"an outbox row's coupon", `UPDATE notification_outbox SET coupon_id = gen_random_uuid()`},
		{"an outbox row's member", `UPDATE notification_outbox SET member_id = 'x'`},
		{"an outbox row's trace", `UPDATE notification_outbox SET trace_parent = NULL`},
		{"an outbox row's creation", `UPDATE notification_outbox SET created_at = now()`},
		{"delete an outbox row", `DELETE FROM notification_outbox`},
		{"a LINE account", `INSERT INTO member_line_accounts (member_id, line_user_id) VALUES ('m9', 'U0123456789abcdef0123456789abcdef')`},
		{"a LINE account changed", `UPDATE member_line_accounts SET line_user_id = 'U0123456789abcdef0123456789abcdef'`},
		{"the schema", `DROP TABLE notification_outbox`},
	})
}

func isRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InsufficientPrivilege
}

// TestAdminRole: a user in coupon_admin runs the operator verbs: campaign create and show,
// reconcile and reconcile --repair (a drifted campaign counter and a drifted and a missing
// usage row), line link, relink and unlink, outbox status, requeue and prune, legacy report
// and rollback; it cannot change the schema, a coupon or a budget.
func TestAdminRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newRoleDB(t, "coupon_admin")
	if err := schema.Check(ctx, db.as); err != nil {
		t.Fatal(err)
	}
	if err := campaign.Create(ctx, db.as, campaign.Campaign{ID: "ADMIN", DiscountYen: 1000, BudgetYen: 10_000, Stripes: 4}); err != nil {
		t.Fatalf("campaign create: %v", err)
	}
	if s, err := campaign.Show(ctx, db.as, "ADMIN"); err != nil || s.BudgetYen != 10_000 || s.Stripes != 4 {
		t.Fatalf("campaign show: %+v, %v", s, err)
	}
	svc, err := issuance.New(db.owner, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	coupons := map[string]string{}
	for _, m := range []string{"m1", "m2", "m3"} {
		out, err := svc.Issue(ctx, m, "ADMIN")
		if err != nil || out.Result != issuance.ResultIssued {
			t.Fatalf("issue %s: %+v, %v", m, out, err)
		}
		coupons[m] = out.CouponID
	}

	// Drift, made by the owner: reconcile finds it, --repair rebuilds it.
	for _, sql := range []string{
		`UPDATE campaign_budgets SET issued_yen = 0`,
		`UPDATE member_monthly_usage SET used_yen = 0 WHERE member_id = 'm1'`,
		`DELETE FROM member_monthly_usage WHERE member_id = 'm2'`,
	} {
		if _, err := db.owner.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if rep, err := reconcile.Check(ctx, db.as); err != nil || len(rep.Violations()) == 0 {
		t.Fatalf("reconcile: %v, %v; want the drifts", rep.Violations(), err)
	}
	if rep, err := reconcile.Repair(ctx, db.as); err != nil || len(rep.Campaigns) != 1 || len(rep.Usage) != 2 {
		t.Fatalf("reconcile --repair: %+v, %v; want 1 campaign and 2 usage rows rebuilt", rep, err)
	}
	if rep, err := reconcile.Check(ctx, db.as); err != nil || len(rep.Violations()) != 0 {
		t.Fatalf("reconcile after repair: %v, %v; want none", rep.Violations(), err)
	}

	// Live changes, through the change functions alone, each in the history.
	if ch, err := campaign.Update(ctx, db.as, "ADMIN", campaign.Changes{AddBudgetYen: ptr[int64](5000), Stripes: ptr(2), Reason: "raise"}); err != nil || len(ch) != 2 {
		t.Fatalf("campaign update: %+v, %v; want a budget and a stripes change", ch, err)
	}
	for _, change := range []func(context.Context, campaign.Querier, string, string) (*campaign.Change, error){campaign.Pause, campaign.Resume, campaign.End} {
		if ch, err := change(ctx, db.as, "ADMIN", "operator"); err != nil || ch == nil {
			t.Fatalf("campaign pause/resume/end: %+v, %v", ch, err)
		}
	}
	h, err := campaign.History(ctx, db.as, "ADMIN")
	if err != nil {
		t.Fatal(err)
	}
	var whats []string
	for _, c := range h {
		whats = append(whats, c.What)
		if c.By != db.user {
			t.Errorf("change %d (%s) by %s, want %s", c.ID, c.What, c.By, db.user)
		}
	}
	if got, want := strings.Join(whats, " "), "create repair budget stripes pause resume end"; got != want {
		t.Fatalf("campaign history: %s, want %s", got, want)
	}

	// A grant and a void, through their functions alone; the admin may not issue as IssueCoupon does.
	grants, err := issuance.New(db.as, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := grants.Grant(ctx, "m4", "ADMIN")
	if err != nil || g.Result != issuance.ResultCampaignNotActive {
		t.Fatalf("grant to an ended campaign: %+v %v, want CAMPAIGN_NOT_ACTIVE", g, err)
	}
	if v, err := coupon.Void(ctx, db.as, coupons["m3"], "roles test", true); err != nil || v.AmountYen != 1000 {
		t.Fatalf("coupon void: %+v %v", v, err)
	}

	// line link, relink, unlink.
	for _, u := range []string{"U" + fmt.Sprintf("%032x", 1), "U" + fmt.Sprintf("%032x", 2)} {
		if err := outboxadmin.Link(ctx, db.as, "m1", u); err != nil {
			t.Fatalf("line link %s: %v", u, err)
		}
	}
	if err := outboxadmin.Link(ctx, db.as, "m3", "U"+fmt.Sprintf("%032x", 3)); err != nil {
		t.Fatalf("line link: %v", err)
	}
	if had, err := outboxadmin.Unlink(ctx, db.as, "m3"); err != nil || !had {
		t.Fatalf("line unlink: %v, %v", had, err)
	}

	// outbox: m1's row parked, m2's sent long ago; status, requeue, prune.
	for _, sql := range []string{
		`UPDATE notification_outbox SET parked_at = now(), attempts = 10, last_error = 'refused' WHERE member_id = 'm1'`,
		`UPDATE notification_outbox SET sent_at = now() - interval '40 days' WHERE member_id = 'm2'`,
	} {
		if _, err := db.owner.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := outboxadmin.ReadStatus(ctx, db.as, 10); err != nil || st.Parked != 1 || st.Sent != 1 {
		t.Fatalf("outbox status: %+v, %v; want 1 parked, 1 sent", st, err)
	}
	if rq, err := outboxadmin.Requeue(ctx, db.as, outboxadmin.RequeueRequest{All: true}); err != nil || len(rq.Requeued) != 1 || rq.Requeued[0] != coupons["m1"] {
		t.Fatalf("outbox requeue --all: %+v, %v; want m1's row", rq, err)
	}
	if n, err := outbox.Prune(ctx, db.as, outbox.DefaultRetention, outbox.PruneBatch); err != nil || n != 1 {
		t.Fatalf("outbox prune: %d, %v; want m2's row", n, err)
	}

	// legacy report (refused politely on a migrated database) and rollback.
	if _, err := legacy.Read(ctx, db.as, issuance.DefaultMonthlyCapYen); !errors.Is(err, legacy.ErrMigrated) {
		t.Fatalf("legacy report: %v, want %v", err, legacy.ErrMigrated)
	}
	if n, err := legacy.Rollback(ctx, db.as); err != nil || n != 1 {
		t.Fatalf("legacy rollback: %d, %v; want 1 campaign", n, err)
	}
	var legacyIssued int
	if err := db.owner.QueryRow(ctx, `SELECT issued_yen FROM campaigns WHERE campaign_id = 'ADMIN'`).Scan(&legacyIssued); err != nil || legacyIssued != 2000 {
		t.Fatalf("campaigns.issued_yen after rollback: %d, %v; want 2000 (3 coupons, 1 voided)", legacyIssued, err)
	}

	checkRefused(t, db.as, []forbidden{
		{"drop a table", `DROP TABLE issued_coupons`},
		{"alter a table", `ALTER TABLE campaign_budgets ADD COLUMN x integer`},
		{"create a table", `CREATE TABLE x (id integer)`},
		{"truncate", `TRUNCATE notification_outbox`},
		{"a budget", `UPDATE campaign_budgets SET budget_yen = budget_yen + 1000`},
		{"a discount", `UPDATE campaign_budgets SET discount_yen = 1`},
		{"a pause outside the functions", `UPDATE campaign_budgets SET paused_at = now()`},
		{"a period outside the functions", `UPDATE campaign_budgets SET ends_at = now()`},
		{"a history row outside the functions", `INSERT INTO campaign_changes (campaign_id, changed_at, changed_by, what, before, after, reason) VALUES ('ADMIN', now(), 'x', 'pause', '{}', '{}', 'x')`},
		{"the monthly cap outside coupon_rules_set", `UPDATE coupon_rules SET monthly_cap_yen = 1000000`},
		{"a rules history row outside coupon_rules_set", `INSERT INTO coupon_rules_changes (before, after, reason) VALUES ('{}', '{}', 'x')`},
		{"a history row changed", `UPDATE campaign_changes SET reason = 'x'`},
		{"a history row deleted", `DELETE FROM campaign_changes`},
		{"the lock helper", `SELECT * FROM campaign_lock('ADMIN')`},
		{"a pause as the console (console_* are its login's alone)", `SELECT * FROM console_pause('ADMIN', true, 'x@example.com', 'x')`},
		{"a decision as the console", `SELECT * FROM console_decide(1, true, 'x@example.com', 'x')`},
		{"a void as the console", `SELECT * FROM console_void(gen_random_uuid(), false, 'x@example.com', 'x')`},
		{"a request row outside the console's functions", `INSERT INTO campaign_change_request_rows (campaign_id, kind, args, requested_by, request_reason, requested_at) VALUES ('ADMIN', 'budget', '{}', 'x@example.com', 'x', now())`},
		{"a console role outside console_role_set", `INSERT INTO console_roles (email, role, changed_at, changed_by) VALUES ('x@example.com', 'approver', now(), 'x')`},
		{"a console role history row deleted", `DELETE FROM console_role_changes`},
		{"an issuance as IssueCoupon", `SELECT * FROM issue_coupon(gen_random_uuid(), 'ADMIN', 'm9', now(), 2000, NULL)`},
		{"an issuance of a batch as IssueCoupon", `SELECT * FROM issue_coupons_batch('ADMIN', ARRAY[gen_random_uuid()], ARRAY['m9'], ARRAY[now()], 2000, ARRAY[NULL])`},
		{"a coupon voided outside coupon_void", `UPDATE issued_coupons SET voided_by = 'x'`},
		{"a campaign's definition", `UPDATE campaigns SET budget_yen = 1`},
		{"a coupon", `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen) VALUES ('ADMIN', 'm9', '2026-11', 1000)`},
		{"a coupon's value", `UPDATE issued_coupons SET amount_yen = 1`},
		{"a coupon voided", `UPDATE issued_coupons SET voided_at = now()`},
		{"delete a coupon", `DELETE FROM issued_coupons`},
		{"delete a budget", `DELETE FROM campaign_budgets`},
		{"delete a campaign", `DELETE FROM campaigns`},
		{"delete usage", `DELETE FROM member_monthly_usage`},
		{"a stripe row added to a live campaign (a budget raised with no history)", `INSERT INTO campaign_budgets (campaign_id, stripe, discount_yen, budget_yen) VALUES ('ADMIN', 63, 1000, 1000000)`},
		{"a campaign outside campaign_create", `INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('RAW', 1000, 3000)`},
		{"a budget stripe outside campaign_create", `INSERT INTO campaign_budgets (campaign_id, stripe, discount_yen, budget_yen) VALUES ('RAW', 0, 1000, 3000)`},
		{"a budget counter reset", `UPDATE campaign_budgets SET issued_yen = 0`},
		{"a member's month reset", `UPDATE member_monthly_usage SET used_yen = 0`},
		{"a usage row outside the functions", `INSERT INTO member_monthly_usage (member_id, month) VALUES ('m9', '2026-11')`},
		{"a stripe row by 00011's validity columns", `INSERT INTO campaign_budgets (coupon_valid_days, coupons_expire_at) VALUES (1, NULL)`},
		{"an outbox row", `INSERT INTO notification_outbox (coupon_id, member_id) SELECT coupon_id, 'x' FROM notification_outbox`},
		{"an outbox row marked sent", `UPDATE notification_outbox SET sent_at = now()`},
		{"an outbox row's member", `UPDATE notification_outbox SET member_id = 'x'`},
		{"the legacy overshoot", `DELETE FROM legacy_overshoot`},
		{"the schema version", `DELETE FROM goose_db_version`},
	})
}

// consoleForbidden: the console changes nothing but through the console_* functions, and reads
// only what its pages show.
var consoleForbidden = []forbidden{
	{"a budget", `UPDATE campaign_budgets SET budget_yen = budget_yen + 1000`},
	{"a pause outside the functions", `UPDATE campaign_budgets SET paused_at = now()`},
	{"a budget counter", `UPDATE campaign_budgets SET issued_yen = 0`},
	{"a budget stripe", `INSERT INTO campaign_budgets (campaign_id, stripe, discount_yen, budget_yen) VALUES ('CON', 9, 1000, 1000)`},
	{"delete a budget", `DELETE FROM campaign_budgets`},
	{"a campaign", `UPDATE campaigns SET budget_yen = 1`},
	{"a history row", `INSERT INTO campaign_changes (campaign_id, changed_at, changed_by, what, before, after, reason) VALUES ('CON', now(), 'x', 'pause', '{}', '{}', 'x')`},
	{"a history row's person", `UPDATE campaign_changes SET operator_email = 'x@example.com'`},
	{"a history row deleted", `DELETE FROM campaign_changes`},
	{"a request", `INSERT INTO campaign_change_requests (campaign_id, kind, args, requested_by, request_reason, requested_at) VALUES ('CON', 'budget', '{}', 'x@example.com', 'x', now())`},
	{"a request approved by hand", `UPDATE campaign_change_requests SET decided_by = 'x@example.com'`},
	{"a request's row", `UPDATE campaign_change_request_rows SET decision = 'approved'`},
	{"a request deleted", `DELETE FROM campaign_change_requests`},
	{"a coupon voided by hand", `UPDATE issued_coupons SET voided_at = now(), voided_by_email = 'x@example.com'`},
	{"a coupon", `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen) VALUES ('CON', 'm9', '2026-11', 1000)`},
	{"delete a coupon", `DELETE FROM issued_coupons`},
	{"an outbox row marked sent", `UPDATE notification_outbox SET sent_at = now()`},
	{"delete an outbox row", `DELETE FROM notification_outbox`},
	{"the rules", `UPDATE coupon_rules SET approval_above_yen = 0`},
	{"the rules through their function", `SELECT * FROM coupon_rules_set(NULL, 0, 'x')`},
	{"a role", `INSERT INTO console_roles (email, role, changed_at, changed_by) VALUES ('x@example.com', 'approver', now(), 'x')`},
	{"a role through its function", `SELECT * FROM console_role_set('x@example.com', 'approver', 'x')`},
	{"the roles read", `SELECT role FROM console_roles`},
	{"a usage read", `SELECT used_yen FROM member_monthly_usage`},
	{"a usage row", `UPDATE member_monthly_usage SET used_yen = 0`},
	{"a LINE account read", `SELECT line_user_id FROM member_line_accounts`},
	{"a pause through the CLI's function", `SELECT * FROM campaign_change_state('CON', 'pause', NULL, NULL, false, false, 'x')`},
	{"a budget through the CLI's function", `SELECT * FROM campaign_change_budget('CON', 1000000, NULL, NULL, 'x')`},
	{"a void through the CLI's function", `SELECT * FROM coupon_void(gen_random_uuid(), 'x', false)`},
	{"the role check alone", `SELECT operator_require('x@example.com', 'viewer', 'x')`},
	{"the history marker alone", `SELECT * FROM operator_changes_mark(ARRAY[1::bigint], 'x@example.com', NULL)`},
	{"an issuance", `SELECT * FROM issue_coupons_batch('CON', ARRAY[gen_random_uuid()], ARRAY['m9'], ARRAY[now()], 2000, ARRAY[NULL])`},
	{"a grant", `SELECT * FROM grant_coupons_batch('CON', ARRAY[gen_random_uuid()], ARRAY['m9'], ARRAY[now()], 2000, ARRAY[NULL])`},
	{"a campaign created", `SELECT * FROM campaign_create('NEW', 1000, 1000, 1, NULL, NULL, NULL, NULL, 'x')`},
	{"a repair", `SELECT * FROM counters_repair('x')`},
	{"truncate", `TRUNCATE campaign_changes`},
	{"the schema", `ALTER TABLE campaign_budgets ADD COLUMN x integer`},
}

// TestConsoleRole: a user in coupon_console (the console's login) passes the start-up check,
// reads what the console's pages read (the stripes, the history, the requests, the coupons and
// their outbox rows, the rules, the audit's histories of roles, rules and reissues: 00036), and changes, asks, decides and voids through the console_*
// functions for the people console_role_set made operator and approvers; every other write,
// and every read of what the pages do not show, is refused with 42501.
func TestConsoleRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newRoleDB(t, "coupon_console")
	admin := openPool(t, pgtest.LoginAs(t, db.owner.Config().ConnString(), "coupon_admin"))
	if err := schema.Check(ctx, db.as); err != nil {
		t.Fatal(err)
	}
	if err := campaign.Create(ctx, db.owner, campaign.Campaign{ID: "CON", DiscountYen: 1000, BudgetYen: 10_000, Stripes: 2}); err != nil {
		t.Fatal(err)
	}
	svc, err := issuance.New(db.owner, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := svc.Issue(ctx, "m1", "CON")
	if err != nil || out.Result != issuance.ResultIssued {
		t.Fatalf("issue: %+v, %v", out, err)
	}
	for email, role := range map[string]string{"op@example.com": "operator", "ap@example.com": "approver"} {
		if _, err := admin.Exec(ctx, `SELECT * FROM console_role_set($1, $2, 'the team')`, email, role); err != nil {
			t.Fatalf("console_role_set as coupon_admin: %v", err)
		}
	}
	var role string
	if err := db.as.QueryRow(ctx, `SELECT console_role_of('AP@example.com')`).Scan(&role); err != nil || role != "approver" {
		t.Fatalf("console_role_of: %q, %v; want approver", role, err)
	}
	var requestID int64
	for _, step := range []struct{ sql, why string }{
		{`SELECT count(*) FROM campaign_budgets`, "the list"},
		{`SELECT count(*) FROM campaign_changes`, "the history"},
		{`SELECT count(*) FROM campaign_change_requests`, "the requests"},
		{`SELECT count(*) FROM issued_coupons`, "the coupons"},
		{`SELECT count(*) FROM notification_outbox`, "the push state"},
		{`SELECT count(*) FROM console_role_changes`, "the audit's role grants (00036)"},
		{`SELECT count(*) FROM coupon_rules_changes`, "the audit's rule settings (00036)"},
		{`SELECT count(*) FROM coupon_changes`, "the audit's reissue corrections (00036)"},
		{`SELECT approval_above_yen FROM coupon_rules`, "the approval line"},
		{`SELECT count(*) FROM campaign_audience`, "the audience's size"},
		{`SELECT count(*) FROM campaign_state('CON', issue_now())`, "the state and the next release"},
		{`SELECT count(*) FROM console_pause('CON', true, 'op@example.com', 'check')`, "a pause"},
		{`SELECT count(*) FROM console_pause('CON', false, 'op@example.com', 'checked')`, "a resume"},
		{`SELECT count(*) FROM console_budget('CON', NULL, 1000, NULL, 'op@example.com', 'a little more')`, "a small raise"},
		{`SELECT request_id FROM console_period('CON', NULL, now() + interval '7 days', 'op@example.com', 'a week')`, "a period request"},
	} {
		if err := db.as.QueryRow(ctx, step.sql).Scan(&requestID); err != nil {
			t.Fatalf("%s as coupon_console (%s): %v", step.why, step.sql, err)
		}
	}
	if _, err := db.as.Exec(ctx, `SELECT * FROM console_decide($1, true, 'ap@example.com', 'fine')`, requestID); err != nil {
		t.Fatalf("console_decide: %v", err)
	}
	if _, err := db.as.Exec(ctx, `SELECT * FROM console_void($1, false, 'op@example.com', 'wrong member')`, out.CouponID); err != nil {
		t.Fatalf("console_void: %v", err)
	}
	if _, err := db.as.Exec(ctx, `SELECT * FROM console_end('CON', 'ap@example.com', 'done')`); err != nil {
		t.Fatalf("console_end: %v", err)
	}
	var people string
	if err := db.owner.QueryRow(ctx, `SELECT string_agg(what || ':' || coalesce(operator_email, '-'), ' ' ORDER BY change_id) FROM campaign_changes`).Scan(&people); err != nil {
		t.Fatal(err)
	}
	if want := "create:- pause:op@example.com resume:op@example.com budget:op@example.com period:ap@example.com end:ap@example.com"; people != want {
		t.Errorf("history: %s, want %s", people, want)
	}
	checkRefused(t, db.as, consoleForbidden)
}

// TestDryRunGrantedToIssueOnly: the dry run's function, issue_dry_run_batch (00028), is
// executable by coupon_issue alone of the roles (and its owner), not by PUBLIC: read from its ACL.
func TestDryRunGrantedToIssueOnly(t *testing.T) {
	t.Parallel()
	db := openPool(t, pgtest.URL(t))
	const fn = "issue_dry_run_batch(text, text[])"
	var grantees string
	if err := db.QueryRow(context.Background(), `SELECT coalesce(string_agg(coalesce(g.rolname, 'PUBLIC'), ',' ORDER BY g.rolname), '')
		FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a LEFT JOIN pg_roles g ON g.oid = a.grantee
		WHERE p.oid = $1::regprocedure AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner`, fn).Scan(&grantees); err != nil {
		t.Fatal(err)
	}
	if grantees != "coupon_issue" {
		t.Errorf("%s: EXECUTE granted to %q, want coupon_issue alone", fn, grantees)
	}
}

// TestRedeemRole: a user in coupon_redeem (RedeemCoupon's login) passes the start-up check and
// validates, redeems and rolls back through the three redemption functions, which it alone of
// the roles may execute; every read of a table and every other call or write is refused with
// 42501, and the history takes no change even from its owner (append-only: 23001).
func TestRedeemRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newRoleDB(t, "coupon_redeem")
	if err := schema.Check(ctx, db.as); err != nil {
		t.Fatal(err)
	}
	createIssueCampaigns(t, db.owner)
	svc, err := issuance.New(db.owner, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := svc.Issue(ctx, "m1", "ONE")
	if err != nil || out.Result != issuance.ResultIssued {
		t.Fatalf("issue: %+v, %v", out, err)
	}
	for _, step := range []struct{ sql, want string }{
		{`SELECT result FROM coupon_validate($1, 'm1', 'A')`, "VALID"},
		{`SELECT result FROM coupon_redeem($1, 'm1', 'A')`, "REDEEMED"},
		{`SELECT result FROM coupon_redemption_rollback($1, 'm1', 'A', 'cancelled')`, "ROLLED_BACK"},
	} {
		var got string
		if err := db.as.QueryRow(ctx, step.sql, out.CouponID).Scan(&got); err != nil || got != step.want {
			t.Errorf("%s as coupon_redeem: %q, %v; want %s", step.sql, got, err, step.want)
		}
	}
	var grantees string
	if err := db.owner.QueryRow(ctx, `SELECT string_agg(DISTINCT g.rolname, ',' ORDER BY g.rolname)
		FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a JOIN pg_roles g ON g.oid = a.grantee
		WHERE p.proname IN ('coupon_validate', 'coupon_redeem', 'coupon_redemption_rollback')
		  AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner`).Scan(&grantees); err != nil || grantees != "coupon_redeem" {
		t.Errorf("the redemption functions: EXECUTE granted to %q (%v), want coupon_redeem alone", grantees, err)
	}
	checkRefused(t, db.as, []forbidden{
		{"a coupon read", `SELECT count(*) FROM issued_coupons`},
		{"a redemption outside the function", `UPDATE issued_coupons SET redeemed_at = now()`},
		{"a history row outside the function", `INSERT INTO coupon_redemptions (coupon_id, action, order_id) VALUES (gen_random_uuid(), 'redeem', 'X')`},
		{"a history read", `SELECT count(*) FROM coupon_redemptions`},
		{"an issuance", `SELECT * FROM issue_coupons_batch_v3('ONE', ARRAY[gen_random_uuid()], ARRAY['m9'], ARRAY[NULL::text])`},
		{"a void", `SELECT * FROM coupon_void(gen_random_uuid(), 'x', false)`},
		{"a budget read", `SELECT count(*) FROM campaign_budgets`},
	})
	for _, q := range []string{`UPDATE coupon_redemptions SET order_id = 'B'`, `DELETE FROM coupon_redemptions`, `TRUNCATE coupon_redemptions`} {
		if _, err := db.owner.Exec(ctx, q); sqlStateOf(err) != pgerrcode.RestrictViolation {
			t.Errorf("%s as the owner: %v, want 23001 (append-only)", q, err)
		}
	}
}
