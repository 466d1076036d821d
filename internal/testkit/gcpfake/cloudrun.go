package gcpfake

import (
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/testkit/proctest"
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
}

// StartCloudRun starts the metadata server and the Telemetry API of a fake project: the API
// accepts the live tokens the metadata server hands out, each living tokenLife (0: an hour).
func StartCloudRun(t testing.TB, tokenLife time.Duration) *CloudRun {
	t.Helper()
	c := &CloudRun{Project: "coupon-test-123", Region: "asia-northeast1", Instance: "0069c7a988e3ab3c0f1a2b3c4d5e6f"}
	c.Metadata = StartMetadata(t, MetadataConfig{Project: c.Project, Region: c.Region, InstanceID: c.Instance, TokenLifetime: tokenLife})
	c.API = StartTelemetryAPI(t, c.Project, c.Metadata.Valid)
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
	return append(c.common(t), "K_SERVICE="+service, "K_REVISION="+service+"-00001-abc", "K_CONFIGURATION="+service)
}

// common is the environment of every process on the instance, service or job.
func (c *CloudRun) common(t testing.TB) []string {
	return []string{"HOME=" + t.TempDir(), "GOOGLE_APPLICATION_CREDENTIALS=",
		"GCE_METADATA_HOST=" + c.Metadata.Host,
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

// JobEnv is [CloudRun.Env] for a task of the Cloud Run job named job: the job's variables
// (CLOUD_RUN_JOB, CLOUD_RUN_EXECUTION, CLOUD_RUN_TASK_INDEX, CLOUD_RUN_TASK_ATTEMPT) instead of a
// service's.
func (c *CloudRun) JobEnv(t testing.TB, job string) []string {
	return append(c.common(t), "CLOUD_RUN_JOB="+job, "CLOUD_RUN_EXECUTION="+job+"-abc12",
		"CLOUD_RUN_TASK_INDEX=0", "CLOUD_RUN_TASK_ATTEMPT=0")
}
