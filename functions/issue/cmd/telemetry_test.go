package main

import (
	"context"
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/gcpfake"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/telemetry"
)

// TestDeployedTelemetryReachesGoogle runs this main as deploy/ runs it on Cloud Run: every
// OTEL_* setting of deploy/issue.env.yaml, Cloud Run's variables and a metadata server
// (internal/testkit/gcpfake), with only the Telemetry API's address and certificate swapped for a
// stand-in that refuses what Google's refuses. One request the caller sampled, then SIGTERM:
// the request's trace (server span, issuance span, statements) and the metrics (ours, otelhttp's,
// otelpgx's, the budget gauge) arrive with the service account's token, and nothing is refused.
func TestDeployedTelemetryReachesGoogle(t *testing.T) {
	t.Parallel()
	run := gcpfake.StartCloudRun(t, 0)
	api := run.API

	ctx := context.Background()
	dbURL := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := campaign.Create(ctx, conn, campaign.Campaign{ID: "OPEN", DiscountYen: 500, BudgetYen: 100_000}); err != nil {
		t.Fatal(err)
	}
	port := proctest.FreePort(t)
	cmd, out := start(t, append(run.DeployedEnv(t, "issue-coupon", "../../../deploy/issue.env.yaml"),
		"DATABASE_URL="+dbURL, "PORT="+port, "GOOGLE_CLOUD_PROJECT="+run.Project)...)
	proctest.WaitServing(t, port, out)

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:"+port+"/",
		strings.NewReader(`{"member_id": "m0001", "campaign_id": "OPEN"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01") // the gateway sampled it
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("IssueCoupon answered %s, want 201", resp.Status)
	}
	proctest.Terminate(t, cmd, out)
	api.CheckAllTaken(t, out.String())
	var spans []string
	for _, s := range api.AllSpans() {
		if strings.HasPrefix(s.GetName(), "pool.") || strings.HasPrefix(s.GetName(), "connect") {
			continue // pgxpool's own, present or not depending on the pool's state
		}
		if got := hex.EncodeToString(s.GetTraceId()); got != traceID {
			t.Errorf("span %s in trace %s, want the caller's %s", s.GetName(), got, traceID)
		}
		spans = append(spans, s.GetName())
	}
	for _, want := range []string{"POST /", issuance.SpanName, "batch start"} { // the server span, named by the framework's route; the call: one pipelined batch
		if !slices.Contains(spans, want) {
			t.Errorf("spans %q: no %q", spans, want)
		}
	}
	metrics := api.MetricNames()
	for _, want := range []string{telemetry.MetricIssuances, telemetry.MetricIssuanceDuration,
		telemetry.MetricBudgetUtilization, "http.server.request.duration", "db.client.operation.duration"} {
		if !slices.Contains(metrics, want) {
			t.Errorf("metrics %q: no %s", metrics, want)
		}
	}
}
