package console

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/refusal"
	"github.com/mops/coupon-api/shared/issuance"
)

// poster sends a person's forms as their browser would: with the CSRF token of a page they
// loaded, in their own cookie jar.
type poster struct {
	e     *env
	c     *http.Client
	email string
	token string
}

func (e *env) poster(t *testing.T, email, page string) *poster {
	t.Helper()
	p := &poster{e: e, c: client(t), email: email}
	status, body := e.do(t, p.c, http.MethodGet, page, e.idp.assertion(t, email), nil)
	if status != http.StatusOK {
		t.Fatalf("GET %s as %s: %d %.300s", page, email, status, body)
	}
	p.token = csrfToken(t, body)
	return p
}

// post sends form (with the token) to path and returns the status, the Location and the body.
func (p *poster) post(t *testing.T, path string, form url.Values) (int, string, string) {
	t.Helper()
	form.Set(CSRFField, p.token)
	req, err := http.NewRequest(http.MethodPost, p.e.console.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", p.e.console.URL)
	req.Header.Set(AssertionHeader, p.e.idp.assertion(t, p.email))
	resp, err := p.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Location"), string(body)
}

// changes counts campaign id's changes besides its creation.
func (e *env) changes(t *testing.T, id string) int64 {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = $1 AND what <> 'create'`, id)
}

// TestNothingChangedIsSaidSo: a resume of an active campaign and an add of 0 yen change nothing
// and say so (done=unchanged), writing no history; a resume of an ended campaign is refused
// (409) in Japanese, saying a period change reopens it, as couponctl campaign resume refuses it. Before, each
// answered done=resume or done=budget, "再開しました。"
func TestNothingChangedIsSaidSo(t *testing.T) {
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: "EMPTY", DiscountYen: 1000, BudgetYen: 100_000})
	op := e.poster(t, operatorEmail, "/campaigns/EMPTY")

	status, loc, body := op.post(t, "/campaigns/EMPTY/resume", url.Values{"reason": {"稼働中の再開"}})
	if status != http.StatusSeeOther || !strings.Contains(loc, "done=unchanged") {
		t.Errorf("resume of an active campaign: %d %q %.200s, want 303 to done=unchanged", status, loc, body)
	}
	status, loc, body = op.post(t, "/campaigns/EMPTY/budget", url.Values{"reason": {"0 円"}, "add_budget_yen": {"0"}})
	if status != http.StatusSeeOther || !strings.Contains(loc, "done=unchanged") {
		t.Errorf("add_budget_yen=0: %d %q %.200s, want 303 to done=unchanged", status, loc, body)
	}
	if n := e.changes(t, "EMPTY"); n != 0 {
		t.Errorf("changes of EMPTY after a resume of it active and an add of 0 yen: %d, want none", n)
	}
	_, body = e.do(t, op.c, http.MethodGet, "/campaigns/EMPTY?done=unchanged", e.idp.assertion(t, operatorEmail), nil)
	if !strings.Contains(body, "何も変更していません") {
		t.Errorf("the page after done=unchanged does not say nothing changed")
	}

	if status, loc, _ = op.post(t, "/campaigns/EMPTY/end", url.Values{"reason": {"終了"}, "confirm": {"yes"}}); status != http.StatusSeeOther || !strings.Contains(loc, "done=end") {
		t.Fatalf("end: %d %q, want 303 to done=end", status, loc)
	}
	status, loc, body = op.post(t, "/campaigns/EMPTY/resume", url.Values{"reason": {"終了後の再開"}})
	if want := "に終了しているため、再開はできません。再び配布するには、期間の変更を申請してください。"; status != http.StatusConflict || !strings.Contains(body, want) {
		t.Errorf("resume of an ended campaign: %d %q %.300s, want 409 saying %q", status, loc, body, want)
	}
	if n := e.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'EMPTY' AND what = 'resume'`); n != 0 {
		t.Errorf("resume rows of EMPTY: %d, want none", n)
	}
}

