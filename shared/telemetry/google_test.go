package telemetry_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricpb "go.opentelemetry.io/proto/otlp/metrics/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/mops/coupon-api/internal/testkit/gcpfake"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/shared/telemetry"
)

// TestGoogleExportFromCloudRun runs the deployed export path in a child process that believes
// it is a Cloud Run instance (K_SERVICE, K_CONFIGURATION and a metadata server at
// GCE_METADATA_HOST), pointed at a stand-in of Google's Telemetry API that refuses what the
// real one refuses (internal/testkit/gcpfake). With OTEL_*_EXPORTER=otlp_google, as deploy/ sets it, the
// span and the metrics arrive with the service account's token, the project, the region and a
// per-instance service.instance.id, and nothing is refused. The standard "otlp" exporter on the
// same settings sends no token and every request is refused: that is why otlp_google exists.
func TestGoogleExportFromCloudRun(t *testing.T) {
	t.Run(telemetry.GoogleExporter, func(t *testing.T) {
		run := gcpfake.StartCloudRun(t, 0)
		api := run.API
		out := runInstance(t, run, telemetry.GoogleExporter)
		if strings.Contains(out, "shutdown: ") {
			t.Errorf("the instance could not flush:\n%s", out)
		}
		api.CheckAllTaken(t, out)
		if run.Metadata.Tokens() == 0 {
			t.Error("no token was taken from the metadata server")
		}
		spanNames := itemNames(t, run, "span", api.Spans(), (*tracepb.ResourceSpans).GetScopeSpans,
			(*tracepb.ScopeSpans).GetSpans)
		if len(spanNames) != 1 || spanNames[0] != "instance-span" {
			t.Errorf("spans received %q, want [instance-span]", spanNames)
		}
		metricNames := itemNames(t, run, "metric", api.Metrics(), (*metricpb.ResourceMetrics).GetScopeMetrics,
			(*metricpb.ScopeMetrics).GetMetrics)
		if !strings.Contains(strings.Join(metricNames, " "), telemetry.MetricIssuances) {
			t.Errorf("metrics received %q, want %s among them", metricNames, telemetry.MetricIssuances)
		}
	})

	t.Run("otlp", func(t *testing.T) {
		run := gcpfake.StartCloudRun(t, 0)
		api := run.API
		runInstance(t, run, "otlp")
		refused := api.Refused()
		if len(refused) == 0 || len(api.Spans())+len(api.Metrics()) > 0 {
			t.Fatalf("plain otlp: %d span and %d metric requests accepted, refused %q; want every request refused",
				len(api.Spans()), len(api.Metrics()), refused)
		}
		for _, r := range refused {
			if !strings.Contains(r, "Unauthenticated") {
				t.Errorf("refused for %q, want Unauthenticated", r)
			}
		}
	})
}

// checkResource checks the attributes the Telemetry API files the data under.
// itemNames checks each resource's attributes ([checkResource]) and returns the names of the
// spans or metrics in its scopes.
func itemNames[R interface{ GetResource() *resourcepb.Resource }, S any, X interface{ GetName() string }](
	t *testing.T, run *gcpfake.CloudRun, what string, resources []R, scopes func(R) []S, items func(S) []X) []string {
	t.Helper()
	var names []string
	for _, r := range resources {
		checkResource(t, run, what, r.GetResource().GetAttributes())
		for _, sc := range scopes(r) {
			for _, x := range items(sc) {
				names = append(names, x.GetName())
			}
		}
	}
	return names
}

func checkResource(t *testing.T, run *gcpfake.CloudRun, what string, kvs []*commonpb.KeyValue) {
	t.Helper()
	got := map[string]string{}
	for _, kv := range kvs {
		got[kv.GetKey()] = kv.GetValue().GetStringValue()
	}
	for k, want := range map[string]string{"gcp.project_id": run.Project, "cloud.region": run.Region,
		"cloud.platform": "gcp_cloud_run", "faas.instance": run.Instance, "service.instance.id": run.Instance,
		"service.name": "issue-coupon"} {
		if got[k] != want {
			t.Errorf("%s resource: %s = %q, want %q", what, k, got[k], want)
		}
	}
}

