package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/golang-jwt/jwt/v5"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// The browser tests drive the console in Debian's chromium (chromedp), as the promotion team
// would, on a real PostgreSQL, with IssueCoupon serving load beside it, and judge what happened
// by counting the tables with SQL. Each person browses with an IAP assertion of their own; every
// page's script exceptions and console errors fail the test (newBrowser).

// TestListShowsTheCampaigns: the list shows every campaign, each row with the issued yen the R1
// counter holds, while IssueCoupon issues beside it.
func TestListShowsTheCampaigns(t *testing.T) {
	e := setup(t, verifiedIAP)
	for _, id := range []string{"SW-A", "SW-B", "SW-C"} {
		e.createCampaign(t, campaign.Campaign{ID: id, DiscountYen: 1000, BudgetYen: 300_000, Stripes: 4})
	}
	l := e.startLoad(t, "SW-B", 2)
	l.waitAnswers(t, 20)
	for i := range 5 {
		if r, _ := e.issueCoupon(t, fmt.Sprintf("m%04d", i), "SW-A"); r != "ISSUED" {
			t.Fatalf("IssueCoupon: %s", r)
		}
	}
	l.halt()
	b := newBrowser(t)
	ctx := b.as(t, e.idp.assertion(t, viewerEmail))
	e.open(t, ctx, "/")
	rows := get(t, ctx, chromedp.Evaluate[[][2]string](`Array.from(document.querySelectorAll("tr[data-campaign]")).map(r => [r.dataset.campaign, r.querySelector("[data-issued-yen]").dataset.issuedYen])`))
	var ids []string
	for _, r := range rows {
		ids = append(ids, r[0])
		want := e.count(t, `SELECT coalesce(sum(issued_yen), 0) FROM campaign_budgets WHERE campaign_id = $1`, r[0])
		if r[1] != fmt.Sprint(want) {
			t.Errorf("campaign %s: the list shows %s yen issued, the counter holds %d", r[0], r[1], want)
		}
	}
	if !slices.Equal(ids, []string{"SW-A", "SW-B", "SW-C"}) {
		t.Errorf("the list shows %q, want SW-A, SW-B, SW-C", ids)
	}
	if text := pageText(t, ctx); !strings.Contains(text, "5,000 円") || !strings.Contains(text, "発行中") {
		t.Errorf("the list does not show SW-A's 5,000 円 issued and its state:\n%s", text)
	}
	screenshot(t, ctx, "list")
}

// pauseStops is the pause check: an operator pauses a campaign under load with the pause
// button; once the page says it is paused, no coupon of the campaign commits while the load goes
// on (counted by SQL), and the history names the operator. Resume lets it issue again.
func pauseStops(t *testing.T, v *verdict, breakIt func(*env)) {
	e := setup(t, verifiedIAP)
	breakIt(e)
	e.createCampaign(t, campaign.Campaign{ID: "HOT", DiscountYen: 100, BudgetYen: 100_000_000, Stripes: 4})
	l := e.startLoad(t, "HOT", 4)
	l.waitAnswers(t, 30)

	b := newBrowser(t)
	ctx := b.as(t, e.idp.assertion(t, operatorEmail))
	e.open(t, ctx, "/campaigns/HOT")
	submit(t, ctx, "pause", "", map[string]string{"reason": "在庫の確認のため一時停止"})
	if text := pageText(t, ctx); !strings.Contains(text, "一時停止しました") {
		// A pause that changed nothing says so (done=unchanged): a problem of the pause, not of the test.
		v.Errorf("after the pause button the page does not say it paused: %.300s", text)
		return
	}
	paused := e.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'HOT'`)
	l.waitAnswers(t, 40)
	if after := e.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'HOT'`); after != paused {
		v.Errorf("coupons of HOT: %d when the pause returned, %d after 40 more requests: issuance did not stop", paused, after)
	}
	if n := e.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'HOT' AND what = 'pause' AND operator_email = $1`, operatorEmail); n != 1 {
		v.Errorf("pause rows naming %s in campaign_changes: %d, want 1", operatorEmail, n)
	}
	who := get(t, ctx, chromedp.Evaluate[string](`(document.querySelector('tr[data-what="pause"]') || {dataset: {}}).dataset.person || ""`))
	if who != operatorEmail {
		v.Errorf("the history's pause row names %q, want %s", who, operatorEmail)
	}
	if v.problems != nil {
		return
	}

	submit(t, ctx, "resume", "", map[string]string{"reason": "確認が済んだため再開"})
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if n := e.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'HOT'`); n == paused {
			return fmt.Errorf("no coupon of HOT since the resume")
		}
		return nil
	})
	l.halt()
}

