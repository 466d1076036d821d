package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
)

// TestCouponShowMember: a support ticket names a member, and coupon show --member M lists the
// member's coupons with their state, voided ones included; --campaign C keeps C's alone; a member
// without coupons is said so, exit 0 (before: coupon show needed the coupon's UUID, found with
// SQL). The coupons listed are the table's (SQL). Shown red on its broken variants: voided
// coupons left out, --campaign not applied.
func TestCouponShowMember(t *testing.T) {
	checkAndBreak(t, couponShowMemberCheck,
		brokenVariant{"voided coupons left out", func(t *testing.T) {
			swap(t, &memberCoupons, func(ctx context.Context, db coupon.Rows, member, campaignID string) ([]coupon.Coupon, error) {
				all, err := coupon.ForMember(ctx, db, member, campaignID)
				var live []coupon.Coupon
				for _, c := range all {
					if c.VoidedAt == nil {
						live = append(live, c)
					}
				}
				return live, err
			})
		}},
		brokenVariant{"--campaign not applied", func(t *testing.T) {
			swap(t, &memberCoupons, func(ctx context.Context, db coupon.Rows, member, _ string) ([]coupon.Coupon, error) {
				return coupon.ForMember(ctx, db, member, "")
			})
		}})
}

func couponShowMemberCheck(t *testing.T, v *verdict) {
	d := newGrantDB(t, campaign.Campaign{ID: "SA", DiscountYen: 500, BudgetYen: 1_000_000},
		campaign.Campaign{ID: "SB", DiscountYen: 300, BudgetYen: 1_000_000})
	a, b := issueTo(t, d, "SA", "h1")[0], issueTo(t, d, "SB", "h1")[0]
	t.Setenv("DATABASE_URL", d.admin)
	if code, stdout, stderr := grantCLI("coupon", "void", a, "--reason", "CS-7"); code != 0 {
		t.Fatalf("void: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE member_id = 'h1'`); n != 2 {
		t.Fatalf("%d coupons of h1 in the table, want 2", n)
	}
	voided := regexp.MustCompile(`(?m)^` + a + ` +SA +voided +500 `)
	live := regexp.MustCompile(`(?m)^` + b + ` +SB +live +300 `)
	code, stdout, stderr := grantCLI("coupon", "show", "--member", "h1")
	if code != 0 || !voided.MatchString(stdout) || !live.MatchString(stdout) {
		v.Errorf("coupon show --member h1: exit %d, want the voided coupon of SA and the live one of SB\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = grantCLI("coupon", "show", "--member", "h1", "--campaign", "SA")
	if code != 0 || !voided.MatchString(stdout) || strings.Contains(stdout, b) {
		v.Errorf("coupon show --member h1 --campaign SA: exit %d, want SA's coupon alone\n%s%s", code, stdout, stderr)
	}
	if code, stdout, _ = grantCLI("coupon", "show", "--member", "nobody"); code != 0 || !strings.Contains(stdout, "member nobody has no coupons") {
		v.Errorf("coupon show --member nobody: exit %d\n%s", code, stdout)
	}
}

// TestCouponShowRedemptions: support asks what happened to a coupon at the till. coupon show
// prints its state and, under it, every redeem and rollback of its history with the order, the
// reason and the login, oldest first (coupon_redemptions, as the table holds them: SQL).
func TestCouponShowRedemptions(t *testing.T) {
	d := newGrantDB(t, campaign.Campaign{ID: "TILL", DiscountYen: 500, BudgetYen: 1_000_000})
	c := issueTo(t, d, "TILL", "r1")[0]
	for _, q := range []string{
		`SELECT coupon_redeem($1, 'r1', 'POS-0001')`,
		`SELECT coupon_redemption_rollback($1, 'r1', 'POS-0001', 'order cancelled by the customer')`,
		`SELECT coupon_redeem($1, 'r1', 'POS-0002')`,
	} {
		if _, err := d.owner.Exec(context.Background(), q, c); err != nil {
			t.Fatal(err)
		}
	}
	if n := d.count(t, `SELECT count(*) FROM coupon_redemptions WHERE coupon_id = $1`, c); n != 3 {
		t.Fatalf("%d history rows, want 3", n)
	}
	t.Setenv("DATABASE_URL", d.admin)
	code, stdout, stderr := grantCLI("coupon", "show", c)
	want := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^state +redeemed$`),
		regexp.MustCompile(`(?m)^redemptions +\S+\+09:00 redeem +order POS-0001 by \S+$`),
		regexp.MustCompile(`(?m)^ +\S+\+09:00 rollback order POS-0001 by \S+: order cancelled by the customer$`),
		regexp.MustCompile(`(?m)^ +\S+\+09:00 redeem +order POS-0002 by \S+$`),
	}
	for _, re := range want {
		if code != 0 || !re.MatchString(stdout) {
			t.Errorf("coupon show: exit %d, no line matching %s\n%s%s", code, re, stdout, stderr)
		}
	}
}
