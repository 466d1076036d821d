package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
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
// It is the standard "otlp" exporter (go.opentelemetry.io/otel/exporters/otlp) read from the
// same OTEL_EXPORTER_OTLP_* variables (endpoint, certificate, compression, headers, timeout),
// with three differences: it always speaks gRPC (OTEL_EXPORTER_OTLP_PROTOCOL is not read), the
// endpoint defaults to [TelemetryAPIEndpoint], and an endpoint without TLS is refused, since the
// token would travel in clear. Plain "otlp" cannot be used for Google: it has no way to attach
// a refreshed OAuth token.
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
	return otlptracegrpc.New(ctx, grpcOptions(creds, endpoint, otlptracegrpc.WithDialOption, otlptracegrpc.WithEndpointURL)...)
}

// newGoogleMetricReader is the "otlp_google" metric reader: a periodic reader
// (OTEL_METRIC_EXPORT_INTERVAL, OTEL_METRIC_EXPORT_TIMEOUT) in front of the OTLP exporter.
func newGoogleMetricReader(ctx context.Context) (sdkmetric.Reader, error) {
	creds, endpoint, err := googleExport(ctx, "METRICS")
	if err != nil {
		return nil, err
	}
	exp, err := otlpmetricgrpc.New(ctx, grpcOptions(creds, endpoint, otlpmetricgrpc.WithDialOption, otlpmetricgrpc.WithEndpointURL)...)
	if err != nil {
		return nil, err
	}
	return sdkmetric.NewPeriodicReader(exp), nil
}

// grpcOptions are an OTLP gRPC exporter's options for otlp_google: creds on every request, and
// endpoint unless it is "" (left to the OTEL_* variables).
func grpcOptions[O any](creds credentials.PerRPCCredentials, endpoint string,
	dial func(...grpc.DialOption) O, endpointURL func(string) O) []O {
	opts := []O{dial(grpc.WithPerRPCCredentials(creds))}
	if endpoint != "" {
		opts = append(opts, endpointURL(endpoint))
	}
	return opts
}

// googleExport checks the signal's endpoint settings ([googleEndpoint]) and finds the
// Application Default Credentials.
//
// Errors: those of googleEndpoint, and no credentials found (locally: run `gcloud auth
// application-default login`).
func googleExport(ctx context.Context, signal string) (credentials.PerRPCCredentials, string, error) {
	endpoint, err := googleEndpoint(signal)
	if err != nil {
		return nil, "", err
	}
	creds, err := oauth.NewApplicationDefault(ctx, googleScope)
	if err != nil {
		return nil, "", fmt.Errorf("%s needs Application Default Credentials (on Cloud Run, the service account; "+
			"locally, gcloud auth application-default login, docs/operations.md): %w", GoogleExporter, err)
	}
	return creds, endpoint, nil
}

