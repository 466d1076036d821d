package gcpfake

import (
	"testing"

	"github.com/mops/coupon-api/internal/proctest"
	"github.com/mops/coupon-api/shared/telemetry"
)

// CloudRun is what a Cloud Run instance of the project sees of Google Cloud: its metadata
// server and the Telemetry API (both stand-ins, started for one test).
type CloudRun struct {
	Metadata *Metadata
	API      *TelemetryAPI
	Project  string
	Region   string
	Instance string
	Token    string
}

// StartCloudRun starts the metadata server and the Telemetry API of a fake project: the
// metadata server hands out the token the API accepts.
func StartCloudRun(t testing.TB) *CloudRun {
	t.Helper()
	c := &CloudRun{Project: "coupon-test-123", Region: "asia-northeast1",
		Instance: "0069c7a988e3ab3c0f1a2b3c4d5e6f", Token: "ya29.stand-in-token"}
	c.Metadata = StartMetadata(t, MetadataConfig{Project: c.Project, Region: c.Region, InstanceID: c.Instance, Token: c.Token})
	c.API = StartTelemetryAPI(t, c.Project, c.Token)
	return c
}

// Env is the environment of a process that runs as Cloud Run service on this instance: Cloud
// Run's variables (K_SERVICE, K_REVISION, K_CONFIGURATION), the metadata server
// (GCE_METADATA_HOST), no other Google credentials (an empty HOME, no
// GOOGLE_APPLICATION_CREDENTIALS), and the Telemetry API stand-in's address and certificate
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_CERTIFICATE). The exporters under test are
// the caller's to add; GOOGLE_CLOUD_PROJECT too, when wanted (without it the project comes from
// the metadata server).
func (c *CloudRun) Env(t testing.TB, service string) []string {
	return []string{"HOME=" + t.TempDir(), "GOOGLE_APPLICATION_CREDENTIALS=",
		"GCE_METADATA_HOST=" + c.Metadata.Host,
		"K_SERVICE=" + service, "K_REVISION=" + service + "-00001-abc", "K_CONFIGURATION=" + service,
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + c.API.Endpoint, "OTEL_EXPORTER_OTLP_CERTIFICATE=" + c.API.CertFile}
}

// DeployedEnv is [CloudRun.Env] followed by every OTEL_* setting of the Cloud Run environment
// file at path (deploy/issue.env.yaml, deploy/relay.env.yaml): the telemetry exactly as deployed,
// minus the Telemetry API's address. It fails the test unless the file exports both signals
// with shared/telemetry.GoogleExporter.
func (c *CloudRun) DeployedEnv(t testing.TB, service, path string) []string {
	t.Helper()
	env := c.Env(t, service)
	deployed := proctest.EnvFile(t, path, "OTEL_")
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"} {
		if deployed[k] != telemetry.GoogleExporter {
			t.Fatalf("%s: %s=%q, want %q", path, k, deployed[k], telemetry.GoogleExporter)
		}
	}
	for k, v := range deployed {
		env = append(env, k+"="+v)
	}
	return env
}