// TestBadInputIsRefusedAt400: budgets outside couponctl's ranges, reasons that are not valid
// UTF-8, too long or with no visible character are refused with 400 and a Japanese message
// before the database is asked (no request, no change); a malformed coupon id's void is 404.
// Before, the huge add became a request whose approval failed 500, the bad UTF-8 failed 500 and
// the void of "zzz" failed 500.
func TestBadInputIsRefusedAt400(t *testing.T) {
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: "INPUT", DiscountYen: 1000, BudgetYen: 100_000})
	op := e.poster(t, operatorEmail, "/campaigns/INPUT")
	for name, tc := range map[string]struct {
		form url.Values
		want string
	}{
		"add beyond int4":     {url.Values{"reason": {"増額"}, "add_budget_yen": {"9223372036854775807"}}, "2,147,483,647 円まで"},
		"add just beyond":     {url.Values{"reason": {"増額"}, "add_budget_yen": {"2147483648"}}, "2,147,483,647 円まで"},
		"cut beyond":          {url.Values{"reason": {"減額"}, "add_budget_yen": {"-2147483648"}}, "2,147,483,647 円まで"},
		"negative budget":     {url.Values{"reason": {"予算"}, "budget_yen": {"-5"}}, "新しい予算: 1 円から 2,147,483,647 円まで"},
		"invalid UTF-8":       {url.Values{"reason": {"\xff\xfe"}, "add_budget_yen": {"1000"}}, "UTF-8"},
		"reason too long":     {url.Values{"reason": {strings.Repeat("長", 1001)}, "add_budget_yen": {"1000"}}, "1000 文字"},
		"zero-width space":    {url.Values{"reason": {"\u200b"}, "add_budget_yen": {"1000"}}, "理由を入力してください"},
		"spaces and a ZWSP":   {url.Values{"reason": {" \u3000\u200b\u200d "}, "add_budget_yen": {"1000"}}, "理由を入力してください"},
		"reason of 1000 ok?":  {url.Values{"reason": {strings.Repeat("長", 1000)}, "add_budget_yen": {"x"}}, "整数"},
		"commas not grouping": {url.Values{"reason": {"増額"}, "add_budget_yen": {"1,00,0"}}, "整数"},
		"a leading comma":     {url.Values{"reason": {"増額"}, "add_budget_yen": {",500"}}, "整数"},
		"a space inside":      {url.Values{"reason": {"増額"}, "add_budget_yen": {"5 00"}}, "整数"},
		"円 twice":             {url.Values{"reason": {"増額"}, "add_budget_yen": {"500円円"}}, "整数"},
	} {
		status, _, body := op.post(t, "/campaigns/INPUT/budget", tc.form)
		if status != http.StatusBadRequest || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %.300s, want 400 saying %q", name, status, body, tc.want)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM campaign_change_requests WHERE campaign_id = 'INPUT'`); n != 0 {
		t.Errorf("requests of INPUT after refused input: %d, want none", n)
	}
	if n := e.changes(t, "INPUT"); n != 0 {
		t.Errorf("changes of INPUT after refused input: %d, want none", n)
	}
	// As the team types amounts: full-width digits, commas, 円, a full-width or a typographic minus.
	for _, typed := range []string{"１，０００円", "2,000 円", "－５００", "\u2212500円"} {
		status, _, body := op.post(t, "/campaigns/INPUT/budget", url.Values{"reason": {"入力 " + typed}, "add_budget_yen": {typed}})
		if status != http.StatusSeeOther {
			t.Errorf("add_budget_yen=%q: %d %.300s, want 303", typed, status, body)
		}
	}
	if n := e.count(t, `SELECT sum(budget_yen) FROM campaign_budgets WHERE campaign_id = 'INPUT'`); n != 102_000 {
		t.Errorf("INPUT's budget after +1,000, +2,000, -500 and -500 typed as the team types them: %d yen, want 102,000", n)
	}
	status, _, body := op.post(t, "/campaigns/INPUT/budget", url.Values{"reason": {"上限まで"}, "add_budget_yen": {"2147483647"}})
	if status != http.StatusSeeOther {
		t.Errorf("add_budget_yen=2147483647 (the top of the range): %d %.300s, want 303 (a request)", status, body)
	}
	status, _, body = op.post(t, "/coupons/zzz/void", url.Values{"reason": {"不正な ID"}})
	if status != http.StatusNotFound || !strings.Contains(body, "クーポン zzz はありません") {
		t.Errorf("void of coupon zzz: %d %.300s, want 404 as GET /coupons/zzz", status, body)
	}
}

