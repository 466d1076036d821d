package main

import (
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestGrantAnswerLostAndNotLookedUp: a member whose request was sent, whose answer was lost
// (the connection cut while the request waits behind a held budget row, pg_blocking_pids) and
// whose coupon could not be looked up either (the database unreachable: the proxy refuses new
// connections) is UNKNOWN in the CSV with no coupon id, counted apart from ERROR in the summary,
// exit 1; the same command run again, once the database answers, settles it: the CSV names the
// coupon the table holds (counted with SQL). Shown red on the broken variant, such a member
// written ERROR (before: a crash's committed coupons were ERROR with no coupon id).
func TestGrantAnswerLostAndNotLookedUp(t *testing.T) {
	checkAndBreak(t, grantUnknownCheck, brokenVariant{"a lost answer not looked up written ERROR", func(t *testing.T) {
		swap(t, &grantedResult, resultWithoutUnknown)
	}})
}

// resultWithoutUnknown is granted.result's broken variant: every error is an ERROR, a lost
// answer that may have committed a coupon among them.
func resultWithoutUnknown(g granted) string {
	if g.err != nil {
		return resultError
	}
	return string(g.out.Result)
}

func grantUnknownCheck(t *testing.T, v *verdict) {
	t.Setenv("ISSUE_BUDGET", "900ms") // the settlement dials until the call's budget is spent
	t.Setenv("ISSUE_STATEMENT_TIMEOUT", "500ms")
	t.Setenv("ISSUE_LOCK_TIMEOUT", "300ms")
	d := newGrantDB(t, campaign.Campaign{ID: "LOST", DiscountYen: 500, BudgetYen: 1_000_000})
	u, err := url.Parse(d.admin)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCutProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	t.Setenv("DATABASE_URL", u.String())
	path, _ := memberFile(t, "u", 1)
	csvPath := filepath.Join(t.TempDir(), "answers.csv")
	hold := pgtest.HoldCampaign(t, d.url, "LOST")
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, stdout, stderr := grantCLI("grant", "--campaign", "LOST", "--members", path, "--out", csvPath, "--concurrency", "1")
		done <- result{code, stdout, stderr}
	}()
	hold.WaitBlocked(1)
	proxy.cut()
	hold.Release()
	r := <-done
	if a := readGrantCSV(t, csvPath)["u00001"]; a.result != "UNKNOWN" || a.couponID != "" {
		v.Errorf("the CSV says %+v for u00001, want UNKNOWN without a coupon id", a)
	}
	if r.code != 1 || summaryCount(t, r.stdout, "UNKNOWN") != 1 || summaryCount(t, r.stdout, "ERROR") != -1 ||
		!strings.Contains(r.stdout, "UNKNOWN: the answer was lost and the coupon could not be looked up") {
		v.Errorf("grant: exit %d, want 1 with UNKNOWN 1 and no ERROR in the summary\n%s%s", r.code, r.stdout, r.stderr)
	}

	d.waitSessionsGone(t) // the cut session has ended, committed or not, before the re-run
	t.Setenv("DATABASE_URL", d.admin)
	if code, stdout, stderr := grantCLI("grant", "--campaign", "LOST", "--members", path, "--out", csvPath); code != 0 {
		v.Errorf("re-run: exit %d, want 0\n%s%s", code, stdout, stderr)
	}
	held := d.coupons(t, "LOST")["u00001"]
	if a := readGrantCSV(t, csvPath)["u00001"]; held == "" || a.couponID != held {
		v.Errorf("after the re-run the CSV says %+v, the table holds coupon %q: want the same coupon", a, held)
	}
}
