package main

import (
	"context"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.yaml.in/yaml/v3"

	"github.com/mops/coupon-api/internal/campaign"
	"github.com/mops/coupon-api/internal/gcpfake"
	"github.com/mops/coupon-api/internal/pgtest"
	"github.com/mops/coupon-api/internal/syncbuf"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/telemetry"
)

// TestDeployedTelemetryReachesGoogle runs this main as deploy/ runs it on Cloud Run: every
// OTEL_* setting of deploy/issue.env.yaml, Cloud Run's variables and a metadata server
// (internal/gcpfake), with only the Telemetry API's address and certificate swapped for a
// stand-in that refuses what Google's refuses. One request the caller sampled, then SIGTERM:
// the request's trace (server span, issuance span, statements) and the metrics (ours, otelhttp's,
// otelpgx's, the budget gauge) arrive with the service account's token, and nothing is refused.
func TestDeployedTelemetryReachesGoogle(t *testing.T) {
	t.Parallel()
	const project, token = "coupon-test-123", "ya29.stand-in-token"
	meta := gcpfake.StartMetadata(t, gcpfake.MetadataConfig{Project: project, Region: "asia-northeast1",
		InstanceID: "0069c7a988e3ab3c", Token: token})
	api := gcpfake.StartTelemetryAPI(t, project, token)

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
	port := freePort(t)
	env := []string{"DATABASE_URL=" + dbURL, "PORT=" + port, "HOME=" + t.TempDir(),
		"GOOGLE_APPLICATION_CREDENTIALS=", "GOOGLE_CLOUD_PROJECT=" + project, "GCE_METADATA_HOST=" + meta.Host,
		"K_SERVICE=issue-coupon", "K_REVISION=issue-coupon-00001-abc", "K_CONFIGURATION=issue-coupon"}
	deployed := otelSettings(t, "../../../deploy/issue.env.yaml")
	if deployed["OTEL_TRACES_EXPORTER"] != telemetry.GoogleExporter {
		t.Fatalf("deploy/issue.env.yaml: OTEL_TRACES_EXPORTER=%q, want %q", deployed["OTEL_TRACES_EXPORTER"], telemetry.GoogleExporter)
	}
	for k, v := range deployed {
		env = append(env, k+"="+v)
	}
	env = append(env, "OTEL_EXPORTER_OTLP_ENDPOINT="+api.Endpoint, "OTEL_EXPORTER_OTLP_CERTIFICATE="+api.CertFile)
	cmd, out := start(t, env...)
	waitServing(t, port, out)

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
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, out.String())
	}

	if r := api.Refused(); len(r) > 0 {
		t.Errorf("the Telemetry API refused %q", r)
	}
	if strings.Contains(out.String(), "export failed") {
		t.Errorf("the main logged a failed export:\n%s", out.String())
	}
	var spans []string
	for _, rs := range api.Spans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				if strings.HasPrefix(s.GetName(), "pool.") || strings.HasPrefix(s.GetName(), "connect") {
					continue // pgxpool's own, present or not depending on the pool's state
				}
				if got := hex.EncodeToString(s.GetTraceId()); got != traceID {
					t.Errorf("span %s in trace %s, want the caller's %s", s.GetName(), got, traceID)
				}
				spans = append(spans, s.GetName())
			}
		}
	}
	for _, want := range []string{"POST", issuance.SpanName, "COMMIT"} {
		if !slices.Contains(spans, want) {
			t.Errorf("spans %q: no %q", spans, want)
		}
	}
	var metrics []string
	for _, rm := range api.Metrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				metrics = append(metrics, m.GetName())
			}
		}
	}
	for _, want := range []string{telemetry.MetricIssuances, telemetry.MetricIssuanceDuration,
		telemetry.MetricBudgetUtilization, "http.server.request.duration", "db.client.operation.duration"} {
		if !slices.Contains(metrics, want) {
			t.Errorf("metrics %q: no %s", metrics, want)
		}
	}
}

// otelSettings returns the OTEL_* entries of a Cloud Run environment file.
func otelSettings(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var all map[string]string
	if err := yaml.Unmarshal(b, &all); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	otel := map[string]string{}
	for k, v := range all {
		if strings.HasPrefix(k, "OTEL_") {
			otel[k] = v
		}
	}
	return otel
}

// waitServing waits until the main accepts connections on port.
func waitServing(t *testing.T, port string, out *syncbuf.Buffer) {
	t.Helper()
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			return
		}
		if i > 500 {
			t.Fatalf("never served: %s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