// TestLargeAmountsPrintAsYen: amounts of a million yen and more in the requests and the history
// print as grouped yen (12,345,678 円), never in exponent form (1.2345678e+07).
func TestLargeAmountsPrintAsYen(t *testing.T) {
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: "BIG", DiscountYen: 1000, BudgetYen: 12_345_678})
	op := e.poster(t, operatorEmail, "/campaigns/BIG")
	if status, _, body := op.post(t, "/campaigns/BIG/budget", url.Values{"reason": {"減額"}, "budget_yen": {"10000000"}}); status != http.StatusSeeOther {
		t.Fatalf("cut to 10,000,000: %d %.300s", status, body)
	}
	if status, loc, body := op.post(t, "/campaigns/BIG/budget", url.Values{"reason": {"増額"}, "add_budget_yen": {"2500000"}}); status != http.StatusSeeOther || !strings.Contains(loc, "requested") {
		t.Fatalf("raise of 2,500,000: %d %q %.300s, want a request", status, loc, body)
	}
	_, body := e.do(t, op.c, http.MethodGet, "/campaigns/BIG", e.idp.assertion(t, operatorEmail), nil)
	for _, want := range []string{"予算: 12,345,678 円", "予算: 10,000,000 円", "増減額: 2,500,000 円"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page of BIG does not show %q", want)
		}
	}
	if strings.Contains(body, "e+0") {
		t.Errorf("the page of BIG shows an amount in exponent form: %s", body[strings.Index(body, "e+0")-30:][:60])
	}
}

// TestOperatorConsoleAnswersOnlyLoopbackNames: an --operator console (every request is the
// operator's) refuses, 421, a request whose Host is another name (DNS rebinding: evil.example
// resolved to 127.0.0.1, with its own Origin), and changes nothing; loopback names are served.
func TestOperatorConsoleAnswersOnlyLoopbackNames(t *testing.T) {
	e := setup(t, func(testing.TB, *idp) Identifier { return Operator(operatorEmail) })
	e.createCampaign(t, campaign.Campaign{ID: "REBIND", DiscountYen: 1000, BudgetYen: 100_000})
	u, err := url.Parse(e.console.URL)
	if err != nil {
		t.Fatal(err)
	}
	port := u.Port()
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port, "LOCALHOST"} {
		if status, body := e.do(t, client(t), http.MethodGet, "/", "", nil, "Host", host); status != http.StatusOK {
			t.Errorf("GET / with Host %s: %d %.200s, want 200", host, status, body)
		}
	}
	evil := "evil.example:" + port
	c := client(t)
	if page := e.rebound(t, c, evil); page != "" {
		t.Errorf("GET with Host %s: a page, want 421", evil)
	}
	// The attacker's page reads its own token (same origin after the rebinding) and posts; where
	// its page is refused, it is given a token of a loopback page (still refused).
	c = client(t)
	page := e.rebound(t, c, evil)
	if page == "" {
		_, page = e.do(t, c, http.MethodGet, "/campaigns/REBIND", "", nil)
	}
	form := url.Values{CSRFField: {csrfToken(t, page)}, "reason": {"rebinding"}}
	req, _ := http.NewRequest(http.MethodPost, e.console.URL+"/campaigns/REBIND/pause", strings.NewReader(form.Encode()))
	req.Host = evil
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://"+evil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("POST pause with Host and Origin %s: %d, want 421", evil, resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var paused bool
	if err := e.owner.QueryRow(ctx, `SELECT paused_at IS NOT NULL FROM campaign_budgets WHERE campaign_id = 'REBIND' AND stripe = 0`).Scan(&paused); err != nil {
		t.Fatal(err)
	}
	if paused || e.changes(t, "REBIND") != 0 {
		t.Errorf("REBIND after a rebinding pause: paused %v, %d changes; want neither", paused, e.changes(t, "REBIND"))
	}
}

