// Package telemetry sets up OpenTelemetry traces and metrics and the structured log for every
// entry point (the functions' mains, `couponctl serve`, reconcile in couponops and couponctl, the
// demo), and holds the metric instruments of coupon-api (docs/api.md, "Telemetry"; docs/operations.md).
//
//   - Exporters come from the standard OTEL_* environment through
//     go.opentelemetry.io/contrib/exporters/autoexport (OTEL_TRACES_EXPORTER,
//     OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL including
//     http/protobuf, OTEL_BSP_SCHEDULE_DELAY, OTEL_METRIC_EXPORT_INTERVAL, OTEL_TRACES_SAMPLER,
//     OTEL_SERVICE_NAME). With neither an exporter nor an OTLP endpoint set, nothing is
//     exported, so local runs stay quiet, and no span is made unless a span processor is
//     added ([WithSpanProcessor]): logs and the outbox carry the caller's trace when one came.
//   - The resource is detected on Google Cloud (go.opentelemetry.io/contrib/detectors/gcp).
//   - Incoming trace context is W3C traceparent, or Cloud Run's X-Cloud-Trace-Context when
//     traceparent is absent.
//   - Spans wait for export in a bounded queue (the SDK's batch span processor, 2,048 spans by
//     default, OTEL_BSP_MAX_QUEUE_SIZE) that drops when full: an unreachable collector never
//     blocks or fails a request.
//   - The default slog logger writes JSON in Cloud Logging's structured shape (see [NewLogger]).
package telemetry

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	//lint:ignore SA1019 the W3C propagator cannot read X-Cloud-Trace-Context, which the contract requires
	gcppropagator "github.com/GoogleCloudPlatform/opentelemetry-operations-go/propagator"
	"go.opentelemetry.io/contrib/detectors/gcp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// DefaultServiceName names the service when neither OTEL_SERVICE_NAME nor Cloud Run's
// K_SERVICE says otherwise.
const DefaultServiceName = "coupon-api"

// Option adds to what [Setup] builds; the deployed functions use none.
type Option func(*options)

type options struct {
	spanProcessors []sdktrace.SpanProcessor
	metricReaders  []sdkmetric.Reader
	logWriter      io.Writer
}

// WithSpanProcessor adds a span processor beside the exporter from the environment (the demo's
// in-memory span tree, tests).
func WithSpanProcessor(p sdktrace.SpanProcessor) Option {
	return func(o *options) { o.spanProcessors = append(o.spanProcessors, p) }
}

// WithMetricReader adds a metric reader beside the one from the environment (the demo's totals,
// tests).
func WithMetricReader(r sdkmetric.Reader) Option {
	return func(o *options) { o.metricReaders = append(o.metricReaders, r) }
}

// WithLogWriter sends the structured log to w instead of stderr.
func WithLogWriter(w io.Writer) Option {
	return func(o *options) { o.logWriter = w }
}

// Setup installs the global tracer provider, meter provider, propagator and default slog logger,
// once per process, before any request is served. It returns shutdown, which flushes the spans
// and metrics still queued and stops the exporters; call it on exit with a bounded context.
//
// Errors: an OTEL_* variable autoexport refuses (an unknown exporter or protocol), and for
// [GoogleExporter] a plaintext endpoint, no Application Default Credentials, or (metrics) a
// resource without a location. A setting the process cannot honour stops start-up, as a bad
// database setting does, so that a misconfigured revision never takes traffic; an export that
// fails later never affects a request.
func Setup(ctx context.Context, opts ...Option) (shutdown func(context.Context) error, err error) {
	o := options{logWriter: os.Stderr}
	for _, opt := range opts {
		opt(&o)
	}
	res, err := newResource(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkEnv(ctx, res); err != nil {
		return nil, err
	}

	reader, err := autoexport.NewMetricReader(ctx, metricFallback()...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: metrics exporter: %w", err)
	}
	mpOpts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	if reader != nil && !autoexport.IsNoneMetricReader(reader) {
		mpOpts = append(mpOpts, sdkmetric.WithReader(reader))
	}
	for _, r := range o.metricReaders {
		mpOpts = append(mpOpts, sdkmetric.WithReader(r))
	}

	// The meter provider is global before the span processor is made, so that the SDK's own
	// metrics (OTEL_GO_X_OBSERVABILITY: spans dropped on a full queue) go to it.
	mp := sdkmetric.NewMeterProvider(mpOpts...)
	otel.SetMeterProvider(mp)

	tp, shutdownTraces, err := newTracerProvider(ctx, res, o.spanProcessors)
	if err != nil {
		return nil, errors.Join(err, mp.Shutdown(ctx))
	}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(Propagator())
	logger := NewLogger(o.logWriter, projectID(res))
	slog.SetDefault(logger)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("telemetry: export failed; the data is dropped, requests are unaffected", "err", err)
	}))
	return func(ctx context.Context) error {
		// Side by side, so that a slow span export cannot use up the metrics' time: the
		// alerts read the metrics.
		traces := make(chan error, 1)
		go func() { traces <- shutdownTraces(ctx) }()
		metrics := mp.Shutdown(ctx)
		return errors.Join(<-traces, metrics)
	}, nil
}

