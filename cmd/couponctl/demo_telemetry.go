package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/mops/coupon-api/internal/ops/opsverbs"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox"
	"github.com/mops/coupon-api/shared/telemetry"
)

// demoTelemetry keeps the demo's spans and metrics in memory (beside any exporter the OTEL_*
// environment names) to show them after the report.
type demoTelemetry struct {
	spans    *tracetest.InMemoryExporter
	metrics  *sdkmetric.ManualReader
	shutdown func(context.Context) error
}

// The demo's --telemetry modes.
const (
	telemetryShow   = "show"   // in memory, printed after the report, and exported as OTEL_* says
	telemetryExport = "export" // only exported as OTEL_* says, as a deployed function does
	telemetryOff    = "off"    // none: the baseline of the overhead measurement
)

// checkDemoTelemetryMode refuses an unknown --telemetry mode.
func checkDemoTelemetryMode(mode string) error {
	switch mode {
	case telemetryOff, telemetryShow, telemetryExport:
		return nil
	}
	return fmt.Errorf("--telemetry %q: want %s, %s or %s", mode, telemetryShow, telemetryExport, telemetryOff)
}

// checkDemoTelemetry refuses, unless mode is off, what telemetry.Setup would refuse in the
// OTEL_* environment: before the demo writes anything.
func checkDemoTelemetry(ctx context.Context, mode string) error {
	if mode == telemetryOff {
		return nil
	}
	return telemetry.CheckEnv(ctx)
}

// startDemoTelemetry sets up telemetry for the demo's process as mode says (checked by
// [checkDemoTelemetry]), the functions' log lines going to logs (the demo's log file: one line
// per request would drown the report); nil for off.
func startDemoTelemetry(cmd *cobra.Command, mode string, logs io.Writer) (*demoTelemetry, error) {
	opts := []telemetry.Option{telemetry.WithLogWriter(logs)}
	t := &demoTelemetry{}
	switch mode {
	case telemetryOff:
		return nil, nil
	case telemetryShow:
		t.spans, t.metrics = tracetest.NewInMemoryExporter(), sdkmetric.NewManualReader()
		opts = append(opts, telemetry.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(t.spans)),
			telemetry.WithMetricReader(t.metrics))
	}
	var err error
	t.shutdown, err = telemetry.Setup(cmd.Context(), opts...)
	return t, err
}

// close flushes what the environment's exporters still hold.
func (t *demoTelemetry) close(cmd *cobra.Command) {
	if t != nil {
		opsverbs.FlushTelemetry(cmd, t.shutdown)
	}
}

// report prints the span tree of the slowest issuance, with the push that links to it, and the
// metric totals.
func (t *demoTelemetry) report(ctx context.Context, w io.Writer) error {
	if t == nil || t.spans == nil {
		return nil
	}
	spans := t.spans.GetSpans()
	slowest, slowestIssued := slowestIssuances(spans)
	if slowest != nil {
		fmt.Fprintf(w, "\nTelemetry: the slowest issuance, trace %s (offset from the request's start, duration, span):\n",
			slowest.SpanContext.TraceID())
		writeSpanTree(w, spans, slowest)
	}
	if slowestIssued != nil && slowestIssued != slowest {
		fmt.Fprintf(w, "\nTelemetry: the slowest ISSUED issuance, trace %s, and its LINE push:\n", slowestIssued.SpanContext.TraceID())
		writeSpanTree(w, spans, slowestIssued)
	}
	var rm metricdata.ResourceMetrics
	if err := t.metrics.Collect(ctx, &rm); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nTelemetry: metric totals")
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != telemetry.ScopeName {
			continue
		}
		sort.Slice(sm.Metrics, func(i, j int) bool { return sm.Metrics[i].Name < sm.Metrics[j].Name })
		for _, m := range sm.Metrics {
			writeMetric(w, m)
		}
	}
	return nil
}

// slowestIssuances returns the longest issuance span, and the longest that issued a coupon.
func slowestIssuances(spans tracetest.SpanStubs) (slowest, slowestIssued *tracetest.SpanStub) {
	for i := range spans {
		s := &spans[i]
		if s.Name != issuance.SpanName {
			continue
		}
		if slowest == nil || dur(*s) > dur(*slowest) {
			slowest = s
		}
		if resultOf(*s) == string(issuance.ResultIssued) && (slowestIssued == nil || dur(*s) > dur(*slowestIssued)) {
			slowestIssued = s
		}
	}
	return slowest, slowestIssued
}

