package relay_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/functions/relay"
	"github.com/mops/coupon-api/internal/testkit/apispec"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
	"github.com/mops/coupon-api/shared/lifecycle"
	"github.com/mops/coupon-api/shared/outbox"
)

// TestOpenAPI drives the real RelayOutbox handler on a real PostgreSQL and a LINE stand-in
// through every answer docs/openapi.yaml documents (200 with each count non-zero, 400, 405, 413,
// 415, 500, 502, and 503 from the function served as deployed once it shuts down), validates
// each against the document with kin-openapi, and fails on a documented answer it never
// produced. Not parallel: the served function reads the environment.
func TestOpenAPI(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, 4)
	stub := linestub.New()
	srv := httptest.NewServer(stub)
	t.Cleanup(srv.Close)

	// Four coupons: LINE accepts the first, fails the second (500: retry later), refuses the
	// third (400: parked). Members m1..m3 are linked to LINE users; m4 is not, so it is skipped.
	// Two more, of linked members, are skipped too: v1's coupon was voided, x1's has expired.
	rows, err := pool.Query(ctx, `
WITH k AS (INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('T', 1000, 1000000)),
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
INSERT INTO member_line_accounts (member_id, line_user_id)
SELECT 'm' || g, 'U' || md5('m' || g) FROM generate_series(1, 3) g;
INSERT INTO member_line_accounts (member_id, line_user_id) VALUES ('v1', 'U' || md5('v1')), ('x1', 'U' || md5('x1')), ('r1', 'U' || md5('r1'));
WITH c AS (
  INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen, voided_at, expires_at, redeemed_at)
  VALUES ('T', 'v1', to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 1000, now(), NULL, NULL),
         ('T', 'x1', to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 1000, NULL, now() - interval '1 minute', NULL),
         ('T', 'r1', to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 1000, NULL, NULL, now())
  RETURNING coupon_id, member_id)
INSERT INTO notification_outbox (coupon_id, member_id) SELECT coupon_id, member_id FROM c`); err != nil {
		t.Fatal(err)
	}
	stub.Always(ids[1], linestub.Response{Status: http.StatusInternalServerError})
	stub.Always(ids[2], linestub.Response{Status: http.StatusBadRequest})

	cfg := outbox.Config{ChannelAccessToken: "test-token", BaseURL: srv.URL,
		PushTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)}
	h, err := relay.New(cfg, pool)
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
	if want := map[string]any{"sent": 1.0, "retry_later": 1.0, "parked": 1.0, "skipped": 4.0,
		"skipped_reasons": map[string]any{"no_line_account": 1.0, "voided": 1.0, "redeemed": 1.0, "expired": 1.0}}; status != 200 || !reflect.DeepEqual(got, want) {
		t.Errorf("run: %d %v, want 200 %v", status, got, want)
	}
	if status, got = call(h, "POST", ""); status != 200 {
		t.Errorf("empty body, as Cloud Scheduler may send: %d %v, want 200", status, got)
	}
	gz := httptest.NewRequest("POST", "/", strings.NewReader("\x1f\x8b"))
	gz.Header.Set("Content-Type", "application/json")
	gz.Header.Set("Content-Encoding", "gzip")
	if resp := spec.Do(t, h, gz); resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("gzip body: %d, want 415 as IssueCoupon answers", resp.StatusCode)
	}
	form := httptest.NewRequest("POST", "/", strings.NewReader(`{"max_rows": 10}`))
	form.Header.Set("Content-Type", "application/x-www-form-urlencoded") // curl -d without -H
	if resp := spec.Do(t, h, form); resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("a form-encoded body: %d, want 415 as IssueCoupon answers", resp.StatusCode)
	}
	for _, c := range []struct {
		method, body string
		status       int
	}{
		{"POST", `{}`, 200},
		{"POST", `{"max_rows": 0}`, 400},
		{"POST", `{"rows": 10}`, 400},
		{"POST", `[`, 400},
		{"POST", `null`, 400},
		{"POST", `{"max_rows": null}`, 400},
		{"POST", `{"max_rows": 10}` + strings.Repeat(" ", relay.MaxBodyBytes), 413},
		{"GET", "", 405},
	} {
		if status, got := call(h, c.method, c.body); status != c.status {
			t.Errorf("%s %q: %d %v, want %d", c.method, c.body, status, got, c.status)
		}
	}

	// 502: LINE refuses the channel access token; the run ends early and says why.
	if _, err := pool.Exec(ctx, `
WITH l AS (INSERT INTO member_line_accounts (member_id, line_user_id) VALUES ('m5', 'U' || md5('m5'))),
c AS (
  INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
  VALUES ('T', 'm5', to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 1000)
  RETURNING coupon_id, member_id
)
INSERT INTO notification_outbox (coupon_id, member_id) SELECT coupon_id, member_id FROM c`); err != nil {
		t.Fatal(err)
	}
	refusing := linestub.New()
	refusing.Default(linestub.Response{Status: http.StatusUnauthorized, Message: "invalid token"})
	refusingSrv := httptest.NewServer(refusing)
	t.Cleanup(refusingSrv.Close)
	stopped, err := relay.New(outbox.Config{ChannelAccessToken: "expired", BaseURL: refusingSrv.URL,
		PushTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if status, got := call(stopped, "POST", ""); status != 502 || got["message"] == "" {
		t.Errorf("token refused: %d %v, want 502 with the counts and a message", status, got)
	}

	// 500: the database is gone (here: the handler's pool is closed).
	closed := pgtest.Pool(t, 1)
	closed.Close()
	broken, err := relay.New(cfg, closed)
	if err != nil {
		t.Fatal(err)
	}
	if status, got := call(broken, "POST", ""); status != 500 {
		t.Errorf("closed pool: %d %v, want 500", status, got)
	}

	// 503: the function, served as deployed (lifecycle.Serve), has begun to shut down, as after
	// SIGTERM, and refuses a new request.
	t.Setenv("DATABASE_URL", pool.Config().ConnConfig.ConnString())
	t.Setenv("LINE_CHANNEL_ACCESS_TOKEN", "test-token")
	t.Setenv("LINE_API_BASE_URL", srv.URL)
	t.Setenv("FUNCTION_TARGET", "")
	port := proctest.FreePort(t)
	serveCtx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- lifecycle.Serve(serveCtx, lifecycle.Server{Host: "127.0.0.1", Port: port,
			Functions: []*lifecycle.Function{relay.Function}, Log: slog.New(slog.DiscardHandler)})
	}()
	proctest.WaitServing(t, port, &syncbuf.Buffer{})
	stop()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if status, got := call(relay.Function, "POST", ""); status != 503 || got["message"] == "" {
		t.Errorf("shutting down: %d %v, want 503 with a message", status, got)
	}

	if unseen := spec.Unseen(); len(unseen) > 0 {
		t.Errorf("documented answers never produced: %v", unseen)
	}
}