// googleEndpoint returns the endpoint to set for signal (TRACES or METRICS):
// [TelemetryAPIEndpoint] when neither OTEL_EXPORTER_OTLP_<signal>_ENDPOINT nor
// OTEL_EXPORTER_OTLP_ENDPOINT names one, else "" (the exporter reads the variable itself).
//
// Errors: an endpoint that is not https://HOST[:PORT], or OTEL_EXPORTER_OTLP[_<signal>]_INSECURE
// set true.
func googleEndpoint(signal string) (string, error) {
	for _, insecure := range []string{"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_" + signal + "_INSECURE"} {
		if b, _ := strconv.ParseBool(os.Getenv(insecure)); b {
			return "", fmt.Errorf("%s=true: %s sends a Google access token and never without TLS", insecure, GoogleExporter)
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_" + signal + "_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		set := os.Getenv(name)
		if set == "" {
			continue
		}
		if u, err := url.Parse(set); err != nil || u.Scheme != "https" || u.Host == "" {
			return "", fmt.Errorf("%s=%q: %s sends a Google access token, so the endpoint must be https://HOST[:PORT]",
				name, set, GoogleExporter)
		}
		return "", nil
	}
	return TelemetryAPIEndpoint, nil
}

// exporters are the OTEL_TRACES_EXPORTER and OTEL_METRICS_EXPORTER values Setup knows:
// autoexport's and [GoogleExporter] ("" is autoexport's default). autoexport (v0.72.0, see
// [autoexport.Version]) exposes neither its exporter names nor its OTLP protocols: its registry
// and its protocol switch are unexported, and RegisterSpanExporter panics on a known name rather
// than reporting it. So these lists copy its documentation, and TestAutoexportLists fails when
// autoexport's version changes or it stops accepting a name listed here.
var exporters = map[string][]string{
	"OTEL_TRACES_EXPORTER":  {"", "otlp", "console", "none", GoogleExporter},
	"OTEL_METRICS_EXPORTER": {"", "otlp", "console", "prometheus", "none", GoogleExporter},
}

// CheckEnv reports what [Setup] would refuse in the OTEL_* environment, without building an
// exporter: an unknown exporter name or OTLP protocol, and for [GoogleExporter] a plaintext
// endpoint, no Application Default Credentials, or metrics without a location. A tool that
// writes before it sets up telemetry calls it first (couponctl demo), so that a bad setting
// leaves nothing half-written.
func CheckEnv(ctx context.Context) error {
	res, err := newResource(ctx)
	if err != nil {
		return err
	}
	return checkEnv(ctx, res)
}

// protocols are the OTEL_EXPORTER_OTLP[_<signal>]_PROTOCOL values autoexport accepts ("" is its
// default, http/protobuf); copied like [exporters].
var protocols = []string{"", "grpc", "http/protobuf"}

// checkEnv is [CheckEnv] with the resource already built. Values are compared whole, as
// autoexport reads them: one exporter per signal, no spaces.
func checkEnv(ctx context.Context, res *resource.Resource) error {
	for _, env := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"} {
		if v := os.Getenv(env); !slices.Contains(protocols, v) {
			return fmt.Errorf("telemetry: %s=%q: not an OTLP protocol (grpc, http/protobuf)", env, v)
		}
	}
	for _, env := range []string{"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"} {
		name := os.Getenv(env)
		if !slices.Contains(exporters[env], name) {
			return fmt.Errorf("telemetry: %s=%q: not an exporter (%s)", env, name, strings.Join(exporters[env][1:], ", "))
		}
		if name != GoogleExporter {
			continue
		}
		if _, _, err := googleExport(ctx, strings.TrimSuffix(strings.TrimPrefix(env, "OTEL_"), "_EXPORTER")); err != nil {
			return fmt.Errorf("telemetry: %s=%s: %w", env, name, err)
		}
	}
	return checkGoogleLocation(res)
}

// locationKeys are the resource attributes Cloud Monitoring takes a metric's location from, in
// its order (Telemetry API reference, v1.metrics, "Prometheus mapping": location is required).
var locationKeys = []attribute.Key{"location", semconv.CloudAvailabilityZoneKey, semconv.CloudRegionKey}

// checkGoogleLocation refuses, when OTEL_METRICS_EXPORTER is [GoogleExporter], a resource with
// no location: the Telemetry API would refuse every metric. On Google Cloud the detector finds
// cloud.region; elsewhere OTEL_RESOURCE_ATTRIBUTES must give one.
func checkGoogleLocation(res *resource.Resource) error {
	if os.Getenv("OTEL_METRICS_EXPORTER") != GoogleExporter {
		return nil
	}
	for _, k := range locationKeys {
		if v, ok := res.Set().Value(k); ok && v.AsString() != "" {
			return nil
		}
	}
	return fmt.Errorf("telemetry: OTEL_METRICS_EXPORTER=%s: the resource has no cloud.region, without which Cloud Monitoring "+
		"refuses every metric; it is detected on Google Cloud, elsewhere set OTEL_RESOURCE_ATTRIBUTES=cloud.region=REGION", GoogleExporter)
}
