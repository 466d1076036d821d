package main

import (
	"context"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/testkit/gcpfake"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/shared/outbox"
	"github.com/mops/coupon-api/shared/telemetry"
)

// TestDeployedTelemetryReachesGoogle runs this main as deploy/ runs it on Cloud Run: every
// OTEL_* setting of deploy/relay.env.yaml, Cloud Run's variables and a metadata server
// (internal/testkit/gcpfake), with only the Telemetry API's address and certificate swapped for a
// stand-in that refuses what Google's refuses. One run pushes one coupon whose outbox row
// kept its issuing request's trace; then SIGTERM. The push span arrives under the run and
// linked to the issuing span, the outbox and push metrics arrive, nothing is refused.
func TestDeployedTelemetryReachesGoogle(t *testing.T) {
	t.Parallel()
	run := gcpfake.StartCloudRun(t, 0)
	api := run.API
	const issuingTrace, issuingSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

	ctx := context.Background()
	dbURL := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	seedOutbox(t, conn, 1, "00-"+issuingTrace+"-"+issuingSpan+"-01")
	line := httptest.NewServer(linestub.New())
	t.Cleanup(line.Close)

	port := proctest.FreePort(t)
	cmd, out := proctest.Start(t, proctest.Build(t, "."), append(run.DeployedEnv(t, "relay-outbox", "../../../deploy/relay.env.yaml"),
		"DATABASE_URL="+dbURL, "PORT="+port, "GOOGLE_CLOUD_PROJECT="+run.Project,
		"LINE_CHANNEL_ACCESS_TOKEN=test-token", "LINE_API_BASE_URL="+line.URL)...)
	proctest.WaitServing(t, port, out)

	resp, err := http.Post("http://127.0.0.1:"+port+"/", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("RelayOutbox answered %s, want 200\n%s", resp.Status, out.String())
	}
	proctest.Terminate(t, cmd, out)
	api.CheckAllTaken(t, out.String())
	var names []string
	runs := map[string]bool{} // the run's server span
	for _, s := range api.AllSpans() {
		if s.GetName() == "POST /" { // named by the framework's route
			runs[hex.EncodeToString(s.GetSpanId())] = true
		}
	}
	pushes := 0
	for _, s := range api.AllSpans() {
		names = append(names, s.GetName())
		if s.GetName() != outbox.PushSpanName {
			continue
		}
		pushes++
		if !runs[hex.EncodeToString(s.GetParentSpanId())] {
			t.Errorf("push span's parent %x is not the run's server span %v", s.GetParentSpanId(), runs)
		}
		links := s.GetLinks()
		if len(links) != 1 || hex.EncodeToString(links[0].GetTraceId()) != issuingTrace ||
			hex.EncodeToString(links[0].GetSpanId()) != issuingSpan {
			t.Errorf("push span links %v, want the issuing span %s/%s", links, issuingTrace, issuingSpan)
		}
	}
	if pushes != 1 || len(runs) != 1 {
		t.Errorf("spans %q: want the run's POST and one %s", names, outbox.PushSpanName)
	}
	metrics := api.MetricNames()
	for _, want := range []string{telemetry.MetricLINEPushes, telemetry.MetricOutboxUnsent, telemetry.MetricOutboxOldestAge,
		telemetry.MetricOutboxParked, telemetry.MetricOutboxSkipped} {
		if !slices.Contains(metrics, want) {
			t.Errorf("metrics %q: no %s", metrics, want)
		}
	}
}