func TestPauseByItsButtonStopsIssuance(t *testing.T) {
	checkAndBreak(t, func(t *testing.T, v *verdict) { pauseStops(t, v, func(*env) {}) },
		brokenVariant{"pause that does not pause", func(t *testing.T, v *verdict) {
			pauseStops(t, v, func(e *env) {
				pgtest.BreakFunction(t, e.owner, "console_pause",
					[2]string{"v_what  text := CASE WHEN p_pause THEN 'pause' ELSE 'resume' END;", "v_what  text := 'resume';"})
			})
		}},
		brokenVariant{"pause without the person", func(t *testing.T, v *verdict) {
			pauseStops(t, v, func(e *env) {
				pgtest.BreakFunction(t, e.owner, "console_pause",
					[2]string{"RETURN QUERY SELECT * FROM operator_changes_mark(v_ids, v_email, NULL);",
						"RETURN QUERY SELECT * FROM campaign_changes c WHERE c.change_id = ANY (v_ids);"})
			})
		}})
}

// raiseAboveTheLine is the four-eyes check: approver A's raise above approval_above_yen (100,000
// yen by default) waits as a pending request, A cannot approve it, an operator sees no approve
// button, approver B approves it and it takes effect; the history names both and both reasons.
func raiseAboveTheLine(t *testing.T, v *verdict, breakIt func(*env)) {
	e := setup(t, verifiedIAP)
	breakIt(e)
	e.createCampaign(t, campaign.Campaign{ID: "RAISE", DiscountYen: 500, BudgetYen: 100_000, Stripes: 2})
	budget := func() int64 {
		return e.count(t, `SELECT sum(budget_yen) FROM campaign_budgets WHERE campaign_id = 'RAISE'`)
	}
	l := e.startLoad(t, "RAISE", 2)
	defer l.halt()

	b := newBrowser(t)
	a := b.as(t, e.idp.assertion(t, approverEmail))
	e.open(t, a, "/campaigns/RAISE")
	submit(t, a, "budget", "", map[string]string{"add_budget_yen": "1000000", "reason": "好評につき増額（稟議 2026-123）"})
	if got := budget(); got != 100_000 {
		v.Errorf("after the raise's request the budget is %d yen, want 100,000 until a second approver approves", got)
		return
	}
	if n := e.count(t, `SELECT count(*) FROM campaign_change_requests WHERE campaign_id = 'RAISE' AND state = 'pending'`); n != 1 {
		v.Errorf("pending requests: %d, want 1", n)
		return
	}
	if text := pageText(t, a); !strings.Contains(text, "承認待ち") {
		v.Errorf("the requester's page does not say the raise waits:\n%s", text)
	}

	if acts := formActions(t, a); slices.Contains(acts, "approve") || slices.Contains(acts, "reject") {
		v.Errorf("the requester sees the forms %q: a different approver decides", acts)
	}
	// The requester's own approval, forged with a valid token: the database refuses it.
	c := client(t)
	_, page := e.do(t, c, http.MethodGet, "/campaigns/RAISE", e.idp.assertion(t, approverEmail), nil)
	rid := e.count(t, `SELECT request_id FROM campaign_change_requests WHERE campaign_id = 'RAISE' AND state = 'pending'`)
	status, body := e.do(t, c, http.MethodPost, fmt.Sprintf("/requests/%d/approve", rid), e.idp.assertion(t, approverEmail),
		url.Values{CSRFField: {csrfToken(t, page)}, "campaign_id": {"RAISE"}, "reason": {"自分で承認"}})
	if status != http.StatusForbidden || !strings.Contains(body, "申請者とは別の承認者が決定します") {
		v.Errorf("the requester's own approval: %d, the page does not show the database's refusal:\n%.600s", status, body)
	}
	if got := budget(); got != 100_000 {
		v.Errorf("the requester approved their own raise: the budget is %d yen", got)
	}

	op := b.as(t, e.idp.assertion(t, operatorEmail))
	e.open(t, op, "/campaigns/RAISE")
	if acts := formActions(t, op); slices.Contains(acts, "approve") || slices.Contains(acts, "reject") {
		v.Errorf("an operator sees the forms %q: approve and reject are an approver's", acts)
	}

	bctx := b.as(t, e.idp.assertion(t, approver2Email))
	e.open(t, bctx, "/campaigns/RAISE")
	submit(t, bctx, "approve", "", map[string]string{"reason": "稟議を確認しました"})
	if got := budget(); got != 1_100_000 {
		v.Errorf("after the second approver's approval the budget is %d yen, want 1,100,000", got)
	}
	if n := e.count(t, `SELECT count(*) FROM campaign_changes c JOIN campaign_change_requests q USING (request_id)
 WHERE c.campaign_id = 'RAISE' AND c.what = 'budget' AND c.operator_email = $1 AND q.requested_by = $2`, approver2Email, approverEmail); n != 1 {
		v.Errorf("history rows of the raise naming the approver %s and the requester %s: %d, want 1", approver2Email, approverEmail, n)
	}
	text := pageText(t, bctx)
	for _, want := range []string{"好評につき増額（稟議 2026-123）", "稟議を確認しました", approverEmail, approver2Email} {
		if !strings.Contains(text, want) {
			v.Errorf("the campaign page does not show %q", want)
		}
	}
}