// runInstance runs TestGoogleExportInstance in a child process on run's instance with exporter
// for both signals (and env), and returns its output. A child of its own, because the metadata client
// decides once per process whether it runs on Google Cloud.
func runInstance(t *testing.T, run *gcpfake.CloudRun, exporter string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hung child fails, not hangs
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestGoogleExportInstance$", "-test.v")
	cmd.Env = proctest.Env(append(append(run.Env(t, "issue-coupon"), "TELEMETRY_TEST_INSTANCE=1",
		"OTEL_TRACES_EXPORTER="+exporter, "OTEL_METRICS_EXPORTER="+exporter, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"), env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("instance: %v\n%s", err, out)
	}
	return string(out)
}

// TestGoogleExportInstance is the child of the tests above: what a function does with
// telemetry, from Setup to the flush at exit; with TELEMETRY_TEST_RUN_FOR, one span every 50 ms
// for that long. Shutdown errors are printed for the parent to judge, not failed here (the plain
// "otlp" case expects them).
func TestGoogleExportInstance(t *testing.T) {
	if os.Getenv("TELEMETRY_TEST_INSTANCE") != "1" {
		t.Skip("run as a child by TestGoogleExportFromCloudRun")
	}
	runFor, _ := time.ParseDuration(os.Getenv("TELEMETRY_TEST_RUN_FOR"))
	shutdown, err := telemetry.Setup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(runFor); ; time.Sleep(50 * time.Millisecond) {
		ctx, span := otel.Tracer("test").Start(context.Background(), "instance-span")
		telemetry.Global().RecordIssuance(ctx, "C", "ISSUED", 1, 4*time.Millisecond)
		span.End()
		if !time.Now().Before(end) {
			break
		}
	}
	flush, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(flush); err != nil {
		t.Logf("shutdown: %v", err)
	}
}

// TestGoogleExportRefreshesTheToken: access tokens that live 2 s, an instance that exports for
// 3 s. Every export is accepted, so the exporter took new tokens from the metadata server; one
// that kept its first token would be refused from the third second on. (2 s is inside the
// client's early-refresh window, so it takes a new token for nearly every export: this shows
// that tokens are renewed, not how long one is reused.)
func TestGoogleExportRefreshesTheToken(t *testing.T) {
	run := gcpfake.StartCloudRun(t, 2*time.Second)
	out := runInstance(t, run, telemetry.GoogleExporter, "TELEMETRY_TEST_RUN_FOR=3s",
		"OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_METRIC_EXPORT_INTERVAL=300")
	// The API's view only: with exports every 300 ms, one may be in flight when shutdown starts;
	// the SDK cancels it (logged) and sends the cumulative points in the final export.
	if r := run.API.Refused(); len(r) > 0 {
		t.Errorf("the Telemetry API refused %d requests: %q\n%s", len(r), r, out)
	}
	if n := run.API.AcceptedTokens(); n < 2 {
		t.Errorf("the accepted requests carried %d different tokens, want a refreshed one too", n)
	}
}

// TestGoogleExporterMisconfigured: CheckEnv and Setup refuse a plaintext endpoint for
// otlp_google, a misspelt exporter, a list or a space where autoexport takes one name, and an
// unknown protocol, saying which variable to change, before they look for credentials (so the
// test means the same on a machine that has some, such as a Cloud Build worker).
func TestGoogleExporterMisconfigured(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		env        map[string]string
	}{
		{"plaintext", "OTEL_EXPORTER_OTLP_ENDPOINT", map[string]string{"OTEL_TRACES_EXPORTER": telemetry.GoogleExporter,
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}},
		{"misspelt", `OTEL_TRACES_EXPORTER="otlp_gogle"`, map[string]string{"OTEL_TRACES_EXPORTER": "otlp_gogle"}},
		{"a list", `OTEL_METRICS_EXPORTER="none, otlp_google"`, map[string]string{"OTEL_METRICS_EXPORTER": "none, otlp_google"}},
		{"a space", `OTEL_METRICS_EXPORTER="otlp_google "`, map[string]string{"OTEL_METRICS_EXPORTER": "otlp_google "}},
		{"protocol", `OTEL_EXPORTER_OTLP_PROTOCOL="bogus"`, map[string]string{"OTEL_TRACES_EXPORTER": "otlp",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "bogus"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
				"OTEL_EXPORTER_OTLP_PROTOCOL"} {
				t.Setenv(k, tc.env[k])
			}
			if err := telemetry.CheckEnv(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CheckEnv: %v, want an error saying %s", err, tc.want)
			}
			restore := keepGlobals()
			defer restore()
			shutdown, err := telemetry.Setup(context.Background())
			if err == nil {
				_ = shutdown(context.Background())
				t.Fatal("Setup accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %s", err, tc.want)
			}
		})
	}
}
