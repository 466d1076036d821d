package redeem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/functions/redeem"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/testkit/apispec"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestOpenAPI drives the real RedeemCoupon handler, logged in as coupon_redeem, on a real
// PostgreSQL through every answer docs/openapi.yaml documents, validates each against the
// document with kin-openapi, and fails on a documented answer it never produced.
func TestOpenAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner := pgtest.Pool(t, 4)
	now := time.Now()
	if err := campaign.Create(ctx, owner, campaign.Campaign{ID: "CART", DiscountYen: 500, BudgetYen: 100_000, CouponValidDays: 7}); err != nil {
		t.Fatal(err)
	}
	iss, err := issuance.New(owner, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	coupons := map[string]string{}
	for _, m := range []string{"m1", "m2", "m3", "m4"} {
		out, err := iss.Issue(ctx, m, "CART")
		if err != nil || out.Result != issuance.ResultIssued {
			t.Fatalf("issue %s: %+v %v", m, out, err)
		}
		coupons[m] = out.CouponID
	}
	if _, err := coupon.Void(ctx, owner, coupons["m3"], "TestOpenAPI", false); err != nil {
		t.Fatal(err)
	}
	// m4's coupon expired a minute ago: the expiry is the database's to judge.
	if _, err := owner.Exec(ctx, `UPDATE issued_coupons SET expires_at = $2 WHERE coupon_id = $1`, coupons["m4"], now.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	loginURL := pgtest.LoginAs(t, owner.Config().ConnConfig.ConnString(), "coupon_redeem")
	h := handler(t, loginURL, issuance.Config{})
	spec := apispec.New(t, "/RedeemCoupon")
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
	ask := func(action, member, order string) string {
		b, _ := json.Marshal(map[string]string{"action": action, "coupon_id": coupons[member], "member_id": member, "order_id": order})
		return string(b)
	}
	rollback := func(member, order string) string {
		b, _ := json.Marshal(map[string]string{"action": "rollback", "coupon_id": coupons[member], "member_id": member,
			"order_id": order, "reason": "order cancelled"})
		return string(b)
	}
	steps := []struct {
		name, method, contentType, body string
		status                          int
		result                          string
	}{
		{"valid", "POST", "application/json", ask("validate", "m1", "A"), 200, "VALID"},
		{"redeemed", "POST", "application/json", ask("redeem", "m1", "A"), 200, "REDEEMED"},
		{"redeemed again", "POST", "application/json; charset=utf-8", ask("redeem", "m1", "A"), 200, "REDEEMED"},
		{"another order", "POST", "application/json", ask("redeem", "m1", "B"), 409, "ALREADY_REDEEMED"},
		{"not this order's", "POST", "application/json", rollback("m1", "B"), 409, "NOT_REDEEMED"},
		{"rolled back", "POST", "application/json", rollback("m1", "A"), 200, "ROLLED_BACK"},
		{"voided", "POST", "application/json", ask("redeem", "m3", "A"), 409, "COUPON_VOIDED"},
		{"expired", "POST", "application/json", ask("redeem", "m4", "A"), 409, "COUPON_EXPIRED"},
		{"another member's", "POST", "application/json",
			fmt.Sprintf(`{"action":"redeem","coupon_id":%q,"member_id":"m2","order_id":"A"}`, coupons["m1"]), 404, "UNKNOWN_COUPON"},
		{"rollback without a reason", "POST", "application/json", ask("rollback", "m1", "A"), 400, "INVALID_REQUEST"},
		{"a reason on a redeem", "POST", "application/json",
			fmt.Sprintf(`{"action":"redeem","coupon_id":%q,"member_id":"m1","order_id":"A","reason":"x"}`, coupons["m1"]), 400, "INVALID_REQUEST"},
		{"unknown action", "POST", "application/json", ask("use", "m1", "A"), 400, "INVALID_REQUEST"},
		{"bad coupon id", "POST", "application/json", `{"action":"redeem","coupon_id":"c1","member_id":"m1","order_id":"A"}`, 400, "INVALID_REQUEST"},
		{"bad order id", "POST", "application/json", ask("redeem", "m1", "A 1"), 400, "INVALID_REQUEST"},
		{"missing order", "POST", "application/json", fmt.Sprintf(`{"action":"redeem","coupon_id":%q,"member_id":"m1"}`, coupons["m1"]), 400, "INVALID_REQUEST"},
		{"bad JSON", "POST", "application/json", `{"action": "redeem",`, 400, "INVALID_REQUEST"},
		{"empty", "POST", "application/json", ``, 400, "INVALID_REQUEST"},
		{"wrong method", "GET", "", "", 405, "INVALID_REQUEST"},
		{"body over 4 KiB", "POST", "application/json", ask("redeem", "m1", strings.Repeat("x", 5000)), 413, "INVALID_REQUEST"},
		{"wrong content type", "POST", "text/plain", ask("redeem", "m1", "A"), 415, "INVALID_REQUEST"},
	}
	for _, s := range steps {
		if status, body, _ := call(h, s.method, s.contentType, s.body); status != s.status || body["result"] != s.result {
			t.Errorf("%s: %d %v, want %d %s", s.name, status, body, s.status, s.result)
		}
	}
	_, body, _ := call(h, "POST", "application/json", ask("redeem", "m2", "C"))
	if body["order_id"] != "C" || body["amount_yen"] != 500.0 || !strings.HasSuffix(fmt.Sprint(body["redeemed_at"]), "+09:00") {
		t.Errorf("REDEEMED body %v: want order_id C, amount_yen 500, redeemed_at at +09:00", body)
	}

	// RETRY_EXHAUSTED: another session holds the coupon's row past a short budget.
	short := handler(t, loginURL, issuance.Config{Budget: 900 * time.Millisecond, LockTimeout: 100 * time.Millisecond, StatementTimeout: 300 * time.Millisecond})
	tx, err := owner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM issued_coupons WHERE coupon_id = $1 FOR UPDATE`, coupons["m2"]); err != nil {
		t.Fatal(err)
	}
	status, body, header := call(short, "POST", "application/json", rollback("m2", "C"))
	_ = tx.Rollback(ctx)
	if status != 503 || body["result"] != "RETRY_EXHAUSTED" || header.Get("Retry-After") == "" {
		t.Errorf("held row: %d %v Retry-After %q, want 503 RETRY_EXHAUSTED with Retry-After", status, body, header.Get("Retry-After"))
	}

	// INTERNAL_ERROR: a trigger injected by this test makes the history's insert fail with an
	// error that is no contention (P0001).
	if _, err := owner.Exec(ctx, `
CREATE FUNCTION test_refuse_redemption() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'injected by TestOpenAPI'; END $$;
CREATE TRIGGER test_refuse_redemption BEFORE INSERT ON coupon_redemptions
  FOR EACH ROW EXECUTE FUNCTION test_refuse_redemption();`); err != nil {
		t.Fatal(err)
	}
	status, body, _ = call(h, "POST", "application/json", rollback("m2", "C"))
	if status != 500 || body["result"] != "INTERNAL_ERROR" || body["message"] != "internal error" {
		t.Errorf("injected failure: %d %v, want 500 INTERNAL_ERROR with the generic message", status, body)
	}

	if unseen := spec.Unseen(); len(unseen) > 0 {
		t.Errorf("documented answers never produced: %v", unseen)
	}
}

// handler is RedeemCoupon's handler with cfg on a pool of its own at url.
func handler(t *testing.T, url string, cfg issuance.Config) http.Handler {
	t.Helper()
	p := pgtest.PoolAt(t, url, 4)
	h, err := redeem.New(cfg, p)
	if err != nil {
		t.Fatal(err)
	}
	return h
}