func TestRaiseAboveTheLineWaitsForASecondApprover(t *testing.T) {
	checkAndBreak(t, func(t *testing.T, v *verdict) { raiseAboveTheLine(t, v, func(*env) {}) },
		brokenVariant{"raise applied without approval", func(t *testing.T, v *verdict) {
			raiseAboveTheLine(t, v, func(e *env) {
				pgtest.BreakFunction(t, e.owner, "console_budget",
					[2]string{"IF coalesce(p_budget_yen - v_budget, p_add_yen, 0) > v_line THEN", "IF false THEN"})
			})
		}})
}

// voidFrees is the void check: an operator voids a member's coupon with reissue allowed; the
// coupon is voided with the operator's email beside the database login, and IssueCoupon then
// issues the member a new coupon of the campaign.
func voidFrees(t *testing.T, v *verdict, breakIt func(*env)) {
	e := setup(t, verifiedIAP)
	breakIt(e)
	e.createCampaign(t, campaign.Campaign{ID: "VOID", DiscountYen: 1000, BudgetYen: 100_000_000})
	l := e.startLoad(t, "VOID", 2)
	defer l.halt()
	r, first := e.issueCoupon(t, "m-void", "VOID")
	if r != "ISSUED" {
		t.Fatalf("IssueCoupon: %s", r)
	}
	b := newBrowser(t)
	ctx := b.as(t, e.idp.assertion(t, operatorEmail))
	e.open(t, ctx, "/members/m-void")
	submit(t, ctx, "void", fmt.Sprintf(`[data-coupon=%q]`, first), map[string]string{"allow_reissue": "on", "reason": "誤配布のため再発行"})
	submit(t, ctx, "void", ".confirm", nil) // the confirmation (TestEndAndVoidAskFirst)
	if text := pageText(t, ctx); !strings.Contains(text, "再発行を受けられます") {
		t.Fatalf("after the void button: %s", text)
	}
	if n := e.count(t, `SELECT count(*) FROM issued_coupons WHERE coupon_id = $1 AND voided_at IS NOT NULL AND reissue_allowed AND voided_by_email = $2`,
		first, operatorEmail); n != 1 {
		v.Errorf("coupon %s voided with reissue by %s: %d rows, want 1", first, operatorEmail, n)
	}
	r, second := e.issueCoupon(t, "m-void", "VOID")
	if r != "ISSUED" || second == first {
		v.Errorf("IssueCoupon after the void with reissue: %s %s, want ISSUED with a new coupon", r, second)
	}
	if n := e.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'VOID' AND member_id = 'm-void' AND voided_at IS NULL`); n != 1 {
		v.Errorf("live coupons of the pair: %d, want 1", n)
	}
}

func TestVoidWithReissueFreesThePair(t *testing.T) {
	checkAndBreak(t, func(t *testing.T, v *verdict) { voidFrees(t, v, func(*env) {}) },
		brokenVariant{"void that ignores the reissue", func(t *testing.T, v *verdict) {
			voidFrees(t, v, func(e *env) {
				pgtest.BreakFunction(t, e.owner, "console_void",
					[2]string{"coupon_void(p_coupon_id, p_reason, p_allow_reissue)", "coupon_void(p_coupon_id, p_reason, false)"})
			})
		}})
}

// TestViewerHasNoButtonsAndItsPostIsRefused: a viewer's pages have no action form, and a POST
// forged with a valid CSRF token and the viewer's valid assertion is refused by the database
// (42501, shown as 403), nothing changed; a POST without a CSRF token is 403 before anything runs.
func TestViewerHasNoButtonsAndItsPostIsRefused(t *testing.T) {
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: "VIEW", DiscountYen: 1000, BudgetYen: 100_000})
	l := e.startLoad(t, "VIEW", 2)
	l.waitAnswers(t, 5)
	l.halt()
	var couponID string
	if err := e.owner.QueryRow(context.Background(), `SELECT coupon_id::text FROM issued_coupons WHERE campaign_id = 'VIEW' LIMIT 1`).Scan(&couponID); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t)
	ctx := b.as(t, e.idp.assertion(t, viewerEmail))
	for _, path := range []string{"/", "/campaigns/VIEW", "/coupons/" + couponID} {
		e.open(t, ctx, path)
		if acts := formActions(t, ctx); len(acts) > 0 {
			t.Errorf("%s: a viewer sees the forms %q", path, acts)
		}
	}

	c := client(t)
	_, page := e.do(t, c, http.MethodGet, "/campaigns/VIEW", e.idp.assertion(t, operatorEmail), nil)
	form := url.Values{CSRFField: {csrfToken(t, page)}, "reason": {"閲覧者による偽造"}}
	status, body := e.do(t, c, http.MethodPost, "/campaigns/VIEW/pause", e.idp.assertion(t, viewerEmail), form)
	if status != http.StatusForbidden || !strings.Contains(body, "権限がありません") {
		t.Errorf("a viewer's forged pause with a valid token: %d %s, want 403 with the database's refusal", status, body)
	}
	status, body = e.do(t, client(t), http.MethodPost, "/campaigns/VIEW/pause", e.idp.assertion(t, operatorEmail),
		url.Values{"reason": {"トークンなし"}})
	if status != http.StatusForbidden || !strings.Contains(body, "このフォームは古いか、このコンソールのページから送られていません") {
		t.Errorf("an operator's POST without a CSRF token: %d %s, want 403 saying the form is stale", status, body)
	}
	if n := e.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'VIEW' AND what <> 'create'`); n != 0 {
		t.Errorf("changes of VIEW besides its creation: %d rows, want none", n)
	}
}