func resultOf(s tracetest.SpanStub) string {
	for _, a := range s.Attributes {
		if a.Key == telemetry.AttrResult {
			return a.Value.AsString()
		}
	}
	return ""
}

func dur(s tracetest.SpanStub) time.Duration { return s.EndTime.Sub(s.StartTime) }

// writeSpanTree prints the trace of target from its root, each span's children in start order,
// then the push spans that link to target.
func writeSpanTree(w io.Writer, spans tracetest.SpanStubs, target *tracetest.SpanStub) {
	children := map[string][]tracetest.SpanStub{}
	var root *tracetest.SpanStub
	var pushes []tracetest.SpanStub
	for i, s := range spans {
		if s.SpanContext.TraceID() == target.SpanContext.TraceID() {
			if s.Parent.IsValid() {
				children[s.Parent.SpanID().String()] = append(children[s.Parent.SpanID().String()], s)
			} else {
				root = &spans[i]
			}
		}
		if s.Name == outbox.PushSpanName {
			for _, l := range s.Links {
				if l.SpanContext.SpanID() == target.SpanContext.SpanID() {
					pushes = append(pushes, s)
				}
			}
		}
	}
	if root == nil {
		root = target
	}
	var walk func(s tracetest.SpanStub, depth int)
	walk = func(s tracetest.SpanStub, depth int) {
		fmt.Fprintf(w, "  %8.2f ms %8.2f ms  %s%s\n", ms64(s.StartTime.Sub(root.StartTime)), ms64(dur(s)),
			strings.Repeat("  ", depth), spanLabel(s))
		kids := children[s.SpanContext.SpanID().String()]
		sort.Slice(kids, func(i, j int) bool { return kids[i].StartTime.Before(kids[j].StartTime) })
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	walk(*root, 0)
	for _, p := range pushes {
		fmt.Fprintf(w, "  linked from the relay: %s (trace %s, parent span %s) %.2f ms\n",
			spanLabel(p), p.SpanContext.TraceID(), p.Parent.SpanID(), ms64(dur(p)))
	}
}

// spanLabel is a span's name with what tells it apart: the statement, the result, the events.
func spanLabel(s tracetest.SpanStub) string {
	label := s.Name
	for _, a := range s.Attributes {
		switch a.Key {
		case semconv.DBQueryTextKey:
			label += ": " + strings.Join(strings.Fields(a.Value.AsString()), " ")
			if len(label) > 90 {
				label = label[:87] + "..."
			}
		case otelpgx.PrepareStmtNameKey: // pgx prepares a statement on its first use on a connection
			label = "(prepare) " + label
		case telemetry.AttrResult, telemetry.AttrAttempts, outbox.AttrLINEStatus, semconv.HTTPResponseStatusCodeKey:
			label += fmt.Sprintf(" %s=%s", a.Key, a.Value.String())
		}
	}
	for _, e := range s.Events {
		if e.Name == issuance.EventAttemptFailed {
			label += " [" + e.Name + ": " + attrString(e.Attributes) + "]"
		}
	}
	return label
}

func attrString(attrs []attribute.KeyValue) string {
	parts := make([]string, len(attrs))
	for i, a := range attrs {
		parts[i] = fmt.Sprintf("%s=%s", a.Key, a.Value.String())
	}
	return strings.Join(parts, " ")
}

// writeMetric prints one metric's points: sums and gauges by attribute set, histograms as
// count and mean.
func writeMetric(w io.Writer, m metricdata.Metrics) {
	var lines []string
	line := func(attrs attribute.Set, value string) {
		lines = append(lines, fmt.Sprintf("  %-34s %-52s %s\n", m.Name, attrString(attrs.ToSlice()), value))
	}
	defer func() {
		sort.Strings(lines)
		for _, l := range lines {
			fmt.Fprint(w, l)
		}
	}()
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			line(p.Attributes, fmt.Sprintf("%d %s", p.Value, m.Unit))
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			line(p.Attributes, fmt.Sprintf("%d %s", p.Value, m.Unit))
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			line(p.Attributes, fmt.Sprintf("%.3f %s", p.Value, m.Unit))
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			maxValue, _ := p.Max.Value()
			line(p.Attributes, fmt.Sprintf("n=%d mean %.2f %s max %d", p.Count, float64(p.Sum)/float64(max(1, p.Count)), m.Unit, maxValue))
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			line(p.Attributes, fmt.Sprintf("n=%d mean %.2f %s", p.Count, p.Sum/float64(max(1, p.Count)), m.Unit))
		}
	}
}

func ms64(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
