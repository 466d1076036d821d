package console

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// auditCheck is the audit check: a campaign created with couponctl's functions, paused and a
// coupon of it voided through the console by the operator, a role granted and a rule set; the
// audit page over today lists each of them (a row of each kind), names the operator, and its
// filters by person and by campaign keep exactly the rows SQL counts; the export has the rows
// the page has, with the team's headings.
func auditCheck(t *testing.T, v *verdict, shots bool) {
	ctx := context.Background()
	e := setup(t, verifiedIAP)
	shot := screenshot
	if !shots { // a broken variant's pages are no pictures of the console
		shot = func(testing.TB, context.Context, string) {}
	}
	e.createCampaign(t, campaign.Campaign{ID: "AUD", DiscountYen: 1000, BudgetYen: 100_000})
	e.createCampaign(t, campaign.Campaign{ID: "OTHER", DiscountYen: 1000, BudgetYen: 100_000})
	r, id := e.issueCoupon(t, "m-aud", "AUD")
	if r != "ISSUED" {
		t.Fatalf("IssueCoupon: %s", r)
	}
	op := e.poster(t, operatorEmail, "/campaigns/AUD")
	for path, form := range map[string]map[string][]string{
		"/campaigns/AUD/pause":     {"reason": {"在庫確認"}},
		"/coupons/" + id + "/void": {"reason": {"誤配布"}, "confirm": {"yes"}},
	} {
		if status, _, body := op.post(t, path, form); status != http.StatusSeeOther {
			t.Fatalf("%s: %d %.300s", path, status, body)
		}
	}
	for _, sql := range []string{`SELECT count(*) FROM console_role_set('new@example.co.jp', 'operator', '新任')`,
		`SELECT count(*) FROM coupon_rules_set(3000, NULL, '月の上限を 3,000 円に')`} {
		if _, err := e.owner.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	today := time.Now().In(tokyo).Format(time.DateOnly)
	c := client(t)
	rows := func(query string) []string { // each row's kind/what/person
		_, body := e.do(t, c, http.MethodGet, "/audit?"+query, e.idp.assertion(t, viewerEmail), nil)
		var out []string
		for _, part := range strings.Split(body, `<tr data-kind="`)[1:] {
			kind, rest, _ := strings.Cut(part, `"`)
			_, rest, _ = strings.Cut(rest, `data-what="`)
			what, rest, _ := strings.Cut(rest, `"`)
			_, rest, _ = strings.Cut(rest, `data-person="`)
			person, _, _ := strings.Cut(rest, `"`)
			out = append(out, kind+"/"+what+"/"+person)
		}
		return out
	}
	all := rows("from=" + today + "&to=" + today)
	want := e.count(t, `SELECT (SELECT count(*) FROM campaign_changes) + (SELECT count(*) FROM issued_coupons WHERE voided_at IS NOT NULL)
  + (SELECT count(*) FROM console_role_changes) + (SELECT count(*) FROM coupon_rules_changes) + (SELECT count(*) FROM coupon_changes)`)
	if int64(len(all)) != want {
		v.Errorf("the audit page over today lists %d changes, the tables hold %d: %q", len(all), want, all)
	}
	for _, must := range []string{"campaign/create/", "campaign/pause/" + operatorEmail, "coupon/void/" + operatorEmail, "role/role/", "rules/rules/"} {
		if !strings.Contains(strings.Join(all, " "), must) {
			v.Errorf("the audit page lacks a %s row: %q", must, all)
		}
	}
	if got := rows("person=" + operatorEmail); len(got) != 2 {
		v.Errorf("filtered by %s: %q, want the pause and the void", operatorEmail, got)
	}
	if got, n := rows("campaign=AUD"), e.count(t, `SELECT (SELECT count(*) FROM campaign_changes WHERE campaign_id = 'AUD') + 1`); int64(len(got)) != n {
		v.Errorf("filtered by AUD: %q, want its %d changes and its void", got, n)
	}
	// As a browser shows it, at 1280 and 390 px: every row, no sideways scroll.
	bctx := newBrowser(t).as(t, e.idp.assertion(t, viewerEmail))
	for _, width := range []int64{1280, 390} {
		do(t, bctx, chromedp.EmulateViewport(width, 900))
		e.open(t, bctx, "/audit?from="+today+"&to="+today)
		shot(t, bctx, map[int64]string{1280: "audit-1280", 390: "phone-audit"}[width])
		if n := get(t, bctx, chromedp.Evaluate[int](`document.querySelectorAll("tr[data-kind]").length`)); n != len(all) {
			v.Errorf("the browser shows %d audit rows at %d px, want %d", n, width, len(all))
		}
		if w := get(t, bctx, chromedp.Evaluate[int64](`document.documentElement.scrollWidth`)); w > width {
			v.Errorf("the audit page at %d px is %d px wide", width, w)
		}
	}
	_, body := e.do(t, c, http.MethodGet, "/exports/audit.csv?from="+today+"&to="+today, e.idp.assertion(t, viewerEmail), nil)
	recs := readCSV(t, v, "audit.csv", body)
	if len(recs) != len(all)+1 || strings.Join(recs[0], ",") != strings.Join(auditHeadings, ",") {
		v.Errorf("audit.csv: %d records, headings %q; want %d and %q", len(recs), recs[0], len(all)+1, auditHeadings)
	}
}

// TestAuditPage: the audit page and its export (auditCheck). Also run with an audit that reads
// the campaigns' history alone (a fixture here), missing voids, role grants and rule settings:
// found.
func TestAuditPage(t *testing.T) {
	checkAndBreak(t, func(t *testing.T, v *verdict) { auditCheck(t, v, true) }, brokenVariant{"the campaigns' history alone", func(t *testing.T, v *verdict) {
		saved := sqlAudit
		sqlAudit = `
SELECT c.changed_at, coalesce(c.operator_email, c.changed_by), c.changed_by, 'campaign', c.what, c.campaign_id, c.before, c.after, c.reason
  FROM campaign_changes c
 WHERE ($1 = '' OR coalesce(c.operator_email, c.changed_by) = $1 OR c.changed_by = $1) AND ($2 = '' OR c.campaign_id = $2)
   AND c.changed_at >= $3 AND c.changed_at < $4
 ORDER BY c.changed_at DESC`
		t.Cleanup(func() { sqlAudit = saved })
		auditCheck(t, v, false)
	}})
}