// trustsEmailHeader is the broken console kept as a fixture: it takes the person from IAP's
// unsigned X-Goog-Authenticated-User-Email header instead of verifying the signed assertion,
// so anyone who reaches the service past the proxy (or a proxy misconfigured) is whoever they say.
type trustsEmailHeader struct{}

func (trustsEmailHeader) Identify(r *http.Request) (string, error) {
	email, ok := strings.CutPrefix(r.Header.Get("X-Goog-Authenticated-User-Email"), "accounts.google.com:")
	if !ok || email == "" {
		return "", ErrNoIdentity
	}
	return email, nil
}

// assertionRefused is the identity check: a browser with no assertion, and one with only the
// email header, get 401 and no page; POSTs with a forged assertion (another key, expired, another
// audience or issuer, unsigned, no email) are 401 and change nothing (counted by SQL).
func assertionRefused(t *testing.T, v *verdict, identity identityOf) {
	e := setup(t, identity)
	e.createCampaign(t, campaign.Campaign{ID: "IAP", DiscountYen: 1000, BudgetYen: 100_000})
	b := newBrowser(t)
	for name, ctx := range map[string]context.Context{"no assertion": b.as(t, ""), "email header only": headerOnly(t, b, operatorEmail)} {
		e.open(t, ctx, "/campaigns/IAP")
		if text := pageText(t, ctx); !strings.Contains(text, "401 Unauthorized") {
			v.Errorf("%s: the browser got a page instead of 401: %.200s", name, text)
		}
		if acts := formActions(t, ctx); len(acts) > 0 {
			v.Errorf("%s: the browser sees the forms %q", name, acts)
			submit(t, ctx, "pause", "", map[string]string{"reason": "偽造"})
		}
	}

	other := newIDP(t)
	forged := map[string]string{
		"signed by another key": other.assertion(t, operatorEmail),
		"expired":               e.idp.assertion(t, operatorEmail, func(c jwt.MapClaims) { c["exp"] = c["iat"].(int64) - 3600 }),
		"another audience":      e.idp.assertion(t, operatorEmail, func(c jwt.MapClaims) { c["aud"] = "/projects/1/apps/other" }),
		"another issuer":        e.idp.assertion(t, operatorEmail, func(c jwt.MapClaims) { c["iss"] = "https://accounts.google.com" }),
		"no email":              e.idp.assertion(t, operatorEmail, func(c jwt.MapClaims) { delete(c, "email") }),
		"without iat":           e.idp.assertion(t, operatorEmail, func(c jwt.MapClaims) { delete(c, "iat") }),
		"living 30 years":       e.idp.assertion(t, operatorEmail, func(c jwt.MapClaims) { c["exp"] = time.Now().AddDate(30, 0, 0).Unix() }),
		"living 11 min 1 s":     e.idp.assertion(t, operatorEmail, func(c jwt.MapClaims) { c["exp"] = c["iat"].(int64) + 661 }),
		"unsigned (alg none)":   unsigned(t, operatorEmail),
	}
	c := client(t)
	// An honest request through IAP carries both the assertion and the email header.
	_, page := e.do(t, c, http.MethodGet, "/campaigns/IAP", e.idp.assertion(t, operatorEmail), nil,
		"X-Goog-Authenticated-User-Email", "accounts.google.com:"+operatorEmail)
	token := csrfToken(t, page)
	for name, assertion := range forged {
		status, _ := e.do(t, c, http.MethodPost, "/campaigns/IAP/pause", assertion, url.Values{CSRFField: {token}, "reason": {name}})
		if status != http.StatusUnauthorized {
			v.Errorf("a pause with an assertion %s: %d, want 401", name, status)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, e.console.URL+"/", nil)
	req.Header.Set("X-Goog-Authenticated-User-Email", "accounts.google.com:"+operatorEmail)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		v.Errorf("a GET with the email header alone: %v %v, want 401", resp.Status, err)
	}
	if n := e.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'IAP' AND what <> 'create'`); n != 0 {
		v.Errorf("changes of IAP besides its creation, after forged requests: %d rows, want none", n)
	}
}

// headerOnly is a browser context that sends IAP's unsigned email header for email and no
// assertion.
func headerOnly(t *testing.T, b *browser, email string) context.Context {
	t.Helper()
	ctx := b.as(t, "")
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"X-Goog-Authenticated-User-Email": "accounts.google.com:" + email}}); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// unsigned is an assertion for email with alg "none" and no signature.
func unsigned(t *testing.T, email string) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"iss": IAPIssuer, "aud": testAudience, "email": email,
		"iat": time.Now().Unix(), "exp": time.Now().Add(10 * time.Minute).Unix()})
	s, err := tok.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMissingOrForgedAssertionIs401(t *testing.T) {
	checkAndBreak(t, func(t *testing.T, v *verdict) { assertionRefused(t, v, verifiedIAP) },
		brokenVariant{"trusts the email header", func(t *testing.T, v *verdict) {
			assertionRefused(t, v, func(testing.TB, *idp) Identifier { return trustsEmailHeader{} })
		}},
		brokenVariant{"iat optional, any lifetime (jwt's checks alone)", func(t *testing.T, v *verdict) {
			assertionRefused(t, v, func(t testing.TB, p *idp) Identifier {
				iap := verifiedIAP(t, p).(*IAP)
				iap.lifetime = func(*jwt.NumericDate, *jwt.NumericDate) error { return nil }
				return iap
			})
		}})
}

// TestChartDrawsItsPoints: the campaign page's burn-down draws one point per point of
// burndown.json, the last at the issued yen the coupons sum to.
func TestChartDrawsItsPoints(t *testing.T) {
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: "CHART", DiscountYen: 1000, BudgetYen: 50_000, Stripes: 2})
	l := e.startLoad(t, "CHART", 2)
	l.waitAnswers(t, 30)
	l.halt()
	c := client(t)
	status, body := e.do(t, c, http.MethodGet, "/campaigns/CHART/burndown.json", e.idp.assertion(t, viewerEmail), nil)
	var points []Point
	if err := json.Unmarshal([]byte(body), &points); status != http.StatusOK || err != nil || len(points) < 2 {
		t.Fatalf("burndown.json: %d %v %s", status, err, body)
	}
	issued := e.count(t, `SELECT coalesce(sum(amount_yen), 0) FROM issued_coupons WHERE campaign_id = 'CHART' AND voided_at IS NULL`)
	if last := points[len(points)-1]; last.IssuedYen != issued || last.BudgetYen != 50_000 {
		t.Errorf("burndown.json's last point %+v, want %d yen issued of 50,000", last, issued)
	}

	b := newBrowser(t)
	ctx := b.as(t, e.idp.assertion(t, approverEmail))
	e.open(t, ctx, "/campaigns/CHART")
	drawn := get(t, ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("svg.burndown circle.pt")).map(c => c.dataset.issuedYen)`))
	if len(drawn) != len(points) {
		t.Errorf("the chart draws %d points, burndown.json has %d", len(drawn), len(points))
	}
	if len(drawn) > 0 && drawn[len(drawn)-1] != fmt.Sprint(issued) {
		t.Errorf("the chart's last point is at %s yen, the coupons sum to %d", drawn[len(drawn)-1], issued)
	}
	// Its axes in 円 and 枚 with gridlines, the projection of a campaign issuing, and the table.
	type chartParts struct{ Grid, Yen, Coupons, Projection, Rows int }
	parts := get(t, ctx, chromedp.Evaluate[chartParts](`({Grid: document.querySelectorAll("svg.burndown line.grid").length,
  Yen: Array.from(document.querySelectorAll("svg.burndown text")).filter(l => l.textContent.endsWith(" 円")).length,
  Coupons: Array.from(document.querySelectorAll("svg.burndown text")).filter(l => l.textContent.endsWith(" 枚")).length,
  Projection: document.querySelectorAll("svg.burndown line.projection").length,
  Rows: document.querySelectorAll(".chart-data tr[data-point]").length})`))
	if parts.Grid < 3 || parts.Yen != parts.Grid || parts.Coupons != parts.Grid || parts.Projection != 1 || parts.Rows != len(points) {
		t.Errorf("the chart has %d gridlines, %d 円 and %d 枚 labels, %d projections, a table of %d rows; want 3 or more, one of each a line, 1, %d",
			parts.Grid, parts.Yen, parts.Coupons, parts.Projection, parts.Rows, len(points))
		st, err := campaign.Show(context.Background(), e.owner, "CHART")
		var first, latest time.Time
		if err == nil {
			err = e.owner.QueryRow(context.Background(), `SELECT min(issued_at), max(issued_at) FROM issued_coupons WHERE campaign_id = 'CHART'`).Scan(&first, &latest)
		}
		t.Logf("now: state %s, %d coupons left at %s; coupons issued %s to %s; load's answers %v (%v)",
			st.State, st.RemainingCoupons, st.At, first, latest, l.answers, err)
	}
	if os.Getenv("CONSOLE_SCREENSHOTS") != "" { // the screenshot shows a request waiting for a second approver
		submit(t, ctx, "budget", "", map[string]string{"add_budget_yen": "200000", "reason": "週末の増額（稟議 2026-124）"})
	}
	screenshot(t, ctx, "campaign")
}

