package main

import (
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestOutboxStatusNamesVoidedSkips: a coupon voided before its push closes its outbox row as
// skipped for that reason, and outbox status counts it as voided, not as "no LINE account" (the
// words a new user read for voided coupons). Judged by the outbox row (SQL) and the status
// line. Shown red on the broken variant, coupon_void closing the row without its reason
// (BreakFunction), which the status then counts as a member without a LINE account.
func TestOutboxStatusNamesVoidedSkips(t *testing.T) {
	var broken [][2]string // coupon_void's replacements, none for the code as it is
	checkAndBreak(t, func(t *testing.T, v *verdict) { skipReasonCheck(t, v, broken) },
		brokenVariant{"the void closes the row without its reason", func(t *testing.T) {
			swap(t, &broken, [][2]string{{"skip_reason = 'voided',\n           last_error = 'skipped: the coupon was voided (couponctl coupon show)'",
				"last_error = 'skipped'"}})
		}})
}

func skipReasonCheck(t *testing.T, v *verdict, replacements [][2]string) {
	d := newGrantDB(t, campaign.Campaign{ID: "SK", DiscountYen: 500, BudgetYen: 1_000_000})
	if len(replacements) > 0 {
		pgtest.BreakFunction(t, d.owner, "coupon_void", replacements...)
	}
	id := issueTo(t, d, "SK", "s1")[0]
	t.Setenv("DATABASE_URL", d.admin)
	if code, stdout, stderr := grantCLI("coupon", "void", id, "--reason", "CS-9"); code != 0 {
		t.Fatalf("void: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := d.count(t, `SELECT count(*) FROM notification_outbox WHERE coupon_id = $1 AND skipped_at IS NOT NULL AND skip_reason = 'voided'`, id); n != 1 {
		v.Errorf("the voided coupon's outbox row is not skipped as voided")
	}
	t.Setenv("DATABASE_URL", d.url)
	code, stdout, stderr := grantCLI("outbox", "status")
	if code != 0 || !strings.Contains(stdout, "voided           1") || strings.Contains(stdout, "no LINE account  1") {
		v.Errorf("outbox status: exit %d, want the skipped row counted as voided\n%s%s", code, stdout, stderr)
	}
}
