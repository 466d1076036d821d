package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// issueTo issues campaign id to each member through the service and returns the coupon ids.
func issueTo(t *testing.T, d grantDB, id string, members ...string) []string {
	t.Helper()
	svc, err := issuance.New(d.owner, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range members {
		out, err := svc.Issue(context.Background(), m, id)
		if err != nil || (out.Result != issuance.ResultIssued && out.Result != issuance.ResultAlreadyIssued) {
			t.Fatalf("issue %s to %s: %+v, %v", id, m, out, err)
		}
		got = append(got, out.CouponID)
	}
	return got
}

// TestVoidFileRerunAndStreams: a --file naming a coupon twice voids it once and exits 0 (before:
// exit 1, the second a refusal); a re-run of the same file reports the coupons it voided as done
// and exits 0 (before: exit 1, each listed as refused); --dry-run changes nothing; a refusal
// (another reason's void) goes to stderr once, as "couponctl: ..." (before: stdout, without the
// prefix), and the voids to stdout. Judged by counting voided coupons with SQL. Shown red on its
// broken variants: a re-run blind to the earlier run's voids, a --dry-run not honoured, a
// refusal printed on stdout without the prefix.
func TestVoidFileRerunAndStreams(t *testing.T) {
	dryRun := "--dry-run"
	checkAndBreak(t, func(t *testing.T, v *verdict) { voidFileCheck(t, v, dryRun) },
		brokenVariant{"a re-run blind to the earlier run", func(t *testing.T) {
			swap(t, &voidDoneBefore, func(voider, context.Context, string, error) *coupon.Coupon { return nil })
		}},
		brokenVariant{"--dry-run not honoured", func(t *testing.T) { swap(t, &dryRun, "--dry-run=false") }},
		brokenVariant{"a refusal on stdout without the prefix", func(t *testing.T) {
			swap(t, &voidRefused, func(v voider, id string, err error) { fmt.Fprintf(v.out, "%s: %v\n", id, err) })
		}})
}

// voidFileCheck voids a file twice, with dryRun (the flag that makes a dry run) first, then a
// coupon of it for another reason, and records what went wrong.
func voidFileCheck(t *testing.T, v *verdict, dryRun string) {
	d := newGrantDB(t, campaign.Campaign{ID: "V", DiscountYen: 500, BudgetYen: 1_000_000})
	t.Setenv("DATABASE_URL", d.admin)
	ids := issueTo(t, d, "V", "v1", "v2", "v3")
	file := filepath.Join(t.TempDir(), "ring.txt")
	if err := os.WriteFile(file, []byte("\ufeff"+ids[0]+"\n# the ring\n"+ids[1]+"\n"+ids[0]+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	voided := func() int { return d.count(t, `SELECT count(*) FROM issued_coupons WHERE voided_at IS NOT NULL`) }

	code, stdout, stderr := grantCLI("coupon", "void", "--file", file, "--reason", "FRAUD-77", dryRun)
	if code != 0 || !strings.Contains(stdout, "dry run: 2 of 2 coupons would be voided, 0 refused; nothing changed") {
		v.Errorf("--dry-run: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := voided(); n != 0 {
		v.Errorf("--dry-run voided %d coupons", n)
		return
	}
	code, stdout, stderr = grantCLI("coupon", "void", "--file", file, "--reason", "FRAUD-77")
	if code != 0 || !strings.Contains(stderr, "coupons listed more than once, voided once each: 1") ||
		!strings.Contains(stderr, "skipped the UTF-8 byte order mark (BOM)") {
		v.Errorf("first run: exit %d, want 0 noting the repeat and the BOM\n%s%s", code, stdout, stderr)
	}
	if n := voided(); n != 2 {
		v.Errorf("%d coupons voided after the first run, want 2", n)
	}
	code, stdout, stderr = grantCLI("coupon", "void", "--file", file, "--reason", "FRAUD-77")
	if code != 0 || strings.Count(stdout, "voided already by an earlier run") != 2 || strings.Contains(stderr, "couponctl:") {
		v.Errorf("re-run: exit %d, want 0 with both coupons done by the earlier run and no refusal\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = grantCLI("coupon", "void", ids[0], "--reason", "another ticket")
	if code != 1 || !strings.HasPrefix(stderr, "couponctl: "+ids[0]+": coupon: void refused: ") || strings.Count(stderr, "couponctl:") != 1 ||
		strings.Contains(stdout, "refused") {
		v.Errorf("a void of a coupon voided for another reason: exit %d, want 1 with one couponctl: line on stderr\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if n := voided(); n != 2 {
		v.Errorf("%d coupons voided in the end, want 2", n)
	}
}

// TestVoidCorrectedWithReissue: a coupon voided without --allow-reissue is voided again with it:
// the pair is released (IssueCoupon issues the member a new coupon), a coupon_changes row records
// who and why, and no counter moves (before: refused, the member answered COUPON_VOIDED for
// good). Counted with SQL. Shown red on coupon_allow_reissue's broken variants (BreakFunction):
// one that answers RELEASED without releasing the pair, one that writes no history.
func TestVoidCorrectedWithReissue(t *testing.T) {
	var broken [][2]string // coupon_allow_reissue's replacements, none for the code as it is
	checkAndBreak(t, func(t *testing.T, v *verdict) { voidCorrectionCheck(t, v, broken) },
		brokenVariant{"the pair not released", func(t *testing.T) {
			swap(t, &broken, [][2]string{{"SET reissue_allowed = true", "SET reissue_allowed = false"}})
		}},
		brokenVariant{"no history row", func(t *testing.T) {
			swap(t, &broken, [][2]string{{"INSERT INTO coupon_changes (coupon_id, what, reason) VALUES (p_coupon_id, 'allow_reissue', p_reason)\n  RETURNING coupon_changes.changed_at, coupon_changes.changed_by INTO changed_at, changed_by",
				"SELECT now(), current_user INTO changed_at, changed_by"}})
		}})
}

// voidCorrectionCheck voids a coupon, corrects the void to allow reissue with coupon_allow_reissue
// broken by replacements (none: as it is), and records what went wrong.
func voidCorrectionCheck(t *testing.T, v *verdict, replacements [][2]string) {
	d := newGrantDB(t, campaign.Campaign{ID: "R", DiscountYen: 500, BudgetYen: 1_000_000})
	t.Setenv("DATABASE_URL", d.admin)
	if len(replacements) > 0 {
		pgtest.BreakFunction(t, d.owner, "coupon_allow_reissue", replacements...)
	}
	id := issueTo(t, d, "R", "r1")[0]
	if code, stdout, stderr := grantCLI("coupon", "void", id, "--reason", "CS-1"); code != 0 {
		t.Fatalf("void: exit %d\n%s%s", code, stdout, stderr)
	}
	counters := func() (int, int) {
		return d.count(t, `SELECT sum(issued_yen) FROM campaign_budgets WHERE campaign_id = 'R'`),
			d.count(t, `SELECT coalesce(sum(used_yen), 0) FROM member_monthly_usage WHERE member_id = 'r1'`)
	}
	budget, usage := counters()
	code, stdout, stderr := grantCLI("coupon", "void", id, "--allow-reissue", "--reason", "CS-1: may have it again")
	if code != 0 || !strings.Contains(stdout, "reissue now allowed") {
		v.Errorf("correction: exit %d\n%s%s", code, stdout, stderr)
	}
	if b, u := counters(); b != budget || u != usage {
		v.Errorf("counters moved: budget %d -> %d, usage %d -> %d", budget, b, usage, u)
	}
	if n := d.count(t, `SELECT count(*) FROM coupon_changes WHERE coupon_id = $1 AND what = 'allow_reissue'
	                      AND reason = 'CS-1: may have it again' AND changed_by = current_user`, id); n != 0 {
		// current_user is the owner here; the row names the admin login.
		v.Errorf("the history row names the owner, want the admin login")
	}
	if n := d.count(t, `SELECT count(*) FROM coupon_changes WHERE coupon_id = $1 AND what = 'allow_reissue' AND reason = 'CS-1: may have it again'`, id); n != 1 {
		v.Errorf("%d history rows for the correction, want 1", n)
	}
	svc, err := issuance.New(d.owner, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if again, err := svc.Issue(context.Background(), "r1", "R"); err != nil || again.Result != issuance.ResultIssued || again.CouponID == id {
		v.Errorf("IssueCoupon after the correction: %+v, %v; want a new coupon ISSUED", again, err)
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'R' AND member_id = 'r1' AND voided_at IS NULL`); n != 1 {
		v.Errorf("%d live coupons of R for r1 after the correction, want 1", n)
	}
	// A support ticket names the member: coupon show --member finds both coupons with their state.
	code, stdout, stderr = grantCLI("coupon", "show", "--member", "r1", "--campaign", "R")
	if code != 0 || !regexp.MustCompile(`(?m)^`+id+` +R +voided \(reissue allowed\) +500 `).MatchString(stdout) ||
		strings.Count(stdout, " live ") != 1 {
		v.Errorf("coupon show --member r1 --campaign R: exit %d, want the voided coupon and one live one\n%s%s", code, stdout, stderr)
	}
	if code, stdout, _ = grantCLI("coupon", "show", "--member", "nobody"); code != 0 || !strings.Contains(stdout, "member nobody has no coupons") {
		v.Errorf("coupon show --member nobody: exit %d\n%s", code, stdout)
	}
	// The same correction again, as a re-run after an interruption: its work is done (exit 0),
	// and the line names the void's login.
	code, stdout, stderr = grantCLI("coupon", "void", id, "--allow-reissue", "--reason", "CS-1: may have it again")
	if code != 0 || !strings.Contains(stdout, "voided already by an earlier run") || strings.Contains(stdout, " by , ") {
		v.Errorf("the same correction again: exit %d, want 0 saying an earlier run did it, with the login\n%s%s", code, stdout, stderr)
	}
	code, _, stderr = grantCLI("coupon", "void", id, "--allow-reissue", "--reason", "again")
	if code != 1 || !strings.Contains(stderr, "with reissue allowed; nothing changed") {
		v.Errorf("a second correction: exit %d, want 1 saying reissue is allowed already\n%s", code, stderr)
	}
}

// TestCouponStateExpired: coupon show calls a live coupon past its expires_at (the database's
// judgement, coupon.Coupon.Expired) expired, not live (a new user read "state live" on a coupon
// that had expired); a voided or redeemed one keeps that state, and one without validity stays
// live.
func TestCouponStateExpired(t *testing.T) {
	past := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		c    coupon.Coupon
		want string
	}{
		{coupon.Coupon{ExpiresAt: &past, Expired: true}, "expired"},
		{coupon.Coupon{ExpiresAt: &past}, "live"},
		{coupon.Coupon{}, "live"},
		{coupon.Coupon{ExpiresAt: &past, Expired: true, VoidedAt: &past}, "voided"},
		{coupon.Coupon{ExpiresAt: &past, Expired: true, RedeemedAt: &past}, "redeemed"},
	} {
		if got := couponState(c.c); got != c.want {
			t.Errorf("couponState(%+v) = %q, want %q", c.c, got, c.want)
		}
	}
}
