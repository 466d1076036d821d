package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// inboxRow is what the inbox shows of a request.
type inboxRow struct {
	ID, Campaign, Before, After, Text string
	Forms                             []string
}

// inboxShows is the inbox as ctx's page shows it, and the header's count.
func inboxShows(t *testing.T, e *env, ctx context.Context) ([]inboxRow, string) {
	e.open(t, ctx, "/requests")
	rows := get(t, ctx, chromedp.Evaluate[[]inboxRow](`Array.from(document.querySelectorAll("tr[data-request]")).map(r => ({
  ID: r.dataset.request, Campaign: r.dataset.campaign, Text: r.innerText,
  Before: (r.querySelector("[data-before-yen]") || {dataset: {}}).dataset.beforeYen || "",
  After: (r.querySelector("[data-after-yen]") || {dataset: {}}).dataset.afterYen || "",
  Forms: Array.from(r.querySelectorAll("form[data-action]")).map(f => f.dataset.action)}))`))
	count := get(t, ctx, chromedp.Evaluate[string](`(document.querySelector("header a.inbox") || {dataset: {}}).dataset.pending || ""`))
	return rows, count
}

// approvalsInbox is the inbox check: approver A asks for two raises above the line and a period
// move on three campaigns, and a fourth request lapsed a day ago; approver B's header says
// 承認待ち 3 件 on every page, the inbox lists the three (not the lapsed one), the first to
// lapse first, each with its requester, reason, the budget now and after and the time left, and
// approving one from the inbox applies it (the budget by SQL) and leaves 2. A asks, so A's rows
// offer no form.
func approvalsInbox(t *testing.T, v *verdict, breakIt func(*env)) {
	e := setup(t, verifiedIAP)
	shot := screenshot
	if breakIt != nil { // a broken variant's pages are no pictures of the console
		breakIt(e)
		shot = func(testing.TB, context.Context, string) {}
	}
	for _, c := range []campaign.Campaign{{ID: "RAISE", DiscountYen: 1000, BudgetYen: 100_000},
		{ID: "SET", DiscountYen: 1000, BudgetYen: 200_000}, {ID: "MOVE", DiscountYen: 1000, BudgetYen: 100_000}} {
		e.createCampaign(t, c)
	}
	a := e.poster(t, approverEmail, "/campaigns/RAISE")
	for _, r := range []struct {
		path string
		form url.Values
	}{ // in this order: RAISE's lapses first
		{"/campaigns/RAISE/budget", url.Values{"reason": {"週末の増額（稟議 2026-201）"}, "add_budget_yen": {"150000"}}},
		{"/campaigns/SET/budget", url.Values{"reason": {"年末の予算（稟議 2026-202）"}, "budget_yen": {"500000"}}},
		{"/campaigns/MOVE/period", url.Values{"reason": {"延長"}, "ends": {"2031-01-01T00:00"}}},
	} {
		if status, loc, body := a.post(t, r.path, r.form); status != http.StatusSeeOther || !strings.Contains(loc, "requested") {
			t.Fatalf("%s: %d %q %.300s, want a request", r.path, status, loc, body)
		}
	}
	if _, err := e.owner.Exec(context.Background(), `INSERT INTO campaign_change_request_rows
  (campaign_id, kind, args, requested_by, request_reason, requested_at)
  VALUES ('RAISE', 'budget', '{"add_yen": 1000}', $1, '昨日の申請', now() - interval '25 hours')`, approverEmail); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t)
	ctx := b.as(t, e.idp.assertion(t, approver2Email))
	e.open(t, ctx, "/campaigns/SET")
	if n := get(t, ctx, chromedp.Evaluate[string](`(document.querySelector("header a.inbox") || {textContent: ""}).textContent`)); n != "承認待ち 3 件" {
		v.Errorf("approver B's header on a campaign page reads %q, want 承認待ち 3 件", n)
	}
	rows, count := inboxShows(t, e, ctx)
	shot(t, ctx, "inbox")
	if got := len(rows); got != 3 || count != "3" {
		v.Errorf("the inbox lists %d requests and the header counts %s, want 3 and 3 (the lapsed one not)", got, count)
	}
	want := map[string][2]string{"RAISE": {"100000", "250000"}, "SET": {"200000", "500000"}, "MOVE": {"", ""}}
	for _, r := range rows {
		w, ok := want[r.Campaign]
		if !ok || r.Before != w[0] || r.After != w[1] || !strings.Contains(r.Text, approverEmail) || !strings.Contains(r.Text, "あと 2") ||
			!slices.Equal(r.Forms, []string{"approve", "reject"}) {
			v.Errorf("request #%s of %s: before %q after %q forms %q, want %q, the requester, あと 2x 時間, approve and reject:\n%s",
				r.ID, r.Campaign, r.Before, r.After, r.Forms, w, r.Text)
		}
	}
	if len(rows) > 0 && rows[0].Campaign != "RAISE" {
		v.Errorf("the first request listed is %s's, want RAISE's (the first to lapse)", rows[0].Campaign)
	}
	if i := slices.IndexFunc(rows, func(r inboxRow) bool { return r.Campaign == "RAISE" }); i >= 0 {
		submit(t, ctx, "approve", fmt.Sprintf(`tr[data-request=%q]`, rows[i].ID), map[string]string{"reason": "稟議を確認しました"})
		if n := e.count(t, `SELECT sum(budget_yen) FROM campaign_budgets WHERE campaign_id = 'RAISE'`); n != 250_000 {
			v.Errorf("after approving RAISE's request from the inbox its budget is %d yen, want 250,000", n)
		}
		if rows, count := inboxShows(t, e, ctx); len(rows) != 2 || count != "2" {
			v.Errorf("after one approval the inbox lists %d and counts %s, want 2", len(rows), count)
		}
	}
	do(t, ctx, chromedp.EmulateViewport(390, 844))
	e.open(t, ctx, "/requests")
	shot(t, ctx, "phone-inbox")
	if w := get(t, ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); w > 390 {
		v.Errorf("the inbox at 390 px is %d px wide: it scrolls sideways", w)
	}
	actx := b.as(t, e.idp.assertion(t, approverEmail))
	if rows, _ := inboxShows(t, e, actx); len(rows) > 0 && len(rows[0].Forms) > 0 {
		v.Errorf("approver A, the requester, is offered %q on their own request", rows[0].Forms)
	}
}

// TestApprovalsInbox: the approvals inbox (approvalsInbox). Also run with an inbox that counts
// every undecided request, the lapsed too (its condition broken, a fixture here): found.
func TestApprovalsInbox(t *testing.T) {
	checkAndBreak(t, func(t *testing.T, v *verdict) { approvalsInbox(t, v, nil) },
		brokenVariant{"a lapsed request still waiting", func(t *testing.T, v *verdict) {
			approvalsInbox(t, v, func(e *env) { e.srv.reads.pending = `q.decided_at IS NULL` })
		}})
}
