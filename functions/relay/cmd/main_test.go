package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
)

func TestMain(m *testing.M) { pgtest.Main(m, proctest.RemoveBuilds) }

// TestSIGTERMDuringARun: SIGTERM arrives while a relay run waits on LINE (the stand-in holds
// every push). The main refuses new requests, gives the run the drain bound, then cancels it;
// the run's caller gets an answer (not a cut connection), the pool is closed and the main exits
// 0.
func TestSIGTERMDuringARun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	seedOutbox(t, conn, 3, "")
	pushing := make(chan struct{}, 16)
	line := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // read it all, so that a closed connection cancels r's context
		select {
		case pushing <- struct{}{}:
		default:
		}
		<-r.Context().Done() // LINE never answers while the test runs
	}))
	t.Cleanup(line.Close)

	port := proctest.FreePort(t)
	cmd, out := proctest.Start(t, proctest.Build(t, "."), "DATABASE_URL="+dbURL, "PORT="+port,
		"LINE_CHANNEL_ACCESS_TOKEN=test-token", "LINE_API_BASE_URL="+line.URL, "FUNCTION_TARGET=RelayOutbox")

	proctest.WaitServing(t, port, out)
	answered := make(chan string, 1)
	go func() {
		resp, err := http.Post("http://127.0.0.1:"+port+"/", "application/json", strings.NewReader(`{}`))
		if err != nil {
			answered <- err.Error()
			return
		}
		resp.Body.Close()
		answered <- fmt.Sprint(resp.StatusCode)
	}()
	select {
	case <-pushing:
	case a := <-answered:
		t.Fatalf("the run ended before pushing: %s\n%s", a, out.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if a := <-answered; strings.Contains(a, "EOF") || strings.Contains(a, "reset") {
		t.Errorf("the run in flight at SIGTERM was cut: %s", a)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "shut down cleanly") {
		t.Errorf("no clean shutdown in the log:\n%s", out.String())
	}
}

// seedOutbox writes n coupons of campaign T to members m1..mN, each with a linked LINE account
// and an unsent outbox row whose trace_parent is traceParent ("" for none).
func seedOutbox(t *testing.T, conn *pgx.Conn, n int, traceParent string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), `
WITH k AS (INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('T', 1000, 1000000)),
c AS (
  INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
  SELECT 'T', 'm' || g, '2026-11', 1000 FROM generate_series(1, $1::int) g
  RETURNING coupon_id, member_id
),
l AS (INSERT INTO member_line_accounts (member_id, line_user_id) SELECT member_id, 'U' || md5(member_id) FROM c)
INSERT INTO notification_outbox (coupon_id, member_id, trace_parent)
SELECT coupon_id, member_id, NULLIF($2, '') FROM c`, n, traceParent); err != nil {
		t.Fatal(err)
	}
}