// newTracerProvider returns the tracer provider for the exporter from the environment and
// processors, and what flushes and stops it. With neither, nothing would ever read a span, so
// none is made: the no-op provider's spans carry the caller's span context (the request's
// traceparent, or X-Cloud-Trace-Context) through unchanged, which the log lines and the outbox's
// trace_parent then carry, and record nothing.
func newTracerProvider(ctx context.Context, res *resource.Resource, processors []sdktrace.SpanProcessor) (trace.TracerProvider, func(context.Context) error, error) {
	spanExporter, err := autoexport.NewSpanExporter(ctx, spanFallback()...)
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: traces exporter: %w", err)
	}
	// The batcher is non-blocking by default: a full queue drops spans rather than wait.
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if spanExporter != nil && !autoexport.IsNoneSpanExporter(spanExporter) {
		tpOpts = append(tpOpts, sdktrace.WithBatcher(spanExporter))
	} else if len(processors) == 0 {
		return tracenoop.NewTracerProvider(), func(context.Context) error { return nil }, nil
	}
	for _, p := range processors {
		tpOpts = append(tpOpts, sdktrace.WithSpanProcessor(p))
	}
	tp := sdktrace.NewTracerProvider(tpOpts...)
	return tp, tp.Shutdown, nil
}

// Propagator reads and writes W3C traceparent and tracestate, and reads Cloud Run's
// X-Cloud-Trace-Context when no traceparent came (it is never written: LINE has no use for it).
// The later propagator wins, so traceparent takes precedence when both are present.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(
		//lint:ignore SA1019 see the import: deprecated in favour of traceparent, still sent by callers
		gcppropagator.CloudTraceOneWayPropagator{},
		propagation.TraceContext{},
	)
}

// spanFallback and metricFallback choose what an unset OTEL_TRACES_EXPORTER or
// OTEL_METRICS_EXPORTER means: autoexport's default, OTLP, when an OTLP endpoint is configured
// for the signal; otherwise no exporter at all (nil), rather than OTLP to localhost, which would
// fail on every export of a local run.
func spanFallback() []autoexport.SpanOption {
	if otlpEndpointSet("TRACES") {
		return nil
	}
	return []autoexport.SpanOption{autoexport.WithFallbackSpanExporter(
		func(context.Context) (sdktrace.SpanExporter, error) { return nil, nil })}
}

func metricFallback() []autoexport.MetricOption {
	if otlpEndpointSet("METRICS") {
		return nil
	}
	return []autoexport.MetricOption{autoexport.WithFallbackMetricReader(
		func(context.Context) (sdkmetric.Reader, error) { return nil, nil })}
}

// otlpEndpointSet reports whether OTEL_EXPORTER_OTLP_ENDPOINT or the signal's own
// OTEL_EXPORTER_OTLP_<signal>_ENDPOINT is set.
func otlpEndpointSet(signal string) bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
}

// newResource describes this process: service.name (OTEL_SERVICE_NAME, else K_SERVICE, else
// [DefaultServiceName]), OTEL_RESOURCE_ATTRIBUTES, the SDK, on Google Cloud the project,
// platform, region and instance, and the two attributes Google's Telemetry API reads (see
// [withGoogleIdentity]).
func newResource(ctx context.Context) (*resource.Resource, error) {
	name := DefaultServiceName
	if k := os.Getenv("K_SERVICE"); k != "" {
		name = k
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(name)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
		resource.WithDetectors(gcp.NewDetector()),
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	// A partial resource (a detector that could not read everything) is still usable.
	return withGoogleIdentity(res)
}

// attrGCPProjectID is the resource attribute Google's Telemetry API takes the destination
// project from (Cloud Trace docs, "Migrate from the Trace exporter to the OTLP endpoint").
const attrGCPProjectID = attribute.Key("gcp.project_id")

// withGoogleIdentity adds, where res lacks them, gcp.project_id ([projectID]) and
// service.instance.id: the instance the detector found on Google Cloud (faas.instance), else a
// random id. The Telemetry API files metrics under the prometheus_target resource, whose
// instance label comes from service.instance.id; without one per instance, the cumulative
// series of two Cloud Run instances would collide.
func withGoogleIdentity(res *resource.Resource) (*resource.Resource, error) {
	var extra []attribute.KeyValue
	if _, ok := res.Set().Value(attrGCPProjectID); !ok {
		if p := projectID(res); p != "" {
			extra = append(extra, attrGCPProjectID.String(p))
		}
	}
	if _, ok := res.Set().Value(semconv.ServiceInstanceIDKey); !ok {
		id, ok := res.Set().Value(semconv.FaaSInstanceKey)
		if ok && id.AsString() != "" {
			extra = append(extra, semconv.ServiceInstanceID(id.AsString()))
		} else {
			extra = append(extra, semconv.ServiceInstanceID(rand.Text()))
		}
	}
	merged, err := resource.Merge(res, resource.NewSchemaless(extra...))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return merged, nil
}

// projectID is the Google Cloud project the logs and traces belong to: GOOGLE_CLOUD_PROJECT,
// else the project detected on Google Cloud (cloud.account.id), else "".
func projectID(res *resource.Resource) string {
	if p := os.Getenv("GOOGLE_CLOUD_PROJECT"); p != "" {
		return p
	}
	if res == nil {
		return ""
	}
	if v, ok := res.Set().Value(semconv.CloudAccountIDKey); ok {
		return v.AsString()
	}
	return ""
}
