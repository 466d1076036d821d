package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/oauth"
)

// GoogleExporter is the OTEL_TRACES_EXPORTER and OTEL_METRICS_EXPORTER value that exports to
// Google Cloud, as the deployed functions and jobs do (deploy/*.env.yaml): OTLP over gRPC to
// Google's Telemetry (OTLP) API, which stores spans in Cloud Trace and metrics in Cloud
// Monitoring, with the process's Application Default Credentials on every request (on Cloud
// Run, the service account's token from the metadata server). docs/operations.md, "Export
// path", says why this and not a collector sidecar.
//
// It is the standard "otlp" exporter (go.opentelemetry.io/otel/exporters/otlp, gRPC) read from
// the same OTEL_EXPORTER_OTLP_* variables (endpoint, certificate, compression, headers,
// timeout), with two differences: the endpoint defaults to [TelemetryAPIEndpoint], and an
// endpoint without TLS is refused, since the token would travel in clear. Plain "otlp" cannot
// be used for Google: it has no way to attach a refreshed OAuth token.
const GoogleExporter = "otlp_google"

// TelemetryAPIEndpoint is Google's OTLP endpoint (Cloud Observability docs, "Telemetry (OTLP)
// API overview"); gRPC on port 443.
const TelemetryAPIEndpoint = "https://telemetry.googleapis.com:443"

// googleScope is the OAuth scope the Telemetry API accepts for both traces and metrics
// (Telemetry API reference, v1.traces and v1.metrics, "Authorization scopes").
const googleScope = "https://www.googleapis.com/auth/cloud-platform"

func init() {
	autoexport.RegisterSpanExporter(GoogleExporter, newGoogleSpanExporter)
	autoexport.RegisterMetricReader(GoogleExporter, newGoogleMetricReader)
}

// newGoogleSpanExporter is the "otlp_google" span exporter; the tracer provider batches in
// front of it as for any exporter.
func newGoogleSpanExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	creds, endpoint, err := googleExport(ctx, "TRACES")
	if err != nil {
		return nil, err
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithDialOption(grpc.WithPerRPCCredentials(creds))}
	if endpoint != "" {
		opts = append(opts, otlptracegrpc.WithEndpointURL(endpoint))
	}
	return otlptracegrpc.New(ctx, opts...)
}

// newGoogleMetricReader is the "otlp_google" metric reader: a periodic reader
// (OTEL_METRIC_EXPORT_INTERVAL, OTEL_METRIC_EXPORT_TIMEOUT) in front of the OTLP exporter.
func newGoogleMetricReader(ctx context.Context) (sdkmetric.Reader, error) {
	creds, endpoint, err := googleExport(ctx, "METRICS")
	if err != nil {
		return nil, err
	}
	opts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithDialOption(grpc.WithPerRPCCredentials(creds))}
	if endpoint != "" {
		opts = append(opts, otlpmetricgrpc.WithEndpointURL(endpoint))
	}
	exp, err := otlpmetricgrpc.New(ctx, opts...)
	if err != nil {
		return nil, err
	}
	return sdkmetric.NewPeriodicReader(exp), nil
}

// googleExport checks the signal's endpoint settings and finds the Application Default
// Credentials. It returns the endpoint to set, or "" when the environment names one.
//
// Errors: an endpoint that is not https:// or is marked insecure, and no credentials found
// (locally: run `gcloud auth application-default login`).
func googleExport(ctx context.Context, signal string) (credentials.PerRPCCredentials, string, error) {
	endpoint := ""
	name := "OTEL_EXPORTER_OTLP_" + signal + "_ENDPOINT"
	set := os.Getenv(name)
	if set == "" {
		name = "OTEL_EXPORTER_OTLP_ENDPOINT"
		set = os.Getenv(name)
	}
	if set == "" {
		endpoint = TelemetryAPIEndpoint
	} else if u, err := url.Parse(set); err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, "", fmt.Errorf("telemetry: %s=%q: %s sends a Google access token, so the endpoint must be https://HOST[:PORT]",
			name, set, GoogleExporter)
	}
	for _, insecure := range []string{"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_" + signal + "_INSECURE"} {
		if b, _ := strconv.ParseBool(os.Getenv(insecure)); b {
			return nil, "", fmt.Errorf("telemetry: %s=true: %s sends a Google access token and never without TLS", insecure, GoogleExporter)
		}
	}
	creds, err := oauth.NewApplicationDefault(ctx, googleScope)
	if err != nil {
		return nil, "", fmt.Errorf("telemetry: %s needs Application Default Credentials (on Cloud Run, the service account; "+
			"locally, gcloud auth application-default login): %w", GoogleExporter, err)
	}
	return creds, endpoint, nil
}
