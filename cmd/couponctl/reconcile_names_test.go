package main

import (
	"context"
	"regexp"
	"testing"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// TestReconcileNamesMemberMonths: a member's month counter changed by hand makes reconcile exit 1
// naming the member and the month with both figures (before: only "1 member-months").
func TestReconcileNamesMemberMonths(t *testing.T) {
	d := newGrantDB(t, campaign.Campaign{ID: "N", DiscountYen: 500, BudgetYen: 1_000_000})
	issueTo(t, d, "N", "n1", "n2")
	if _, err := d.owner.Exec(context.Background(), `UPDATE member_monthly_usage SET used_yen = 1500 WHERE member_id = 'n2'`); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DATABASE_URL", d.url)
	code, stdout, stderr := grantCLI("reconcile")
	if code != 1 || !regexp.MustCompile(`(?m)^  n2 \d{4}-\d{2} \(counter 1500 yen, live coupons 500 yen\)$`).MatchString(stdout) ||
		regexp.MustCompile(`(?m)^  n1 `).MatchString(stdout) {
		t.Errorf("reconcile: exit %d, want 1 naming n2's month alone\n%s%s", code, stdout, stderr)
	}
}
