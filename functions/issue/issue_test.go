package issue

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var now = time.Date(2026, 9, 20, 10, 0, 0, 0, issuance.Tokyo)

// newTestHandler returns a Handler with cfg on a fresh database (and its pool) with campaigns:
// OPEN (1,000 yen, budget 1,000 yen), BIG (1,500 yen, budget 10,000 yen), FUTURE (not started).
func newTestHandler(t *testing.T, cfg issuance.Config) (*Handler, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t, 4)
	later := now.Add(24 * time.Hour)
	for _, c := range []campaign.Campaign{
		{ID: "OPEN", DiscountYen: 1000, BudgetYen: 1000},
		{ID: "BIG", DiscountYen: 1500, BudgetYen: 10000},
		{ID: "FUTURE", DiscountYen: 1000, BudgetYen: 1000, StartsAt: &later},
	} {
		if err := campaign.Create(ctx, pool, c); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.SetClock(t, pool, now)
	h, err := newHandler(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h, pool
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
}

func post(t *testing.T, h http.Handler, method, contentType, body string) answer {
	t.Helper()
	req := httptest.NewRequest(method, "/", strings.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	a := answer{status: rec.Code, header: rec.Header()}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s %q: Content-Type %q, want JSON", method, body, ct)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &a.body); err != nil {
		t.Fatalf("%s %q: body %q is not JSON: %v", method, body, rec.Body.String(), err)
	}
	if _, ok := a.body["result"]; !ok {
		t.Fatalf("%s %q: body %q has no result", method, body, rec.Body.String())
	}
	return a
}

func ask(member, campaignID string) string {
	b, _ := json.Marshal(map[string]string{"member_id": member, "campaign_id": campaignID})
	return string(b)
}

// TestResultTable walks every row of docs/api.md's result table through the handler.
func TestResultTable(t *testing.T) {
	t.Parallel()
	h, _ := newTestHandler(t, issuance.Config{})
	steps := []struct {
		name, member, campaign string
		status                 int
		result                 string
	}{
		{"issued", "m1", "OPEN", 201, "ISSUED"},
		{"double tap", "m1", "OPEN", 200, "ALREADY_ISSUED"},
		{"budget spent", "m2", "OPEN", 409, "BUDGET_EXCEEDED"},
		{"over the cap", "m1", "BIG", 409, "MONTHLY_CAP"}, // 1,000 + 1,500 > 2,000 yen
		{"other member", "m3", "BIG", 201, "ISSUED"},
		{"not started", "m3", "FUTURE", 409, "CAMPAIGN_NOT_ACTIVE"},
		{"unknown", "m3", "NOPE", 404, "UNKNOWN_CAMPAIGN"},
	}
	var couponID string
	for _, s := range steps {
		a := post(t, h, http.MethodPost, "application/json", ask(s.member, s.campaign))
		if a.status != s.status || a.body["result"] != s.result {
			t.Fatalf("%s: %d %v, want %d %s", s.name, a.status, a.body, s.status, s.result)
		}
		// A missing coupon_id must not compare equal to another missing one: compare strings.
		id, _ := a.body["coupon_id"].(string)
		switch s.name {
		case "issued":
			couponID = id
			if uuid.Validate(id) != nil || a.body["amount_yen"] != 1000.0 || a.body["month"] != "2026-09" {
				t.Errorf("ISSUED body %v: want a UUID coupon_id, amount_yen 1000, month 2026-09", a.body)
			}
		case "double tap":
			if id == "" || id != couponID {
				t.Errorf("ALREADY_ISSUED coupon_id %q, want the issued coupon %q", id, couponID)
			}
		}
	}
}

// TestRetryExhausted: with the campaign row held by another session past the budget, the answer
// is 503 RETRY_EXHAUSTED with Retry-After.
func TestRetryExhausted(t *testing.T) {
	t.Parallel()
	h, pool := newTestHandler(t, issuance.Config{Budget: 900 * time.Millisecond,
		LockTimeout: 100 * time.Millisecond, StatementTimeout: 300 * time.Millisecond})
	pgtest.HoldCampaign(t, pool.Config().ConnConfig.ConnString(), "BIG") // released when t ends
	a := post(t, h, http.MethodPost, "application/json", ask("m1", "BIG"))
	if a.status != http.StatusServiceUnavailable || a.body["result"] != "RETRY_EXHAUSTED" || a.header.Get("Retry-After") == "" {
		t.Fatalf("%d %v Retry-After %q, want 503 RETRY_EXHAUSTED with Retry-After", a.status, a.body, a.header.Get("Retry-After"))
	}
}

// TestBadInput: every kind of bad request gets its status, INVALID_REQUEST and a message, and
// writes nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	h, pool := newTestHandler(t, issuance.Config{})
	long := strings.Repeat("m", 129)
	cases := []struct {
		name, method, contentType, body string
		status                          int
	}{
		{"bad JSON", "POST", "application/json", `{"member_id": "m1",`, 400},
		{"not an object", "POST", "application/json", `["m1", "OPEN"]`, 400},
		{"empty body", "POST", "application/json", ``, 400},
		{"unknown field", "POST", "application/json", `{"member_id":"m1","campaign_id":"OPEN","month":"2026-01"}`, 400},
		{"duplicate key", "POST", "application/json", `{"member_id":"m1","campaign_id":"OPEN","member_id":"m2"}`, 400},
		{"trailing data", "POST", "application/json", `{"member_id":"m1","campaign_id":"OPEN"} {}`, 400},
		{"wrong type", "POST", "application/json", `{"member_id":1,"campaign_id":"OPEN"}`, 400},
		{"missing field", "POST", "application/json", `{"member_id":"m1"}`, 400},
		{"member id too long", "POST", "application/json", ask(long, "OPEN"), 400},
		{"empty member id", "POST", "application/json", ask("", "OPEN"), 400},
		{"non-ASCII member id", "POST", "application/json", ask("会員1", "OPEN"), 400},
		{"space in member id", "POST", "application/json", ask("m 1", "OPEN"), 400},
		{"bad campaign id", "POST", "application/json", ask("m1", "SW A"), 400},
		{"body over 4 KiB", "POST", "application/json", `{"member_id":"` + strings.Repeat("x", 5000) + `","campaign_id":"OPEN"}`, 413},
		{"wrong content type", "POST", "text/plain", ask("m1", "OPEN"), 415},
		{"no content type", "POST", "", ask("m1", "OPEN"), 415},
		{"wrong method", "GET", "application/json", ``, 405},
	}
	for _, c := range cases {
		a := post(t, h, c.method, c.contentType, c.body)
		if msg, _ := a.body["message"].(string); a.status != c.status || a.body["result"] != "INVALID_REQUEST" || msg == "" {
			t.Errorf("%s: %d %v, want %d INVALID_REQUEST with a message", c.name, a.status, a.body, c.status)
		}
		if c.status == 405 && a.header.Get("Allow") != "POST" {
			t.Errorf("%s: Allow %q, want POST", c.name, a.header.Get("Allow"))
		}
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM issued_coupons) + (SELECT count(*) FROM member_monthly_usage)`).Scan(&n); err != nil || n != 0 {
		t.Errorf("rows written by bad requests: %d (%v), want 0", n, err)
	}
}

// TestExpiresAtIsExact: a campaign whose coupons expire at an instant with a fraction of a
// second; ISSUED's and ALREADY_ISSUED's expires_at name the coupon's stored expires_at exactly
// (read by SQL), never an earlier instant. The broken variant, RFC 3339 at whole seconds (the
// answer before 00015), names an instant before the stored one: the check sees that.
func TestExpiresAtIsExact(t *testing.T) {
	t.Parallel()
	h, pool := newTestHandler(t, issuance.Config{})
	exp := time.Now().Add(time.Hour).Truncate(time.Second).Add(123_456 * time.Microsecond)
	if err := campaign.Create(context.Background(), pool, campaign.Campaign{ID: "EXP", DiscountYen: 1000,
		BudgetYen: 10000, CouponsExpireAt: &exp}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ISSUED", "ALREADY_ISSUED"} {
		a := post(t, h, http.MethodPost, "application/json", ask("m1", "EXP"))
		if a.body["result"] != want {
			t.Fatalf("%v, want %s", a.body, want)
		}
		text, _ := a.body["expires_at"].(string)
		got, err := time.Parse(time.RFC3339Nano, text)
		var stored time.Time
		if err := pool.QueryRow(context.Background(), `SELECT expires_at FROM issued_coupons WHERE coupon_id = $1`,
			a.body["coupon_id"]).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if err != nil || !got.Equal(stored) || !strings.HasSuffix(text, "+09:00") {
			t.Errorf("%s: expires_at %q (%v), want the stored %s exactly, at +09:00", want, text, err, stored.Format(time.RFC3339Nano))
		}
		if broken, _ := time.Parse(time.RFC3339, stored.Format(time.RFC3339)); !broken.Before(stored) {
			t.Errorf("the broken variant names %s for %s, not an earlier instant: the check would not see it", broken, stored)
		}
	}
}