// askFirst is the confirmation check: an operator's end of a campaign and void of a coupon each
// show a confirmation page first (data-confirm) and change nothing, counted with SQL; the
// confirmation's own form, the reason and the reissue choice kept, then does it.
func askFirst(t *testing.T, v *verdict, breakIt func(*env)) {
	e := setup(t, verifiedIAP)
	breakIt(e)
	e.createCampaign(t, campaign.Campaign{ID: "ASK", DiscountYen: 1000, BudgetYen: 100_000})
	r, id := e.issueCoupon(t, "m-ask", "ASK")
	if r != "ISSUED" {
		t.Fatalf("IssueCoupon: %s", r)
	}
	b := newBrowser(t)
	ctx := b.as(t, e.idp.assertion(t, operatorEmail))
	ended := func() int64 {
		return e.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'ASK' AND what = 'end'`)
	}
	voided := func() int64 {
		return e.count(t, `SELECT count(*) FROM issued_coupons WHERE coupon_id = $1 AND voided_at IS NOT NULL AND reissue_allowed`, id)
	}
	e.open(t, ctx, "/campaigns/ASK")
	submit(t, ctx, "end", "", map[string]string{"reason": "x"})
	if asked := get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("[data-confirm=end]").length`)); asked != 1 || ended() != 0 {
		v.Errorf("end: the first click showed %d confirmations and ended %d times, want 1 and none", asked, ended())
	}
	if get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("[data-confirm=end] form[data-action=end]").length`)) == 1 {
		submit(t, ctx, "end", ".confirm", nil)
	}
	if n := ended(); n != 1 {
		v.Errorf("end: confirmed, %d end changes, want 1", n)
	}
	e.open(t, ctx, "/coupons/"+id)
	submit(t, ctx, "void", "", map[string]string{"allow_reissue": "on", "reason": "誤配布"})
	if asked := get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("[data-confirm=void]").length`)); asked != 1 || voided() != 0 {
		v.Errorf("void: the first click showed %d confirmations and voided %d coupons, want 1 and none", asked, voided())
	}
	if get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("[data-confirm=void] form[data-action=void]").length`)) == 1 {
		submit(t, ctx, "void", ".confirm", nil)
	}
	if n := voided(); n != 1 {
		v.Errorf("void: confirmed, %d coupons voided with reissue allowed, want 1", n)
	}
	e.open(t, ctx, "/coupons/"+id)
	if push := get(t, ctx, chromedp.Evaluate[string](`document.querySelector("dd.push").innerText`)); !strings.Contains(push, "送信対象外") ||
		!strings.Contains(push, "無効化されたため") || englishWords.MatchString(push) {
		v.Errorf("the voided coupon's push reads %q, want 送信対象外 ... 無効化されたため, no English", push)
	}
}

// TestEndAndVoidAskFirst: ending a campaign and voiding a coupon ask for a confirmation first
// (before: one click with the reason "x" ended a campaign for good). Also run on a console
// whose every form arrives confirmed (a proxy in the test adds confirm=yes): the check finds it.
func TestEndAndVoidAskFirst(t *testing.T) {
	checkAndBreak(t, func(t *testing.T, v *verdict) { askFirst(t, v, func(*env) {}) },
		brokenVariant{"acts at the first click", func(t *testing.T, v *verdict) {
			askFirst(t, v, func(e *env) {
				h := e.console.Config.Handler
				e.console.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Method == http.MethodPost {
						body, _ := io.ReadAll(r.Body)
						body = append(body, "&confirm=yes"...)
						r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
					}
					h.ServeHTTP(w, r)
				})
			})
		}})
}
