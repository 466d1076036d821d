package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// cli runs couponctl with args and returns its exit code, stdout and stderr.
func cli(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestRulesSetBindsEveryIssuance: the cap `rules set` writes, as a user in coupon_admin, binds
// IssueCoupon and the grant at once, and reconcile judges by it; lowered in mid-month, it leaves
// the coupons issued before it alone (reconcile stays clean). The broken variant is an issuance
// that takes its caller's cap, as before 00021 (the previous release's 2,000 yen): it issues
// past the new cap, and reconcile, reading the database's, finds R3 broken.
func TestRulesSetBindsEveryIssuance(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	owner, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	for _, id := range []string{"CAP-A", "CAP-B", "CAP-C"} {
		if err := campaign.Create(ctx, owner, campaign.Campaign{ID: id, DiscountYen: 1000, BudgetYen: 100_000}); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := issuance.New(owner, issuance.Config{BatchMax: 1})
	if err != nil {
		t.Fatal(err)
	}
	issue := func(grant bool, member, id string) issuance.Result {
		t.Helper()
		call := svc.Issue
		if grant {
			call = svc.Grant
		}
		out, err := call(ctx, member, id)
		if err != nil {
			t.Fatalf("%s %s: %v", member, id, err)
		}
		return out.Result
	}
	for _, id := range []string{"CAP-A", "CAP-B"} {
		if r := issue(false, "early", id); r != issuance.ResultIssued {
			t.Fatalf("early %s at the 2,000 yen cap: %s, want ISSUED", id, r)
		}
	}

	t.Setenv("DATABASE_URL", pgtest.LoginAs(t, url, "coupon_admin"))
	code, out, errOut := cli("rules", "set", "--monthly-cap-yen", "1000", "--reason", "regulation changed in mid-month")
	if code != 0 || !strings.Contains(out, "before  monthly_cap_yen=2000") || !strings.Contains(out, "after   monthly_cap_yen=1000") {
		t.Fatalf("rules set: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli("rules", "show")
	if code != 0 || !strings.Contains(out, "monthly_cap_yen 1000") || !strings.Contains(out, "regulation changed in mid-month") {
		t.Errorf("rules show: exit %d\n%s%s", code, out, errOut)
	}

	for _, step := range []struct {
		grant        bool
		member, id   string
		want         issuance.Result
		viaIssuePath string
	}{
		{false, "late", "CAP-A", issuance.ResultIssued, "IssueCoupon"},
		{false, "late", "CAP-B", issuance.ResultMonthlyCap, "IssueCoupon"},
		{true, "late", "CAP-C", issuance.ResultMonthlyCap, "grant"},
		{true, "granted", "CAP-C", issuance.ResultIssued, "grant"},
		{true, "granted", "CAP-A", issuance.ResultMonthlyCap, "grant"},
		{false, "early", "CAP-C", issuance.ResultMonthlyCap, "IssueCoupon"},
	} {
		if r := issue(step.grant, step.member, step.id); r != step.want {
			t.Errorf("%s: %s %s at the 1,000 yen cap: %s, want %s", step.viaIssuePath, step.member, step.id, r, step.want)
		}
	}
	var early int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM issued_coupons WHERE member_id = 'early' AND voided_at IS NULL`).Scan(&early); err != nil || early != 2 {
		t.Errorf("early's coupons after the lowering: %d (%v), want the 2 issued before it, live", early, err)
	}
	if code, out, errOut := cli("reconcile"); code != 0 {
		t.Errorf("reconcile after the lowering: exit %d, want 0 (early's 2,000 yen were issued under 2,000)\n%s%s", code, out, errOut)
	}

	pgtest.BreakFunction(t, owner, "issue_coupons_batch_v3", [2]string{"  v_cap := monthly_cap_yen();\n", "  v_cap := 2000;\n"})
	var r string
	if err := owner.QueryRow(ctx, `SELECT result FROM issue_coupon(gen_random_uuid(), 'CAP-C', 'late', now(), 2000, NULL)`).Scan(&r); err != nil || r != "ISSUED" {
		t.Fatalf("the caller's 2,000 yen cap after the lowering: %s %v, want ISSUED (the broken variant)", r, err)
	}
	if code, out, _ := cli("reconcile"); code != 1 || !strings.Contains(out, "R3: 1 member-months over the cap") || !strings.Contains(out, "late") {
		t.Errorf("reconcile after a coupon past the database's cap: exit %d, want 1 naming late's month\n%s", code, out)
	}
}

// TestRulesSetRefusesBadFlags: a cap out of range or a missing reason is a command line error
// (exit 2), refused before the database is touched.
func TestRulesSetRefusesBadFlags(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
	for _, args := range [][]string{
		{"rules", "set", "--monthly-cap-yen", "0", "--reason", "r"},
		{"rules", "set", "--monthly-cap-yen", "1000000001", "--reason", "r"},
		{"rules", "set", "--monthly-cap-yen", "1000", "--reason", "  "},
		{"rules", "set", "--monthly-cap-yen", "1000"},
		{"rules", "set", "--approval-above-yen", "-1", "--reason", "r"},
		{"rules", "set", "--approval-above-yen", "2147483648", "--reason", "r"},
		{"rules", "set", "--reason", "r"},
	} {
		if code, _, errOut := cli(args...); code != exitUsage || !strings.Contains(errOut, "Usage:") {
			t.Errorf("%q: exit %d, want 2 with the usage\n%s", args, code, errOut)
		}
	}
}

// TestVerbsRefuseMonthlyCapEnv: with MONTHLY_CAP_YEN set, every verb is refused at start-up,
// naming `couponctl rules set`, before it touches anything: grant issued with its own cap, and
// reconcile judged by it, before 00021.
func TestVerbsRefuseMonthlyCapEnv(t *testing.T) {
	t.Setenv("DATABASE_URL", pgtest.URL(t))
	t.Setenv("MONTHLY_CAP_YEN", "1000000")
	members := filepath.Join(t.TempDir(), "members")
	if err := os.WriteFile(members, []byte("m1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"reconcile"}, {"grant", "--campaign", "X", "--members", members, "--dry-run"}, {"serve"}, {"rules", "show"},
		{"campaign", "list"}, {"audit", members},
	} {
		code, out, errOut := cli(args...)
		if code != 1 || !strings.Contains(errOut, "MONTHLY_CAP_YEN is set") || !strings.Contains(errOut, "couponctl rules set") || out != "" {
			t.Errorf("%q with MONTHLY_CAP_YEN set: exit %d, want 1 naming couponctl rules set\n%s%s", args, code, out, errOut)
		}
	}
}

// TestRulesSetBusySaysNothingChanged: a rules set that waits past coupon_rules_set's 1 s lock
// timeout (a session holds coupon_rules, as an issuance in flight does) exits 1 saying nothing
// changed and to run it again, and writes no history; it printed PostgreSQL's bare "canceling
// statement due to lock timeout" before (found trying the release as a new user).
func TestRulesSetBusySaysNothingChanged(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	owner, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	holder, err := owner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `LOCK TABLE coupon_rules IN ACCESS SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DATABASE_URL", url)
	code, _, errOut := cli("rules", "set", "--monthly-cap-yen", "1500", "--reason", "busy")
	if code != 1 || !strings.Contains(errOut, "nothing changed, run it again") {
		t.Errorf("rules set behind a held coupon_rules: exit %d, want 1 saying nothing changed\n%s", code, errOut)
	}
	var changes int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM coupon_rules_changes`).Scan(&changes); err != nil {
		t.Fatal(err)
	}
	if changes != 2 {
		t.Errorf("%d rule changes after the busy set, want the migrations' 2 (00021's cap, 00026's approval line)", changes)
	}
}

// TestGroupWithoutAVerbExitsTwo: a verb group alone (couponctl rules, campaign, coupon, ...) is
// a command line couponctl does not understand: exit 2 with the usage listing its sub-verbs, as
// docs/api.md's exit-code rule says (it exited 1; found trying the release as a new user).
func TestGroupWithoutAVerbExitsTwo(t *testing.T) {
	for _, group := range []string{"rules", "campaign", "coupon", "outbox"} {
		code, _, errOut := cli(group)
		if code != exitUsage || !strings.Contains(errOut, "needs a verb") || !strings.Contains(errOut, "Available Commands:") {
			t.Errorf("couponctl %s: exit %d, want 2 with the usage listing its verbs\n%s", group, code, errOut)
		}
	}
}

// TestRulesSetApprovalLine: `rules set --approval-above-yen`, as a user in coupon_admin, moves the
// console's four-eyes line with its own history row while a session holds coupon_rules as an
// issuance in flight does (the line alone takes only the row's lock, so no issuance waits for
// it, where a cap change behind the same session gives up); `rules show` shows it, and a
// console raise above the new line becomes a request while one at it is applied.
func TestRulesSetApprovalLine(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	owner, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	t.Setenv("DATABASE_URL", pgtest.LoginAs(t, url, "coupon_admin"))
	holder, err := owner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `LOCK TABLE coupon_rules IN ACCESS SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli("rules", "set", "--approval-above-yen", "50000", "--reason", "finance asks for a lower line")
	if code != 0 || !strings.Contains(out, "before  approval_above_yen=100000\n  after   approval_above_yen=50000\n") ||
		!strings.Contains(out, "more than 50000 yen now wait for a second approver") || strings.Contains(out, "capped") {
		t.Errorf("rules set --approval-above-yen beside an issuance in flight: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := cli("rules", "set", "--monthly-cap-yen", "1500", "--reason", "busy"); code != 1 {
		t.Errorf("rules set --monthly-cap-yen beside the same session: exit %d, want 1 (it waits for the issuance)\n%s", code, errOut)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli("rules", "show")
	if code != 0 || !strings.Contains(out, "approval_above_yen 50000\n") || !strings.Contains(out, "approval_above_yen=100000  approval_above_yen=50000   finance asks for a lower line") {
		t.Errorf("rules show: exit %d\n%s%s", code, out, errOut)
	}
	if err := campaign.Create(ctx, owner, campaign.Campaign{ID: "LINE", DiscountYen: 1000, BudgetYen: 100_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `SELECT * FROM console_role_set('op@example.com', 'operator', 'test')`); err != nil {
		t.Fatal(err)
	}
	var answers string
	if err := owner.QueryRow(ctx, `SELECT (SELECT applied FROM console_budget('LINE', NULL, 50001, NULL, 'op@example.com', 'above')) || ' ' ||
	    (SELECT applied FROM console_budget('LINE', NULL, 50000, NULL, 'op@example.com', 'at the line'))`).Scan(&answers); err != nil {
		t.Fatal(err)
	}
	if answers != "false true" {
		t.Errorf("console raises of 50,001 and 50,000 yen: applied %s, want false true", answers)
	}
}
