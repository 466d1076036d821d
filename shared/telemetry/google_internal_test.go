package telemetry

import (
	"context"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/contrib/exporters/autoexport"

	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// TestGoogleEndpoint: with no endpoint set, otlp_google goes to Google's Telemetry API; an
// https endpoint (the signal's own first) is left to the exporter; plaintext is refused,
// naming the variable.
func TestGoogleEndpoint(t *testing.T) {
	for _, tc := range []struct {
		env            map[string]string
		want, errWants string
	}{
		{env: nil, want: TelemetryAPIEndpoint},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector.example:4317"}, want: ""},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://a:443",
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4317"}, want: ""},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, errWants: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "telemetry.googleapis.com:443"},
			errWants: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}, errWants: "OTEL_EXPORTER_OTLP_TRACES_INSECURE"},
	} {
		for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
			"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE"} {
			t.Setenv(k, tc.env[k])
		}
		got, err := googleEndpoint("TRACES")
		switch {
		case tc.errWants != "" && (err == nil || !strings.Contains(err.Error(), tc.errWants)):
			t.Errorf("%v: %q, %v; want an error naming %s", tc.env, got, err, tc.errWants)
		case tc.errWants == "" && (err != nil || got != tc.want):
			t.Errorf("%v: %q, %v; want %q", tc.env, got, err, tc.want)
		}
	}
}

// TestGoogleLocation: with metrics going to Google, a resource without cloud.region (or a zone,
// or location) is refused with the variable that fixes it; with one, or with another metrics
// exporter, it passes.
func TestGoogleLocation(t *testing.T) {
	bare := resource.NewSchemaless(semconv.ServiceName("s"))
	inRegion := resource.NewSchemaless(semconv.ServiceName("s"), semconv.CloudRegion("asia-northeast1"))
	t.Setenv("OTEL_METRICS_EXPORTER", GoogleExporter)
	if err := checkGoogleLocation(bare); err == nil || !strings.Contains(err.Error(), "OTEL_RESOURCE_ATTRIBUTES=cloud.region=") {
		t.Errorf("no location: %v, want an error naming OTEL_RESOURCE_ATTRIBUTES=cloud.region=", err)
	}
	if err := checkGoogleLocation(inRegion); err != nil {
		t.Errorf("cloud.region set: %v", err)
	}
	t.Setenv("OTEL_METRICS_EXPORTER", "otlp")
	if err := checkGoogleLocation(bare); err != nil {
		t.Errorf("plain otlp: %v", err)
	}
}

// TestAutoexportLists guards the copies of autoexport's lists in [exporters] and [protocols]:
// autoexport builds a span exporter or metric reader for every name listed (but ours, which
// needs credentials) under every protocol listed, and refuses a protocol not listed. It fails
// too when autoexport's version changes, to have the copies checked against its documentation.
func TestAutoexportLists(t *testing.T) {
	if autoexport.Version != "0.72.0" {
		t.Errorf("autoexport %s: check exporters and protocols in google.go against its docs, then update this version",
			autoexport.Version)
	}
	ctx := context.Background()
	t.Setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
	t.Setenv("OTEL_EXPORTER_PROMETHEUS_PORT", "0")
	build := map[string]func() (func(context.Context) error, error){
		"OTEL_TRACES_EXPORTER": func() (func(context.Context) error, error) {
			e, err := autoexport.NewSpanExporter(ctx)
			if err != nil {
				return nil, err
			}
			return e.Shutdown, nil
		},
		"OTEL_METRICS_EXPORTER": func() (func(context.Context) error, error) {
			r, err := autoexport.NewMetricReader(ctx)
			if err != nil {
				return nil, err
			}
			return r.Shutdown, nil
		},
	}
	for env, names := range exporters {
		for _, name := range names {
			if name == "" || name == GoogleExporter {
				continue
			}
			for _, proto := range append(slices.Clone(protocols), "http/json") {
				t.Setenv(env, name)
				t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", proto)
				shutdown, err := build[env]()
				refused := name == "otlp" && !slices.Contains(protocols, proto)
				switch {
				case refused && err == nil:
					t.Errorf("%s=%s, protocol %q: autoexport accepts a protocol not in protocols", env, name, proto)
				case !refused && err != nil:
					t.Errorf("%s=%s, protocol %q: autoexport refuses it: %v", env, name, proto, err)
				}
				if err == nil {
					_ = shutdown(ctx)
				}
			}
		}
	}
}