// rebound GETs /campaigns/REBIND with Host host, as a browser whose name host was rebound to the
// console's address sends it, and returns the page, or "" when it is refused with 421.
func (e *env) rebound(t *testing.T, c *http.Client, host string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.console.URL+"/campaigns/REBIND", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	switch resp.StatusCode {
	case http.StatusMisdirectedRequest:
		return ""
	case http.StatusOK:
		return string(page)
	}
	t.Fatalf("GET with Host %s: %d %.200s, want 200 or 421", host, resp.StatusCode, page)
	return ""
}

// TestGrantErrorIsInternal: a privilege the console's database login lacks (42501 raised by
// PostgreSQL, not by the role check) is an internal error, 500, not the person's refusal; a
// viewer's pause, refused by the role check (operator_require), stays 403 権限がありません.
func TestGrantErrorIsInternal(t *testing.T) {
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: "GRANT", DiscountYen: 1000, BudgetYen: 100_000})
	viewer := e.poster(t, operatorEmail, "/campaigns/GRANT") // a viewer's page has no form: an operator's token
	viewer.email = viewerEmail
	status, _, body := viewer.post(t, "/campaigns/GRANT/pause", url.Values{"reason": {"閲覧者"}})
	if status != http.StatusForbidden || !strings.Contains(body, "権限がありません") {
		t.Errorf("a viewer's pause: %d %.300s, want 403 権限がありません", status, body)
	}
	if _, err := e.owner.Exec(context.Background(), `REVOKE SELECT ON campaign_change_requests FROM coupon_console`); err != nil {
		t.Fatal(err)
	}
	status, body = e.do(t, client(t), http.MethodGet, "/campaigns/GRANT", e.idp.assertion(t, operatorEmail), nil)
	if status != http.StatusInternalServerError || strings.Contains(body, "権限がありません") {
		t.Errorf("the campaign page without SELECT on campaign_change_requests: %d %.300s, want 500, not 権限がありません", status, body)
	}
}

// TestUnknownPathsAndTheRequesterAreAnsweredAsAPage: a path the console does not serve, and the
// static directory, are 404 on the Japanese error page (no English plain text, no file
// listing); the history names a campaign's creation 作成; the requester of a pending raise is
// shown no approve or reject form (the database would refuse their decision), another approver
// is.
func TestUnknownPathsAndTheRequesterAreAnsweredAsAPage(t *testing.T) {
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: "PAGES", DiscountYen: 1000, BudgetYen: 100_000})
	c := client(t)
	for _, path := range []string{"/nothing", "/campaigns/PAGES/extra/path", "/static/"} {
		status, body := e.do(t, c, http.MethodGet, path, e.idp.assertion(t, viewerEmail), nil)
		if status != http.StatusNotFound || !strings.Contains(body, "このページはありません") || strings.Contains(body, `<a href="style.css">`) {
			t.Errorf("GET %s: %d %.300s, want 404 on the error page, no listing", path, status, body)
		}
	}
	if status, _ := e.do(t, c, http.MethodGet, "/static/style.css", e.idp.assertion(t, viewerEmail), nil); status != http.StatusOK {
		t.Errorf("GET /static/style.css: %d, want 200", status)
	}
	_, body := e.do(t, c, http.MethodGet, "/campaigns/PAGES", e.idp.assertion(t, viewerEmail), nil)
	if !strings.Contains(body, `data-what="create"`) || !strings.Contains(body, `<td data-label="変更">作成</td>`) || strings.Contains(body, `>create</td>`) {
		t.Errorf("the history does not name the creation 作成")
	}

	requester := e.poster(t, approverEmail, "/campaigns/PAGES")
	if status, loc, body := requester.post(t, "/campaigns/PAGES/budget", url.Values{"reason": {"増額"}, "add_budget_yen": {"500000"}}); status != http.StatusSeeOther || !strings.Contains(loc, "requested") {
		t.Fatalf("raise of 500,000: %d %q %.300s, want a request", status, loc, body)
	}
	for email, want := range map[string]bool{approverEmail: false, approver2Email: true} {
		_, body := e.do(t, client(t), http.MethodGet, "/campaigns/PAGES", e.idp.assertion(t, email), nil)
		if got := strings.Contains(body, `data-action="approve"`) && strings.Contains(body, `data-action="reject"`); got != want {
			t.Errorf("%s sees the approve and reject forms: %v, want %v", email, got, want)
		}
	}
}

