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
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestResponseCountsMatchTable calls RelayOutbox over 30 rows of which LINE refuses 5 (400),
// fails 5 (500), and 5 belong to members without a LINE account, and compares the answer with
// the table: sent, retry_later, parked and skipped are the rows the table holds as sent, due
// again, parked and skipped.
func TestResponseCountsMatchTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, 8)
	stub := linestub.New()
	srv := httptest.NewServer(stub)
	t.Cleanup(srv.Close)

	rows, err := pool.Query(ctx, `
WITH k AS (INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('T', 1000, 1000000)),
c AS (
  INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
  SELECT 'T', 'm' || g, '2026-11', 1000 FROM generate_series(1, 30) g
  RETURNING coupon_id, member_id
)
INSERT INTO notification_outbox (coupon_id, member_id) SELECT coupon_id, member_id FROM c
RETURNING coupon_id::text`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO member_line_accounts (member_id, line_user_id)
		SELECT member_id, 'U' || md5(member_id) FROM notification_outbox WHERE coupon_id <> ALL($1::uuid[])`, ids[25:]); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[:5] {
		stub.Always(id, linestub.Response{Status: http.StatusBadRequest})
	}
	for _, id := range ids[5:10] {
		stub.Always(id, linestub.Response{Status: http.StatusInternalServerError})
	}

	h, err := relay.New(outbox.Config{
		ChannelAccessToken: "test-token", BaseURL: srv.URL, BatchSize: 7,
		PushTimeout: time.Second, Logger: slog.New(slog.DiscardHandler),
	}, pool)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"max_rows": 100}`))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var got outbox.Result
	dec := json.NewDecoder(rec.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	var want outbox.Result
	err = pool.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE sent_at IS NOT NULL),
       count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND attempts = 1),
       count(*) FILTER (WHERE parked_at IS NOT NULL),
       count(*) FILTER (WHERE skipped_at IS NOT NULL),
       count(*) FILTER (WHERE skipped_at IS NOT NULL AND skip_reason = 'no_line_account')
  FROM notification_outbox`).Scan(&want.Sent, &want.RetryLater, &want.Parked, &want.Skipped, &want.SkippedReasons.NoLINEAccount)
	if err != nil {
		t.Fatal(err)
	}
	if got != want || want != (outbox.Result{Sent: 15, RetryLater: 5, Parked: 5, Skipped: 5, SkippedReasons: outbox.SkippedReasons{NoLINEAccount: 5}}) {
		t.Errorf("answer %+v, table %+v; want them equal at 15 sent, 5 retry_later, 5 parked, 5 skipped", got, want)
	}

	// A refused token ends the run with 502, the counts and the reason.
	for _, id := range ids[5:10] { // the rows still open
		stub.Always(id, linestub.Response{Status: http.StatusUnauthorized})
	}
	if _, err := pool.Exec(ctx, `UPDATE notification_outbox SET next_attempt_at = now() WHERE sent_at IS NULL`); err != nil {
		t.Fatal(err)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), `"sent":0`) ||
		!strings.Contains(rec.Body.String(), "channel access token") {
		t.Errorf("with a refused token: %d %s; want 502 with the counts and the reason", rec.Code, rec.Body)
	}
}

// TestRejectsBadRequests checks the request rules: POST only, an empty body or {"max_rows": N}
// (every rule and its words: TestRequestRules).
func TestRejectsBadRequests(t *testing.T) {
	t.Parallel()
	h, err := relay.New(outbox.Config{ChannelAccessToken: "t"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method, body string
		want         int
	}{
		{http.MethodGet, "", http.StatusMethodNotAllowed},
		{http.MethodPost, `{"max_rows": 0}`, http.StatusBadRequest},
		{http.MethodPost, `{"max_rows": "10"}`, http.StatusBadRequest},
		{http.MethodPost, `{"rows": 10}`, http.StatusBadRequest},
		{http.MethodPost, `{"max_rows": 10} {}`, http.StatusBadRequest},
		{http.MethodPost, `[`, http.StatusBadRequest},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(c.method, "/", strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("%s %q: status %d, want %d", c.method, c.body, rec.Code, c.want)
		}
	}
}
