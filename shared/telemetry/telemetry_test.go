package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/mops/coupon-api/shared/telemetry"
)

// TestLogLineCarriesTrace: a line logged with a span's context has Cloud Logging's fields,
// the trace as projects/PROJECT/traces/TRACE_ID and the span id; a line without one has none.
func TestLogLineCarriesTrace(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	var buf bytes.Buffer
	log := telemetry.NewLogger(&buf, "my-project")
	log.WarnContext(ctx, "with trace", "n", 1)
	log.Info("without trace")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2: %q", len(lines), buf.String())
	}
	var with, without map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &with); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &without); err != nil {
		t.Fatal(err)
	}
	sc := span.SpanContext()
	want := map[string]any{
		"severity":              "WARNING",
		"message":               "with trace",
		telemetry.LogKeyTrace:   "projects/my-project/traces/" + sc.TraceID().String(),
		telemetry.LogKeySpanID:  sc.SpanID().String(),
		telemetry.LogKeySampled: true,
		"n":                     float64(1),
	}
	for k, v := range want {
		if with[k] != v {
			t.Errorf("%s = %v, want %v (line %s)", k, with[k], v, lines[0])
		}
	}
	if _, ok := with["level"]; ok {
		t.Errorf("level left beside severity: %s", lines[0])
	}
	if without["severity"] != "INFO" || without[telemetry.LogKeyTrace] != nil {
		t.Errorf("line without a span: %s", lines[1])
	}
}

// TestPropagatorContinuesCloudRunAndW3C: the server continues X-Cloud-Trace-Context alone, and
// traceparent when both headers came.
func TestPropagatorContinuesCloudRunAndW3C(t *testing.T) {
	const cloudTrace = "105445aa7843bc8bf206b12000100000"
	const w3cTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	p := telemetry.Propagator()
	extract := func(h http.Header) trace.SpanContext {
		return trace.SpanContextFromContext(p.Extract(context.Background(), propagation.HeaderCarrier(h)))
	}
	h := http.Header{}
	h.Set("X-Cloud-Trace-Context", cloudTrace+"/1;o=1")
	if got := extract(h).TraceID().String(); got != cloudTrace {
		t.Errorf("X-Cloud-Trace-Context alone: trace %s, want %s", got, cloudTrace)
	}
	h.Set("traceparent", "00-"+w3cTrace+"-00f067aa0ba902b7-01")
	if got := extract(h).TraceID().String(); got != w3cTrace {
		t.Errorf("both headers: trace %s, want traceparent's %s", got, w3cTrace)
	}
}

// TestMemberHash: keyed, stable, and never the id.
func TestMemberHash(t *testing.T) {
	a, b := telemetry.MemberHash("member-1"), telemetry.MemberHash("member-2")
	if a == b || a != telemetry.MemberHash("member-1") || strings.Contains(a, "member") || len(a) != 32 {
		t.Errorf("MemberHash: %q, %q", a, b)
	}
}

// TestSetupQuietByDefault: with no OTEL_* exporter and no endpoint, Setup exports nothing (no
// exporter is even made); a span processor added still gets every span; Shutdown succeeds.
func TestSetupQuietByDefault(t *testing.T) {
	quietEnv(t)
	t.Setenv("GOOGLE_CLOUD_PROJECT", "p")
	restore := keepGlobals()
	defer restore()
	var logs bytes.Buffer
	reader := metric.NewManualReader()
	spans := tracetest.NewInMemoryExporter()
	shutdown, err := telemetry.Setup(context.Background(), telemetry.WithLogWriter(&logs),
		telemetry.WithMetricReader(reader), telemetry.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(spans)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := otel.Tracer("test").Start(context.Background(), "op")
	telemetry.Global().RecordIssuance(ctx, "C", "ISSUED", 1, 0)
	span.End()
	if !span.SpanContext().IsValid() || len(spans.GetSpans()) != 1 {
		t.Errorf("span %v, %d recorded", span.SpanContext(), len(spans.GetSpans()))
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	if len(rm.ScopeMetrics) == 0 {
		t.Error("no metrics collected")
	}
	if err := shutdown(context.Background()); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestSetupMakesNoSpanWhenNothingExports: with no exporter and no span processor, Setup installs
// a tracer provider that makes no span: a span started under a caller's trace records nothing,
// allocates no more than the context that carries it, and passes the caller's span context
// through unchanged, so that log lines and the outbox's trace_parent still carry the caller's
// trace.
func TestSetupMakesNoSpanWhenNothingExports(t *testing.T) {
	quietEnv(t)
	restore := keepGlobals()
	defer restore()
	shutdown, err := telemetry.Setup(context.Background(), telemetry.WithLogWriter(&bytes.Buffer{}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = shutdown(context.Background()) }()
	h := http.Header{}
	h.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	parent := otel.GetTextMapPropagator().Extract(context.Background(), propagation.HeaderCarrier(h))
	tracer := otel.Tracer("test")
	ctx, span := tracer.Start(parent, "op", trace.WithAttributes(attribute.String("k", "v")))
	if span.IsRecording() {
		t.Error("the span records, with nothing to export it")
	}
	span.End()
	if got, want := trace.SpanContextFromContext(ctx), trace.SpanContextFromContext(parent); !got.Equal(want) {
		t.Errorf("span context %v, want the caller's %v", got, want)
	}
	allocs := testing.AllocsPerRun(100, func() {
		_, span := tracer.Start(parent, "op")
		span.SetAttributes(attribute.Int("n", 1))
		span.End()
	})
	if allocs > maxNoSpanAllocs {
		t.Errorf("a span start and end allocate %.0f times, want at most %d (the context and its span)", allocs, maxNoSpanAllocs)
	}
}

// maxNoSpanAllocs is what a span start costs when no span is made: the context holding the
// caller's span context, and that span context boxed as a trace.Span.
const maxNoSpanAllocs = 2

// quietEnv unsets every OTEL_* variable that would make Setup export.
func quietEnv(t *testing.T) {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		t.Setenv(k, "")
	}
}

// keepGlobals returns a function that puts no-op global providers and the default logger back,
// so a test's SDK does not outlive it.
func keepGlobals() func() {
	logger := slog.Default()
	return func() {
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
		slog.SetDefault(logger)
	}
}