// TestPeriodMoveIsARequest: the period form (datetime-local, read in Asia/Tokyo) always makes a
// pending request, the campaign's period unchanged; another approver's approval moves it to the
// instants the form named at +09:00.
func TestPeriodMoveIsARequest(t *testing.T) {
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: "PERIOD", DiscountYen: 1000, BudgetYen: 100_000})
	op := e.poster(t, operatorEmail, "/campaigns/PERIOD")
	_, page := e.do(t, op.c, http.MethodGet, "/campaigns/PERIOD", e.idp.assertion(t, operatorEmail), nil)
	if !strings.Contains(page, `data-action="period"`) {
		t.Fatal("the operator's campaign page has no period form")
	}
	if status, _, body := op.post(t, "/campaigns/PERIOD/period", url.Values{"reason": {"期間"}, "starts": {"2027-01-01"}}); status != http.StatusBadRequest {
		t.Errorf("a date without a time: %d %.200s, want 400", status, body)
	}
	status, loc, body := op.post(t, "/campaigns/PERIOD/period", url.Values{"reason": {"会期延長（稟議 2027-1）"},
		"starts": {"2027-01-01T10:00"}, "ends": {"2027-02-01T10:00:30"}})
	if status != http.StatusSeeOther || !strings.Contains(loc, "done=requested_period") {
		t.Fatalf("period: %d %q %.300s, want 303 to done=requested_period", status, loc, body)
	}
	rid := e.count(t, `SELECT request_id FROM campaign_change_requests WHERE campaign_id = 'PERIOD' AND kind = 'period' AND state = 'pending'
 AND (args->>'starts_at')::timestamptz = '2027-01-01T01:00:00Z' AND (args->>'ends_at')::timestamptz = '2027-02-01T01:00:30Z'`)
	if rid == 0 {
		t.Fatal("no pending period request for 2027-01-01T10:00+09:00 to 2027-02-01T10:00:30+09:00")
	}
	if n := e.changes(t, "PERIOD"); n != 0 {
		t.Errorf("changes of PERIOD before the approval: %d, want none", n)
	}
	ap := e.poster(t, approver2Email, "/campaigns/PERIOD")
	if status, _, body := ap.post(t, "/requests/"+strconv.FormatInt(rid, 10)+"/approve", url.Values{"reason": {"確認"}, "campaign_id": {"PERIOD"}}); status != http.StatusSeeOther {
		t.Fatalf("approve: %d %.300s", status, body)
	}
	if n := e.count(t, `SELECT count(*) FROM campaign_budgets WHERE campaign_id = 'PERIOD'
 AND starts_at = '2027-01-01T01:00:00Z' AND ends_at = '2027-02-01T01:00:30Z'`); n == 0 {
		t.Errorf("after the approval the period of PERIOD is not 2027-01-01T10:00+09:00 to 2027-02-01T10:00:30+09:00")
	}
}

// englishWords finds a run of three English words: a sentence the page should have said in
// Japanese (a command in <code> aside).
var englishWords = regexp.MustCompile(`[A-Za-z]{2,}[ ,:]+[A-Za-z]{2,}[ ,:]+[A-Za-z]{2,}`)

