package relay_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/functions/relay"
	"github.com/mops/coupon-api/internal/apispec"
	"github.com/mops/coupon-api/internal/linestub"
	"github.com/mops/coupon-api/internal/pgtest"
	"github.com/mops/coupon-api/shared/outbox"
)

// TestOpenAPI drives the real RelayOutbox handler on a real PostgreSQL and a LINE stand-in
// through every answer docs/openapi.yaml documents (200 with each count non-zero, 400, 405, 500),
// validates each against the document with kin-openapi, and fails on a documented answer it
// never produced.
func TestOpenAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, 4)
	stub := linestub.New()
	srv := httptest.NewServer(stub)
	t.Cleanup(srv.Close)

	// Four coupons: LINE accepts the first, fails the second (500: retry later), refuses the
	// third (400: parked). Members m1..m3 are linked to LINE users when the schema has
	// member_line_accounts; m4 is not, so it is skipped there (and pushed where it is not).
	rows, err := pool.Query(ctx, `
WITH k AS (INSERT INTO campaigns (campaign_id) VALUES ('T')),
c AS (
  INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
  SELECT 'T', 'm' || g, to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 1000 FROM generate_series(1, 4) g
  RETURNING coupon_id, member_id
),
o AS (
  INSERT INTO notification_outbox (coupon_id, member_id) SELECT coupon_id, member_id FROM c
  RETURNING coupon_id, member_id
)
SELECT coupon_id::text FROM o ORDER BY member_id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
DO $$ BEGIN
  IF to_regclass('member_line_accounts') IS NOT NULL THEN
    INSERT INTO member_line_accounts (member_id, line_user_id)
    SELECT 'm' || g, 'U' || md5('m' || g) FROM generate_series(1, 3) g;
  END IF;
END $$`); err != nil {
		t.Fatal(err)
	}
	stub.Always(ids[1], linestub.Response{Status: http.StatusInternalServerError})
	stub.Always(ids[2], linestub.Response{Status: http.StatusBadRequest})

	cfg := outbox.Config{ChannelAccessToken: "test-token", BaseURL: srv.URL,
		PushTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)}
	h, err := relay.NewHandler(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	spec := apispec.New(t, "/RelayOutbox")
	call := func(h http.Handler, method, body string) (int, map[string]any) {
		t.Helper()
		req := httptest.NewRequest(method, "/", strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp := spec.Do(t, h, req)
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatalf("%s %q: body is not JSON: %v", method, body, err)
		}
		return resp.StatusCode, v
	}

	status, got := call(h, "POST", `{"max_rows": 10}`)
	if status != 200 || got["sent"].(float64) < 1 || got["retry_later"] != 1.0 || got["parked"] != 1.0 {
		t.Errorf("run: %d %v, want 200 with sent >= 1, retry_later 1, parked 1", status, got)
	}
	if n := got["sent"].(float64) + got["retry_later"].(float64) + got["parked"].(float64); n+asFloat(got["skipped"]) != 4 {
		t.Errorf("run: %v counts %v rows, want the 4 of the outbox", got, n+asFloat(got["skipped"]))
	}
	if status, got = call(h, "POST", ""); status != 200 {
		t.Errorf("empty body, as Cloud Scheduler may send: %d %v, want 200", status, got)
	}
	for _, c := range []struct {
		method, body string
		status       int
	}{
		{"POST", `{}`, 200},
		{"POST", `{"max_rows": 0}`, 400},
		{"POST", `{"rows": 10}`, 400},
		{"POST", `[`, 400},
		{"GET", "", 405},
	} {
		if status, got := call(h, c.method, c.body); status != c.status {
			t.Errorf("%s %q: %d %v, want %d", c.method, c.body, status, got, c.status)
		}
	}

	// 500: the database is gone (here: the handler's pool is closed).
	closed := pgtest.Pool(t, 1)
	closed.Close()
	broken, err := relay.NewHandler(closed, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if status, got := call(broken, "POST", ""); status != 500 {
		t.Errorf("closed pool: %d %v, want 500", status, got)
	}

	if unseen := spec.Unseen(); len(unseen) > 0 {
		t.Errorf("documented answers never produced: %v", unseen)
	}
}

// asFloat is a JSON number's value, 0 when absent.
func asFloat(v any) float64 {
	f, _ := v.(float64)
	return f
}