// TestOpenAPISecurity: docs/openapi.yaml declares what the deployed services require, a
// Google-signed ID token (an http bearer scheme, JWT) checked by Cloud Run IAM with
// roles/run.invoker, on every operation, and says that local couponctl serve checks none.
func TestOpenAPISecurity(t *testing.T) {
	t.Parallel()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(apispec.Path())
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatal(err)
	}
	var names []string
	for name, ref := range doc.Components.SecuritySchemes {
		s := ref.Value
		if s.Type == "http" && s.Scheme == "bearer" && s.BearerFormat == "JWT" &&
			strings.Contains(s.Description, "roles/run.invoker") && strings.Contains(s.Description, "ID token") {
			names = append(names, name)
		}
	}
	if len(names) != 1 {
		t.Fatalf("security schemes %v: want one http bearer JWT scheme describing the ID token and roles/run.invoker",
			doc.Components.SecuritySchemes)
	}
	required := func(reqs openapi3.SecurityRequirements) bool {
		for _, r := range reqs {
			if _, ok := r[names[0]]; ok && len(r) == 1 {
				return len(reqs) == 1 // no alternative, such as {} (anonymous)
			}
		}
		return false
	}
	for _, path := range []string{"/IssueCoupon", "/RelayOutbox"} {
		op := doc.Paths.Find(path).Post
		if reqs := op.Security; reqs != nil && !required(*reqs) || reqs == nil && !required(doc.Security) {
			t.Errorf("POST %s does not require %s", path, names[0])
		}
	}
	local := false
	for _, s := range doc.Servers {
		local = local || strings.Contains(s.Description, "no authentication")
	}
	if !local || !strings.Contains(doc.Info.Description, "couponctl serve` (the server below) has no authentication") {
		t.Errorf("the document does not say that local couponctl serve has no authentication")
	}
}
