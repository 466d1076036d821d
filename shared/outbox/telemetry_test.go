package outbox_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/gcpfake"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox"
	"github.com/mops/coupon-api/shared/telemetry"
)

// TestPushSpansLinkToTheIssuingTrace: a relay run's push spans are children of the run's span;
// the push of a coupon issued inside a trace links to that issuance's span (through the
// traceparent stored on its outbox row), a row written without a trace has no link; each push
// has otelhttp's client span as a child and LINE's status on it; the pushes are counted by
// status; no member id is an attribute.
func TestPushSpansLinkToTheIssuingTrace(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	reader := sdkmetric.NewManualReader()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	t.Cleanup(func() {
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
	})

	b := setup(t, 1) // one row written without a trace (trace_parent NULL)
	ctx := context.Background()
	if err := campaign.Create(ctx, b.pool, campaign.Campaign{ID: "TRACED", DiscountYen: 500, BudgetYen: 5000}); err != nil {
		t.Fatal(err)
	}
	svc, err := issuance.New(b.pool, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const member = "member-traced-1"
	if _, err := b.pool.Exec(ctx, `INSERT INTO member_line_accounts (member_id, line_user_id) VALUES ($1, 'U' || md5($1))`,
		member); err != nil {
		t.Fatal(err)
	}
	gatewayCtx, gateway := tp.Tracer("test").Start(ctx, "gateway")
	out, err := svc.Issue(gatewayCtx, member, "TRACED")
	gateway.End()
	if err != nil || out.Result != issuance.ResultIssued {
		t.Fatalf("Issue: %+v %v, want ISSUED", out, err)
	}
	var issuanceSpan trace.SpanContext
	for _, s := range spans.GetSpans() {
		if s.Name == issuance.SpanName {
			issuanceSpan = s.SpanContext
		}
	}
	if !issuanceSpan.IsValid() || issuanceSpan.TraceID() != gateway.SpanContext().TraceID() {
		t.Fatalf("issuance span %v not in the gateway's trace %s", issuanceSpan, gateway.SpanContext().TraceID())
	}

	r := newRelay(t, b)
	runCtx, runSpan := tp.Tracer("test").Start(ctx, "RelayOutbox", trace.WithSpanKind(trace.SpanKindServer))
	res, err := r.Run(runCtx, 0)
	runSpan.End()
	if err != nil || res.Sent != 2 {
		t.Fatalf("Run: %+v %v, want 2 sent", res, err)
	}

	var pushes []tracetest.SpanStub
	clients := map[trace.SpanID]tracetest.SpanStub{} // otelhttp's, by parent
	for _, s := range spans.GetSpans() {
		switch {
		case s.Name == outbox.PushSpanName:
			pushes = append(pushes, s)
		case s.SpanKind == trace.SpanKindClient:
			clients[s.Parent.SpanID()] = s
		}
	}
	if len(pushes) != 2 {
		t.Fatalf("%d push spans, want 2", len(pushes))
	}
	linked := 0
	for _, p := range pushes {
		if p.Parent.SpanID() != runSpan.SpanContext().SpanID() || p.SpanContext.TraceID() != runSpan.SpanContext().TraceID() {
			t.Errorf("push span %s: parent %s, want the run's span %s", p.SpanContext.SpanID(), p.Parent.SpanID(),
				runSpan.SpanContext().SpanID())
		}
		a := map[attribute.Key]attribute.Value{}
		for _, kv := range p.Attributes {
			a[kv.Key] = kv.Value
			if strings.Contains(kv.Value.String(), member) {
				t.Errorf("member id in clear in push attribute %s", kv.Key)
			}
		}
		if a[outbox.AttrLINEStatus].AsInt64() != http.StatusOK {
			t.Errorf("push span attributes %v: want %s=200", p.Attributes, outbox.AttrLINEStatus)
		}
		c, ok := clients[p.SpanContext.SpanID()]
		if !ok {
			t.Errorf("push span %s has no HTTP client span", p.SpanContext.SpanID())
		} else if status := statusOf(c); status != http.StatusOK {
			t.Errorf("client span status %d, want 200", status)
		}
		switch len(p.Links) {
		case 0:
		case 1:
			l := p.Links[0].SpanContext
			if l.TraceID() != issuanceSpan.TraceID() || l.SpanID() != issuanceSpan.SpanID() {
				t.Errorf("push links to %s/%s, want the issuance span %s/%s", l.TraceID(), l.SpanID(),
					issuanceSpan.TraceID(), issuanceSpan.SpanID())
			}
			linked++
		default:
			t.Errorf("push span has %d links", len(p.Links))
		}
	}
	if linked != 1 {
		t.Errorf("%d pushes link to an issuing trace, want 1 (the traced coupon; the seeded row has none)", linked)
	}
	if got := b.stub.Stats().Accepted; got != 2 {
		t.Errorf("LINE accepted %d pushes, want 2", got)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	if err := gcpfake.CheckMetrics(rm); err != nil {
		t.Errorf("Google's Telemetry API would reject: %v", err)
	}
	var pushed int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != telemetry.MetricLINEPushes {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := p.Attributes.Value("http.response.status_code"); v.AsInt64() == http.StatusOK {
					pushed += p.Value
				}
			}
		}
	}
	if pushed != 2 {
		t.Errorf("%s{200}: %d, want 2", telemetry.MetricLINEPushes, pushed)
	}
}

func statusOf(s tracetest.SpanStub) int64 {
	for _, kv := range s.Attributes {
		if kv.Key == "http.response.status_code" {
			return kv.Value.AsInt64()
		}
	}
	return 0
}
