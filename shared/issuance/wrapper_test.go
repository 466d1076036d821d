package issuance_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// callState is one call's answer and what it wrote, read inside its transaction before the
// rollback: the coupons, the yen of the member x month rows, the outbox rows, the yen of the
// budget stripes and the coupon's granted_by.
type callState struct {
	result, coupon, reason   *string
	amount                   *int
	expires                  *time.Time
	coupons, usedYen, outbox int
	issuedYen                int
}

func (c callState) String() string {
	str := func(p *string) string {
		if p == nil {
			return "NULL"
		}
		return *p
	}
	amount, expires := "NULL", "NULL"
	if c.amount != nil {
		amount = fmt.Sprint(*c.amount)
	}
	if c.expires != nil {
		expires = c.expires.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("%s coupon=%s amount=%s reason=%s expires=%s; rows: %d coupons, %d yen used, %d outbox, %d yen issued",
		str(c.result), str(c.coupon), amount, str(c.reason), expires, c.coupons, c.usedYen, c.outbox, c.issuedYen)
}

// inRolledBack runs call (an issuance of one member) in a transaction, reads what it answered
// and wrote, and rolls it back.
func inRolledBack(t *testing.T, conn *pgx.Conn, call string, args ...any) callState {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var s callState
	if err := tx.QueryRow(ctx, call, args...).Scan(&s.result, &s.coupon, &s.amount, &s.reason, &s.expires); err != nil {
		t.Fatalf("%s: %v", call, err)
	}
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*)::int FROM issued_coupons), (SELECT coalesce(sum(used_yen), 0)::int FROM member_monthly_usage),
		(SELECT count(*)::int FROM notification_outbox), (SELECT coalesce(sum(issued_yen), 0)::int FROM campaign_budgets)`).
		Scan(&s.coupons, &s.usedYen, &s.outbox, &s.issuedYen); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestIssueCouponAnswersAsTheBatch: issue_coupon, which the release before 00014 still calls,
// answers as issue_coupons_batch answers a batch of one, and writes the same rows, for every
// state of the rules: ISSUED (with its validity), R1 BUDGET_EXCEEDED, R2 ALREADY_ISSUED, R3
// MONTHLY_CAP, COUPON_VOIDED, CAMPAIGN_NOT_ACTIVE paused, not started and ended, and
// UNKNOWN_CAMPAIGN. Each call runs in a transaction of its own, read and rolled back, so both
// see the same state. The broken variant, an issue_coupon that passes the batch another member
// than its own (pgtest.BreakFunction), is seen. (Its cap, which the batch ignores since 00021, can
// no longer make them differ.)
func TestIssueCouponAnswersAsTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	owner := connect(t, dbURL)
	now := time.Now()
	dayAgo, twoDaysAgo, tomorrow, inTwoDays := now.Add(-24*time.Hour), now.Add(-48*time.Hour), now.Add(24*time.Hour), now.Add(48*time.Hour)
	for _, c := range []campaign.Campaign{
		{ID: "OPEN", DiscountYen: 1000, BudgetYen: 1_000_000, CouponValidDays: 30},
		{ID: "CAPA", DiscountYen: 1000, BudgetYen: 1_000_000},
		{ID: "CAPB", DiscountYen: 1000, BudgetYen: 1_000_000},
		{ID: "FULL", DiscountYen: 1000, BudgetYen: 1000},
		{ID: "PAUSED", DiscountYen: 500, BudgetYen: 1_000_000},
		{ID: "LATER", DiscountYen: 500, BudgetYen: 1_000_000, StartsAt: &tomorrow, EndsAt: &inTwoDays},
		{ID: "OVER", DiscountYen: 500, BudgetYen: 1_000_000, StartsAt: &twoDaysAgo, EndsAt: &dayAgo},
	} {
		if err := campaign.Create(ctx, owner, c); err != nil {
			t.Fatal(err)
		}
	}
	issue := func(member, campaignID string) string {
		t.Helper()
		id := uuid.NewString()
		var result string
		if err := owner.QueryRow(ctx, `SELECT result FROM issue_coupons_batch($1, ARRAY[$2::uuid], ARRAY[$3], ARRAY[now()], 2000, ARRAY[NULL::text])`,
			campaignID, id, member).Scan(&result); err != nil || result != "ISSUED" {
			t.Fatalf("issuing %s to %s: %s %v", campaignID, member, result, err)
		}
		return id
	}
	issue("dup", "OPEN")
	issue("capped", "CAPA")
	issue("capped", "CAPB")
	issue("x", "FULL")
	if _, err := owner.Exec(ctx, `SELECT coupon_void($1, 'the test', false)`, issue("void", "OPEN")); err != nil {
		t.Fatal(err)
	}
	if _, err := campaign.Pause(ctx, owner, "PAUSED", "the test"); err != nil {
		t.Fatal(err)
	}

	cases := []struct{ member, campaign, want string }{
		{"fresh", "OPEN", "ISSUED"},
		{"late", "FULL", "BUDGET_EXCEEDED"},
		{"dup", "OPEN", "ALREADY_ISSUED"},
		{"capped", "OPEN", "MONTHLY_CAP"},
		{"void", "OPEN", "COUPON_VOIDED"},
		{"fresh", "PAUSED", "CAMPAIGN_NOT_ACTIVE"},
		{"fresh", "LATER", "CAMPAIGN_NOT_ACTIVE"},
		{"fresh", "OVER", "CAMPAIGN_NOT_ACTIVE"},
		{"fresh", "NOPE", "UNKNOWN_CAMPAIGN"},
	}
	differences := func() []string {
		var diffs []string
		for _, c := range cases {
			id, at := uuid.NewString(), time.Now()
			wrapper := inRolledBack(t, owner, `SELECT result, coupon, amount, reason, expires_at FROM issue_coupon($1, $2, $3, $4, 2000, NULL)`,
				id, c.campaign, c.member, at)
			batch := inRolledBack(t, owner, `SELECT result, coupon, amount, reason, expires_at
				FROM issue_coupons_batch($1, ARRAY[$2::uuid], ARRAY[$3], ARRAY[$4::timestamptz], 2000, ARRAY[NULL::text])`,
				c.campaign, id, c.member, at)
			if batch.result == nil || *batch.result != c.want {
				t.Fatalf("%s for %s: the batch answered %s, want %s: the state is not what the case names", c.campaign, c.member, batch, c.want)
			}
			if wrapper.String() != batch.String() {
				diffs = append(diffs, fmt.Sprintf("%s for %s:\n  issue_coupon        %s\n  issue_coupons_batch %s", c.campaign, c.member, wrapper, batch))
			}
		}
		return diffs
	}
	for _, d := range differences() {
		t.Error(d)
	}

	pgtest.BreakFunction(t, owner, "issue_coupon", [2]string{"ARRAY[p_member_id]", "ARRAY['x' || p_member_id]"})
	if diffs := differences(); len(diffs) == 0 {
		t.Error("the broken variant, an issue_coupon passing another member, passed: the test would not see the two differ")
	} else {
		t.Logf("the broken variant: %v", diffs)
	}
}