// refusedInJapanese is the check of the database's refusals as the pages show them: each change
// the database refuses through the console (an end before the start, a pause of an ended
// campaign, a budget below the issued yen, a period ending before it starts, a viewer's pause)
// is said in Japanese with its facts (the times as the team reads them), no English sentence.
func refusedInJapanese(t *testing.T, v *verdict) {
	e := setup(t, verifiedIAP)
	soon := time.Now().Add(48 * time.Hour)
	e.createCampaign(t, campaign.Campaign{ID: "SOON", DiscountYen: 1000, BudgetYen: 100_000, StartsAt: &soon})
	e.createCampaign(t, campaign.Campaign{ID: "DONE", DiscountYen: 1000, BudgetYen: 100_000})
	e.createCampaign(t, campaign.Campaign{ID: "USED", DiscountYen: 1000, BudgetYen: 100_000})
	if _, err := campaign.End(context.Background(), e.owner, "DONE", "終了"); err != nil {
		t.Fatal(err)
	}
	if r, _ := e.issueCoupon(t, "m1", "USED"); r != "ISSUED" {
		t.Fatalf("IssueCoupon: %s", r)
	}
	op := e.poster(t, operatorEmail, "/campaigns/USED")
	viewer := *op // a viewer's page has no form: an operator's token
	viewer.email = viewerEmail
	for _, c := range []struct {
		who        *poster
		path       string
		form       url.Values
		want, fact string
	}{
		{op, "/campaigns/SOON/end", url.Values{"reason": {"中止"}, "confirm": {"yes"}}, "はまだ始まっていません", tokyoTime(soon)},
		{op, "/campaigns/DONE/pause", url.Values{"reason": {"停止"}}, "終了しているため、一時停止はできません", "期間の変更を申請"},
		{op, "/campaigns/USED/budget", url.Values{"reason": {"減額"}, "budget_yen": {"500"}}, "発行済みの 1,000 円を下回ります", "予算 500 円"},
		{op, "/campaigns/USED/period", url.Values{"reason": {"期間"}, "starts": {"2027-01-02T10:00"}, "ends": {"2027-01-01T10:00"}}, "より前ではありません", "2027/01/02（土）10:00"},
		{&viewer, "/campaigns/USED/pause", url.Values{"reason": {"停止"}}, "役割は閲覧者です", "オペレーターの役割が必要です"},
	} {
		status, _, body := c.who.post(t, c.path, c.form)
		msg := errorText(body)
		if status < 400 || !strings.Contains(msg, c.want) || !strings.Contains(msg, c.fact) || englishWords.MatchString(msg) {
			v.Errorf("%s: %d %q, want a refusal saying %q and %q, no English", c.path, status, msg, c.want, c.fact)
		}
	}
}

// errorText is the text of a page's error message (class "error"), "" without one.
func errorText(body string) string {
	_, rest, ok := strings.Cut(body, `class="error" role="alert">`)
	if !ok {
		return ""
	}
	msg, _, _ := strings.Cut(rest, "</p>")
	return html.UnescapeString(msg)
}

// TestRefusalsInJapanese: the database's refusals are said in the team's words (refusals_ja.go).
// Before, the pages showed the database's English ("campaign DONE has ended, at ...: a pause does
// not reopen it; move its end first (couponctl campaign update DONE --ends T ...)"); kept as the
// broken variant.
func TestRefusalsInJapanese(t *testing.T) {
	checkAndBreak(t, refusedInJapanese, brokenVariant{"the database's English as it is", func(t *testing.T, v *verdict) {
		saved := sayRefusal
		sayRefusal = func(msg string) (string, bool) { return refusal.TokyoTimes(msg), true }
		t.Cleanup(func() { sayRefusal = saved })
		refusedInJapanese(t, v)
	}})
}

