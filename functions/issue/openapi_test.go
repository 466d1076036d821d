package issue_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/testkit/apispec"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// TestOpenAPI drives the real IssueCoupon handler on a real PostgreSQL through every answer
// docs/openapi.yaml documents, validates each against the document with kin-openapi, and fails
// on a documented answer it never produced. The service runs on the real clock: campaigns are
// placed relative to now.
func TestOpenAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, 4)
	now := time.Now()
	tomorrow, yesterday, lastWeek := now.Add(24*time.Hour), now.Add(-24*time.Hour), now.Add(-7*24*time.Hour)
	for _, c := range []campaign.Campaign{
		{ID: "OPEN", DiscountYen: 1000, BudgetYen: 1000},
		{ID: "BIG", DiscountYen: 1500, BudgetYen: 10000},
		{ID: "FUTURE", DiscountYen: 1000, BudgetYen: 1000, StartsAt: &tomorrow},
		{ID: "ENDED", DiscountYen: 1000, BudgetYen: 1000, StartsAt: &lastWeek, EndsAt: &yesterday},
		{ID: "HELD", DiscountYen: 500, BudgetYen: 1000},
		{ID: "BROKEN", DiscountYen: 500, BudgetYen: 1000},
		{ID: "PAUSED", DiscountYen: 500, BudgetYen: 1000},
		{ID: "VOID", DiscountYen: 500, BudgetYen: 1000},
		{ID: "VALID", DiscountYen: 500, BudgetYen: 1000, CouponValidDays: 7},
	} {
		if err := campaign.Create(ctx, pool, c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := campaign.Pause(ctx, pool, "PAUSED", "TestOpenAPI"); err != nil {
		t.Fatal(err)
	}
	// REL has released one coupon and releases more in an hour (made before its first release,
	// which campaign_create refuses once passed); AUD issues to its audience only.
	pgtest.AtClock(t, pool, now.Add(-2*time.Hour), func() {
		if _, err := pool.Exec(ctx, `SELECT count(*) FROM campaign_create('REL', 1000, 10000, 1, NULL, NULL, NULL, NULL, 'TestOpenAPI',
  ARRAY[$1::timestamptz - interval '1 hour', $1::timestamptz + interval '1 hour'], '{1,9}', false)`, now); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := pool.Exec(ctx, `
SELECT count(*) FROM campaign_create('AUD', 500, 10000, 1, NULL, NULL, NULL, NULL, 'TestOpenAPI', NULL, NULL, true);
SELECT campaign_audience_change('AUD', '{in}', true, 'TestOpenAPI')`); err != nil {
		t.Fatal(err)
	}
	// A coupon of VOID, voided without reissue: its member's pair answers COUPON_VOIDED.
	svc, err := issuance.New(pool, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := svc.Issue(ctx, "m6", "VOID")
	if err != nil || gone.Result != issuance.ResultIssued {
		t.Fatalf("issue m6 VOID: %+v %v", gone, err)
	}
	if _, err := coupon.Void(ctx, pool, gone.CouponID, "TestOpenAPI", false); err != nil {
		t.Fatal(err)
	}
	h, err := issue.New(issuance.Config{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	spec := apispec.New(t, "/IssueCoupon")
	call := func(h http.Handler, method, contentType, body string) (int, map[string]any, http.Header) {
		t.Helper()
		req := httptest.NewRequest(method, "/", strings.NewReader(body))
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp := spec.Do(t, h, req)
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatalf("%s %q: body is not JSON: %v", method, body, err)
		}
		return resp.StatusCode, v, resp.Header
	}
	ask := func(member, campaignID string) string {
		b, _ := json.Marshal(map[string]string{"member_id": member, "campaign_id": campaignID})
		return string(b)
	}
	dry := func(member, campaignID string) string {
		b, _ := json.Marshal(map[string]any{"member_id": member, "campaign_id": campaignID, "dry_run": true})
		return string(b)
	}

	steps := []struct {
		name, method, contentType, body string
		status                          int
		result, reason                  string
	}{
		{"issued", "POST", "application/json", ask("m1", "OPEN"), 201, "ISSUED", ""},
		{"double tap", "POST", "application/json", ask("m1", "OPEN"), 200, "ALREADY_ISSUED", ""},
		{"budget spent", "POST", "application/json", ask("m2", "OPEN"), 409, "BUDGET_EXCEEDED", ""},
		{"over the cap", "POST", "application/json", ask("m1", "BIG"), 409, "MONTHLY_CAP", ""}, // 1,000 + 1,500 > 2,000 yen
		{"not started", "POST", "application/json", ask("m3", "FUTURE"), 409, "CAMPAIGN_NOT_ACTIVE", "NOT_STARTED"},
		{"ended", "POST", "application/json", ask("m3", "ENDED"), 409, "CAMPAIGN_NOT_ACTIVE", "ENDED"},
		{"paused", "POST", "application/json", ask("m3", "PAUSED"), 409, "CAMPAIGN_NOT_ACTIVE", "PAUSED"},
		{"voided", "POST", "application/json", ask("m6", "VOID"), 409, "COUPON_VOIDED", ""},
		{"with a validity", "POST", "application/json", ask("m6", "VALID"), 201, "ISSUED", ""},
		{"with a validity again", "POST", "application/json", ask("m6", "VALID"), 200, "ALREADY_ISSUED", ""},
		{"unknown", "POST", "application/json; charset=utf-8", ask("m3", "NOPE"), 404, "UNKNOWN_CAMPAIGN", ""},
		{"released", "POST", "application/json", ask("m7", "REL"), 201, "ISSUED", ""},
		{"released taken", "POST", "application/json", ask("m8", "REL"), 409, "BUDGET_EXCEEDED", ""},
		{"outside the audience", "POST", "application/json", ask("out", "AUD"), 403, "NOT_ELIGIBLE", ""},
		{"dry run: available", "POST", "application/json", dry("in", "AUD"), 200, "AVAILABLE", ""},
		{"dry run: held", "POST", "application/json", dry("m1", "OPEN"), 200, "ALREADY_ISSUED", ""},
		{"dry run: budget", "POST", "application/json", dry("m8", "REL"), 200, "BUDGET_EXCEEDED", ""},
		{"dry run: cap", "POST", "application/json", dry("m1", "BIG"), 200, "MONTHLY_CAP", ""},
		{"dry run: not started", "POST", "application/json", dry("m3", "FUTURE"), 200, "CAMPAIGN_NOT_ACTIVE", "NOT_STARTED"},
		{"dry run: voided", "POST", "application/json", dry("m6", "VOID"), 200, "COUPON_VOIDED", ""},
		{"dry run: outside the audience", "POST", "application/json", dry("out", "AUD"), 200, "NOT_ELIGIBLE", ""},
		{"dry run: unknown", "POST", "application/json", dry("m3", "NOPE"), 404, "UNKNOWN_CAMPAIGN", ""},
		{"dry run not a boolean", "POST", "application/json", `{"member_id":"m1","campaign_id":"OPEN","dry_run":"yes"}`, 400, "INVALID_REQUEST", ""},
		{"bad JSON", "POST", "application/json", `{"member_id": "m1",`, 400, "INVALID_REQUEST", ""},
		{"unknown field", "POST", "application/json", `{"member_id":"m1","campaign_id":"OPEN","month":"2026-01"}`, 400, "INVALID_REQUEST", ""},
		{"bad member id", "POST", "application/json", ask("m 1", "OPEN"), 400, "INVALID_REQUEST", ""},
		{"wrong method", "GET", "", "", 405, "INVALID_REQUEST", ""},
		{"body over 4 KiB", "POST", "application/json", `{"member_id":"` + strings.Repeat("x", 5000) + `","campaign_id":"OPEN"}`, 413, "INVALID_REQUEST", ""},
		{"wrong content type", "POST", "text/plain", ask("m1", "OPEN"), 415, "INVALID_REQUEST", ""},
	}
	for _, s := range steps {
		status, body, _ := call(h, s.method, s.contentType, s.body)
		if reason, _ := body["reason"].(string); status != s.status || body["result"] != s.result || reason != s.reason {
			t.Errorf("%s: %d %v, want %d %s %s", s.name, status, body, s.status, s.result, s.reason)
		}
	}

	// The fields that come with the new answers: the next release on REL's BUDGET_EXCEEDED, both
	// it and the remaining coupons on a dry run of REL, which writes nothing.
	if _, body, _ := call(h, "POST", "application/json", ask("m9", "REL")); body["next_release_at"] == nil {
		t.Errorf("REL's BUDGET_EXCEEDED without next_release_at: %v", body)
	}
	var before, after int
	written := `SELECT (SELECT count(*) FROM issued_coupons) + (SELECT sum(issued_yen) FROM campaign_budgets)`
	if err := pool.QueryRow(ctx, written).Scan(&before); err != nil {
		t.Fatal(err)
	}
	_, body, _ := call(h, "POST", "application/json", dry("m9", "REL"))
	if err := pool.QueryRow(ctx, written).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if body["remaining_coupons"] != float64(0) || body["next_release_at"] == nil || after != before {
		t.Errorf("dry run of REL: %v, rows and yen %d then %d; want remaining_coupons 0, next_release_at, nothing written", body, before, after)
	}

	// 415 for a Content-Encoding other than identity, whatever the body.
	gz := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(ask("m1", "OPEN")))
	gz.Header.Set("Content-Type", "application/json")
	gz.Header.Set("Content-Encoding", "gzip")
	if resp := spec.Do(t, h, gz); resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("Content-Encoding gzip: %d, want 415", resp.StatusCode)
	}

	// RETRY_EXHAUSTED: another session holds the campaign's budget row past a short budget.
	short, err := issue.New(issuance.Config{Budget: 900 * time.Millisecond,
		LockTimeout: 100 * time.Millisecond, StatementTimeout: 300 * time.Millisecond}, pool)
	if err != nil {
		t.Fatal(err)
	}
	hold := pgtest.HoldCampaign(t, pool.Config().ConnConfig.ConnString(), "HELD")
	status, body, header := call(short, "POST", "application/json", ask("m4", "HELD"))
	hold.Release()
	if status != 503 || body["result"] != "RETRY_EXHAUSTED" || header.Get("Retry-After") == "" {
		t.Errorf("held row: %d %v Retry-After %q, want 503 RETRY_EXHAUSTED with Retry-After", status, body, header.Get("Retry-After"))
	}

	// INTERNAL_ERROR: a trigger injected by this test makes the coupon insert fail with an error
	// that is no contention (P0001), for campaign BROKEN only.
	if _, err := pool.Exec(ctx, `
CREATE FUNCTION test_refuse_coupon() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'injected by TestOpenAPI'; END $$;
CREATE TRIGGER test_refuse_coupon BEFORE INSERT ON issued_coupons
  FOR EACH ROW WHEN (NEW.campaign_id = 'BROKEN') EXECUTE FUNCTION test_refuse_coupon();`); err != nil {
		t.Fatal(err)
	}
	status, body, _ = call(h, "POST", "application/json", ask("m5", "BROKEN"))
	if status != 500 || body["result"] != "INTERNAL_ERROR" || body["message"] != "internal error" {
		t.Errorf("injected failure: %d %v, want 500 INTERNAL_ERROR with the generic message", status, body)
	}

	if unseen := spec.Unseen(); len(unseen) > 0 {
		t.Errorf("documented answers never produced: %v", unseen)
	}
}
