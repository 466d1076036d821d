package issue

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/localpg"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/issuance"
)

// faultHandler is a Handler with cfg on pool, after creating campaign OPEN (1,000 yen coupons,
// budget 10,000,000 yen).
func faultHandler(t testing.TB, pool *pgxpool.Pool, cfg issuance.Config) *Handler {
	t.Helper()
	if err := campaign.Create(context.Background(), pool, campaign.Campaign{ID: "OPEN", DiscountYen: 1000, BudgetYen: 10_000_000}); err != nil {
		t.Fatal(err)
	}
	pgtest.SetClock(t, pool, time.Date(2026, 9, 20, 10, 0, 0, 0, issuance.Tokyo))
	h, err := newHandler(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// reply is an answer of the handler: status, headers and the decoded JSON body.
type reply struct {
	status int
	header http.Header
	result string
	body   map[string]any
}

// send serves req with h and decodes the answer, which must be JSON with a result.
func send(t testing.TB, h http.Handler, req *http.Request) reply {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	r := reply{status: rec.Code, header: rec.Header()}
	if err := json.Unmarshal(rec.Body.Bytes(), &r.body); err != nil {
		t.Fatalf("body %q is not JSON: %v", rec.Body.String(), err)
	}
	r.result, _ = r.body["result"].(string)
	if r.result == "" {
		t.Fatalf("body %q has no result", rec.Body.String())
	}
	return r
}

func jsonPost(body io.Reader, header ...string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/", body)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

// writes counts every row a request could have written.
func writes(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM issued_coupons)
		+ (SELECT count(*) FROM member_monthly_usage) + (SELECT count(*) FROM notification_outbox)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBodySizeFirstAndEncoding: the size is judged before the content (any body over 4 KiB is
// 413, whatever it holds), and a Content-Encoding other than identity is 415, even on a plain
// body. Nothing is written.
func TestBodySizeFirstAndEncoding(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, 2)
	h := faultHandler(t, pool, issuance.Config{})
	valid := `{"member_id":"m1","campaign_id":"OPEN"}`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(valid))
	zw.Close()
	cases := []struct {
		name   string
		req    *http.Request
		status int
	}{
		{"8 KiB with an unknown field", jsonPost(strings.NewReader(`{"member_id":"m1","campaign_id":"OPEN","x":"` + strings.Repeat("a", 8<<10) + `"}`)), 413},
		{"valid object then 5,000 spaces", jsonPost(strings.NewReader(valid + strings.Repeat(" ", 5000))), 413},
		{"one byte over 4 KiB", jsonPost(strings.NewReader(valid + strings.Repeat(" ", MaxBodyBytes+1-len(valid)))), 413},
		{"over 4 KiB, not JSON", jsonPost(strings.NewReader(strings.Repeat("}", 5000))), 413},
		{"over 4 KiB, no Content-Length", func() *http.Request {
			r := jsonPost(io.MultiReader(strings.NewReader(valid), strings.NewReader(strings.Repeat(" ", 5000))))
			r.ContentLength = -1
			return r
		}(), 413},
		{"gzip on a plain body", jsonPost(strings.NewReader(valid), "Content-Encoding", "gzip"), 415},
		{"gzip on a gzip body", jsonPost(bytes.NewReader(gz.Bytes()), "Content-Encoding", "gzip"), 415},
		{"identity then br", jsonPost(strings.NewReader(valid), "Content-Encoding", "identity, br"), 415},
		{"deflate, over 4 KiB", jsonPost(strings.NewReader(strings.Repeat(" ", 5000)), "Content-Encoding", "deflate"), 415},
	}
	for _, c := range cases {
		r := send(t, h, c.req)
		if r.status != c.status || r.result != "INVALID_REQUEST" || r.body["message"] == "" {
			t.Errorf("%s: %d %v, want %d INVALID_REQUEST with a message", c.name, r.status, r.body, c.status)
		}
	}
	if n := writes(t, pool); n != 0 {
		t.Fatalf("rows written by refused requests: %d", n)
	}

	// At the limit, and with Content-Encoding: identity, the request is read and served.
	exactly := `{"member_id":"m1","campaign_id":"OPEN"}` + strings.Repeat(" ", MaxBodyBytes-len(valid))
	if r := send(t, h, jsonPost(strings.NewReader(exactly))); r.status != http.StatusCreated {
		t.Errorf("a 4,096-byte body: %d %v, want 201", r.status, r.body)
	}
	if r := send(t, h, jsonPost(strings.NewReader(`{"member_id":"m2","campaign_id":"OPEN"}`), "Content-Encoding", "Identity")); r.status != http.StatusCreated {
		t.Errorf("Content-Encoding identity: %d %v, want 201", r.status, r.body)
	}
}

// TestDatabaseDownAnswers503: with the database stopped, the answer is 503 RETRY_EXHAUSTED with
// Retry-After inside the budget, not 500; once the database is back, the same handler issues.
func TestDatabaseDownAnswers503(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := localpg.Start(ctx, localpg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	if _, err := schema.MigrateURL(ctx, srv.URL()); err != nil {
		t.Fatal(err)
	}
	pool, closePool, err := db.Open(ctx, db.Config{DatabaseURL: srv.URL(), MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closePool)
	h := faultHandler(t, pool, issuance.Config{Budget: 900 * time.Millisecond, LockTimeout: 200 * time.Millisecond,
		StatementTimeout: 400 * time.Millisecond})
	if r := send(t, h, jsonPost(strings.NewReader(`{"member_id":"m1","campaign_id":"OPEN"}`))); r.status != http.StatusCreated {
		t.Fatalf("before: %d %v", r.status, r.body)
	}
	if err := srv.Down(); err != nil {
		t.Fatal(err)
	}
	r := send(t, h, jsonPost(strings.NewReader(`{"member_id":"m2","campaign_id":"OPEN"}`)))
	if r.status != http.StatusServiceUnavailable || r.result != "RETRY_EXHAUSTED" || r.header.Get("Retry-After") == "" {
		t.Errorf("database down: %d %v Retry-After %q, want 503 RETRY_EXHAUSTED with Retry-After",
			r.status, r.body, r.header.Get("Retry-After"))
	}
	if err := srv.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if r := send(t, h, jsonPost(strings.NewReader(`{"member_id":"m2","campaign_id":"OPEN"}`))); r.status != http.StatusCreated {
		t.Errorf("database back: %d %v, want 201", r.status, r.body)
	}
}