// historyWords is the check of the history in the team's words: a campaign created with two
// releases and given a budget change shows, in its history, the releases' instants as the team
// reads a time (2026/12/09（水）10:00, Asia/Tokyo), the keys in Japanese, no Go map syntax, no
// raw key, no UTC instant; the stripes only in the 詳細 section.
func historyWords(t *testing.T, v *verdict) {
	e := setup(t, verifiedIAP)
	first := time.Date(2030, 12, 9, 10, 0, 0, 0, issuance.Tokyo)
	e.createCampaign(t, campaign.Campaign{ID: "HIST", DiscountYen: 1000, BudgetYen: 100_000,
		Releases: []campaign.Release{{At: first, Coupons: 50}, {At: first.AddDate(0, 0, 1), Coupons: 50}}})
	op := e.poster(t, operatorEmail, "/campaigns/HIST")
	if status, _, body := op.post(t, "/campaigns/HIST/budget", url.Values{"reason": {"増額"}, "add_budget_yen": {"5000"}}); status != http.StatusSeeOther {
		t.Fatalf("raise: %d %.300s", status, body)
	}
	if _, err := campaign.Update(context.Background(), e.owner, "HIST", campaign.Changes{
		Releases: []campaign.Release{{At: first.AddDate(0, 0, 2), Coupons: 5}}, Reason: "追加の配布"}); err != nil {
		t.Fatal(err)
	}
	_, body := e.do(t, op.c, http.MethodGet, "/campaigns/HIST", e.idp.assertion(t, operatorEmail), nil)
	_, history, _ := strings.Cut(body, `<section class="history">`)
	shown, _, _ := strings.Cut(history, "<details>")
	for _, want := range []string{"2030/12/09（月）10:00", "2030/12/10（火）10:00", "枚数: 50 枚", "予算: 105,000 円",
		`data-label="変更">配布予定<`, "2030/12/11（水）10:00"} {
		if !strings.Contains(history, want) {
			v.Errorf("the history lacks %q", want)
		}
	}
	for _, bad := range []string{"map[", "_yen=", "T01:00:00", "+00:00", "releases=", "stripes", ">release<"} {
		if strings.Contains(shown, bad) {
			v.Errorf("the history shows %q: %.300s", bad, shown[strings.Index(shown, bad)-min(strings.Index(shown, bad), 100):])
		}
	}
	if !strings.Contains(history, "予算ストライプ数: 1") {
		v.Errorf("the history's 詳細 lacks the stripes")
	}
}

// TestHistoryInTheTeamsWords: the history in the team's words (historyWords). Before, it
// printed releases=[map[at:2026-12-09T01:00:00+00:00 ...]]. Also run with the console's
// time zone UTC (the broken variant of a history printed in UTC): the check finds it.
func TestHistoryInTheTeamsWords(t *testing.T) {
	checkAndBreak(t, historyWords, brokenVariant{"a history printed in UTC", func(t *testing.T, v *verdict) {
		saved := tokyo
		tokyo = time.UTC
		t.Cleanup(func() { tokyo = saved })
		historyWords(t, v)
	}})
}

// TestRefusedFormKeepsWhatWasTyped: a change the database refuses (a budget below the issued
// yen, 409) and one refused before it is asked (an amount that is not a number, 400) show the
// campaign page again with the refusal in Japanese and the form as it was typed, so that the
// person corrects it rather than typing it again. Before, the refusal was an error page with a
// link back, and the form came back empty (shown red on cb2dbc7's console, 2026-12-07).
func TestRefusedFormKeepsWhatWasTyped(t *testing.T) {
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: "TYPED", DiscountYen: 1000, BudgetYen: 100_000})
	if r, _ := e.issueCoupon(t, "m1", "TYPED"); r != "ISSUED" {
		t.Fatalf("IssueCoupon: %s", r)
	}
	op := e.poster(t, operatorEmail, "/campaigns/TYPED")
	for _, c := range []struct {
		form       url.Values
		status     int
		said, kept string
	}{
		{url.Values{"reason": {"年末の減額（稟議 2026-301）"}, "budget_yen": {"500"}}, http.StatusConflict, "発行済みの 1,000 円を下回ります", `name="budget_yen" inputmode="numeric" value="500"`},
		{url.Values{"reason": {"年末の増額（稟議 2026-302）"}, "add_budget_yen": {"五千"}}, http.StatusBadRequest, "整数（円）を入力してください", `name="add_budget_yen" inputmode="numeric" value="五千"`},
	} {
		status, _, body := op.post(t, "/campaigns/TYPED/budget", c.form)
		if status != c.status || !strings.Contains(errorText(body), c.said) || !strings.Contains(body, c.kept) ||
			!strings.Contains(body, `value="`+c.form.Get("reason")+`"`) || !strings.Contains(body, `data-action="budget"`) {
			t.Errorf("%v: %d, error %q; want %d saying %q with the budget form as typed (%s and the reason)", c.form, status, errorText(body), c.status, c.said, c.kept)
		}
	}
	if n := e.changes(t, "TYPED"); n != 0 {
		t.Errorf("%d changes of TYPED after two refused forms, want none", n)
	}
}
