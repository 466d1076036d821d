package issue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/gcpfake"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/telemetry"
)

// traced is IssueCoupon served as deployed (otelhttp around the handler, otelpgx on the pool)
// with telemetry recorded in memory: every span as it ends, metrics on demand, log lines.
type traced struct {
	h       http.Handler
	pool    *pgxpool.Pool
	spans   *tracetest.InMemoryExporter
	metrics *sdkmetric.ManualReader
	logs    *syncbuf.Buffer
}

const testProject = "test-project"

// newTraced installs in-memory telemetry as the global providers for the test (put back to
// no-op when it ends; so these tests do not run in parallel) and serves IssueCoupon with cfg on
// a fresh database holding OPEN (1,000 yen, budget 10,000 yen).
func newTraced(t *testing.T, cfg issuance.Config) *traced {
	t.Helper()
	ctx := context.Background()
	tr := &traced{spans: tracetest.NewInMemoryExporter(), metrics: sdkmetric.NewManualReader(), logs: &syncbuf.Buffer{}}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tr.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(tr.metrics))
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	logger := slog.Default() // telemetry.Setup replaces it
	t.Cleanup(func() {
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
		slog.SetDefault(logger)
	})

	url := pgtest.URL(t)
	owner, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.SetClock(t, owner, now) // before the traced pool: no span of it
	_ = owner.Close(ctx)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 4
	pcfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(tp), otelpgx.WithMeterProvider(mp))
	tr.pool, err = pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.pool.Close)
	if err := campaign.Create(ctx, tr.pool, campaign.Campaign{ID: "OPEN", DiscountYen: 1000, BudgetYen: 10000}); err != nil {
		t.Fatal(err)
	}
	h, err := newHandler(tr.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.log = telemetry.NewLogger(tr.logs, testProject)
	tr.h = instrument(h)
	return tr
}

// callerTraceparent is the app gateway's span, which IssueCoupon's server span continues.
const (
	callerTraceID    = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpanID     = "00f067aa0ba902b7"
	callerTraceparnt = "00-" + callerTraceID + "-" + callerSpanID + "-01"
)

// issueAs sends one IssueCoupon request with the caller's traceparent and returns the result.
func (tr *traced) issueAs(t *testing.T, ctx context.Context, member string) (int, string) {
	t.Helper()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/IssueCoupon", strings.NewReader(ask(member, "OPEN")))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", callerTraceparnt)
	rec := httptest.NewRecorder()
	tr.h.ServeHTTP(rec, req)
	var body struct{ Result string }
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	return rec.Code, body.Result
}

// issuanceSpans returns the ended issuance spans, oldest first, and checks each one's family:
// the parent is the server span, which continues the caller's trace; the attempt's one call
// (otelpgx's batch span, its statements below it) is its child.
func (tr *traced) issuanceSpans(t *testing.T) []tracetest.SpanStub {
	t.Helper()
	all := tr.spans.GetSpans()
	byID := map[string]tracetest.SpanStub{}
	for _, s := range all {
		byID[s.SpanContext.SpanID().String()] = s
	}
	var out []tracetest.SpanStub
	for _, s := range all {
		if s.Name != issuance.SpanName {
			continue
		}
		out = append(out, s)
		server, ok := byID[s.Parent.SpanID().String()]
		if !ok || server.SpanKind.String() != "server" {
			t.Errorf("issuance span's parent %v is not the server span", s.Parent.SpanID())
			continue
		}
		if server.SpanContext.TraceID().String() != callerTraceID || server.Parent.SpanID().String() != callerSpanID {
			t.Errorf("server span trace %s parent %s: want the caller's %s / %s", server.SpanContext.TraceID(),
				server.Parent.SpanID(), callerTraceID, callerSpanID)
		}
		calls := 0
		for _, c := range all {
			if c.Parent.SpanID() == s.SpanContext.SpanID() && c.Name == "batch start" {
				calls++
			}
		}
		if attempts := attrs(s.Attributes)[telemetry.AttrAttempts].AsInt64(); int64(calls) != attempts {
			t.Errorf("issuance span has %d call spans for %d attempts, want one pipelined call per attempt", calls, attempts)
		}
	}
	return out
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestTelemetryIssuedAndAlreadyIssued: ISSUED then ALREADY_ISSUED make an issuance span each
// with campaign, result, attempts and month, inside the server span that continues the
// caller's trace, with one call per attempt as children; the metrics count both; each request logs
// one line carrying its trace; the member id appears nowhere.
func TestTelemetryIssuedAndAlreadyIssued(t *testing.T) {
	tr := newTraced(t, issuance.Config{})
	const member = "member-0000001"
	ctx := context.Background()
	for _, want := range []struct {
		status int
		result string
	}{{201, "ISSUED"}, {200, "ALREADY_ISSUED"}} {
		if status, result := tr.issueAs(t, ctx, member); status != want.status || result != want.result {
			t.Fatalf("answer %d %s, want %d %s", status, result, want.status, want.result)
		}
	}

	spans := tr.issuanceSpans(t)
	if len(spans) != 2 {
		t.Fatalf("%d issuance spans, want 2", len(spans))
	}
	// The month is the one the database stamped on the coupon issued: none on ALREADY_ISSUED.
	for i, want := range []struct{ result, month string }{{"ISSUED", "2026-09"}, {"ALREADY_ISSUED", ""}} {
		a := attrs(spans[i].Attributes)
		if a[telemetry.AttrCampaign].AsString() != "OPEN" || a[telemetry.AttrResult].AsString() != want.result ||
			a[telemetry.AttrAttempts].AsInt64() != 1 || a[telemetry.AttrMonth].AsString() != want.month {
			t.Errorf("span %d attributes %v, want OPEN %s 1 attempt month %q", i, spans[i].Attributes, want.result, want.month)
		}
		if len(spans[i].Events) != 0 {
			t.Errorf("span %d events %v, want none", i, spans[i].Events)
		}
	}

	points := collect(t, tr.metrics)
	for _, result := range []string{"ISSUED", "ALREADY_ISSUED"} {
		set := attribute.NewSet(telemetry.AttrCampaign.String("OPEN"), telemetry.AttrResult.String(result))
		if n := sumOf(points, telemetry.MetricIssuances, set); n != 1 {
			t.Errorf("%s{%s}: %d, want 1", telemetry.MetricIssuances, result, n)
		}
		if c, s := histogramOf(points, telemetry.MetricIssuanceAttempts, set); c != 1 || s != 1 {
			t.Errorf("%s{%s}: count %d sum %v, want 1 call of 1 attempt", telemetry.MetricIssuanceAttempts, result, c, s)
		}
		if c, _ := histogramOf(points, telemetry.MetricIssuanceDuration, set); c != 1 {
			t.Errorf("%s{%s}: count %d, want 1", telemetry.MetricIssuanceDuration, result, c)
		}
	}

	lines := logLines(t, tr.logs.String())
	if len(lines) != 2 {
		t.Fatalf("%d log lines, want one per request: %s", len(lines), tr.logs.String())
	}
	for i, l := range lines {
		wantTrace := "projects/" + testProject + "/traces/" + callerTraceID
		if l[telemetry.LogKeyTrace] != wantTrace || l["severity"] != "INFO" || l["campaign"] != "OPEN" ||
			l["member"] != telemetry.MemberHash(member) || l["attempts"] != 1.0 || l["duration_ms"] == nil {
			t.Errorf("log line %d: %v, want INFO with trace %s, campaign, hashed member, attempts, duration_ms", i, l, wantTrace)
		}
	}
	if l := lines[0]; l[telemetry.LogKeySpanID] == nil || l["result"] != "ISSUED" {
		t.Errorf("first log line %v: want spanId and result ISSUED", l)
	}

	assertNoClearMember(t, tr, member)
}

// TestTelemetryWaitedOutLock: a request whose first attempt met 55P03 (the campaign row held
// FOR UPDATE by another session past the lock timeout) and succeeded once the holder let go has
// one event per failed attempt with SQLSTATE 55P03 and its backoff, and counts the retryable
// errors by SQLSTATE.
func TestTelemetryWaitedOutLock(t *testing.T) {
	tr := newTraced(t, issuance.Config{LockTimeout: 100 * time.Millisecond, StatementTimeout: 500 * time.Millisecond})
	ctx := context.Background()
	hold := pgtest.HoldCampaign(t, tr.pool.Config().ConnConfig.ConnString(), "OPEN")
	type answer struct {
		status int
		result string
	}
	done := make(chan answer, 1)
	go func() {
		status, result := tr.issueAs(t, ctx, "member-2")
		done <- answer{status, result}
	}()
	// Release the row once the first attempt has failed with 55P03.
	lockNotAvailable := attribute.NewSet(attribute.String("db.response.status_code", pgerrcode.LockNotAvailable))
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if sumOf(collect(t, tr.metrics), telemetry.MetricRetryableErrors, lockNotAvailable) == 0 {
			return errors.New("no 55P03 attempt recorded")
		}
		return nil
	})
	hold.Release()
	if a := <-done; a.status != 201 || a.result != "ISSUED" {
		t.Fatalf("answer %d %s, want 201 ISSUED", a.status, a.result)
	}

	spans := tr.issuanceSpans(t)
	if len(spans) != 1 {
		t.Fatalf("%d issuance spans, want 1", len(spans))
	}
	s := spans[0]
	a := attrs(s.Attributes)
	attempts := a[telemetry.AttrAttempts].AsInt64()
	if a[telemetry.AttrResult].AsString() != "ISSUED" || attempts < 2 {
		t.Fatalf("span attributes %v: want ISSUED after at least 2 attempts", s.Attributes)
	}
	if int64(len(s.Events)) != attempts-1 {
		t.Fatalf("%d events for %d attempts, want one per failed attempt: %v", len(s.Events), attempts, s.Events)
	}
	for i, e := range s.Events {
		ea := attrs(e.Attributes)
		if e.Name != issuance.EventAttemptFailed || ea["db.response.status_code"].AsString() != pgerrcode.LockNotAvailable ||
			ea[telemetry.AttrAttempts].AsInt64() != int64(i+1) || ea[issuance.AttrBackoffMs].Type() != attribute.INT64 {
			t.Errorf("event %d: %s %v, want %q with SQLSTATE 55P03, attempt %d and coupon.backoff_ms",
				i, e.Name, e.Attributes, issuance.EventAttemptFailed, i+1)
		}
	}
	points := collect(t, tr.metrics)
	if n := sumOf(points, telemetry.MetricRetryableErrors, lockNotAvailable); n != attempts-1 {
		t.Errorf("%s{55P03}: %d, want %d", telemetry.MetricRetryableErrors, n, attempts-1)
	}
	set := attribute.NewSet(telemetry.AttrCampaign.String("OPEN"), telemetry.AttrResult.String("ISSUED"))
	if c, sum := histogramOf(points, telemetry.MetricIssuanceAttempts, set); c != 1 || int64(sum) != attempts {
		t.Errorf("%s: count %d sum %v, want 1 call of %d attempts", telemetry.MetricIssuanceAttempts, c, sum, attempts)
	}
	assertNoClearMember(t, tr, "member-2")
}

// TestTelemetryCallerCancels: a caller that goes away while the request waits for a lock is
// recorded as cancelled (span status, result CANCELLED in the metric and the log), not as a
// database error.
func TestTelemetryCallerCancels(t *testing.T) {
	tr := newTraced(t, issuance.Config{})
	ctx := context.Background()
	hold := pgtest.HoldCampaign(t, tr.pool.Config().ConnConfig.ConnString(), "OPEN")
	callCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.issueAs(t, callCtx, "member-3")
	}()
	hold.WaitBlocked(1)
	cancel()
	<-done

	spans := tr.issuanceSpans(t)
	if len(spans) != 1 {
		t.Fatalf("%d issuance spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Status.Code != codes.Error || !strings.HasPrefix(s.Status.Description, "cancelled") ||
		attrs(s.Attributes)[telemetry.AttrResult].AsString() != telemetry.ResultCancelled {
		t.Errorf("span status %v result %v: want cancelled", s.Status, attrs(s.Attributes)[telemetry.AttrResult])
	}
	for _, e := range s.Events {
		if e.Name == "exception" {
			t.Errorf("a cancelled call recorded an error event: %v", e.Attributes)
		}
	}
	set := attribute.NewSet(telemetry.AttrCampaign.String("OPEN"), telemetry.AttrResult.String(telemetry.ResultCancelled))
	if n := sumOf(collect(t, tr.metrics), telemetry.MetricIssuances, set); n != 1 {
		t.Errorf("%s{CANCELLED}: %d, want 1", telemetry.MetricIssuances, n)
	}
	lines := logLines(t, tr.logs.String())
	if len(lines) != 1 || lines[0]["result"] != telemetry.ResultCancelled || lines[0]["severity"] != "INFO" {
		t.Errorf("log lines %v: want one INFO line with result CANCELLED", lines)
	}
}

// TestUnreachableCollectorNeverFailsARequest: with the OTLP endpoint a black hole (it accepts
// connections and never answers) and a 2-span export queue, every request still succeeds, and
// the batch span processor drops spans (otel.sdk.processor.span.processed with
// error.type=queue_full) instead of blocking the request on the exporter.
func TestUnreachableCollectorNeverFailsARequest(t *testing.T) {
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // never read, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		hole.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+hole.Addr().String())
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "2")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "1")
	t.Setenv("OTEL_GO_X_OBSERVABILITY", "true")

	tr := newTraced(t, issuance.Config{}) // the pool and handler; Setup below replaces the providers
	reader := sdkmetric.NewManualReader()
	shutdown, err := telemetry.Setup(context.Background(), telemetry.WithMetricReader(reader),
		telemetry.WithLogWriter(&bytes.Buffer{}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = shutdown(ctx) // the black hole cannot take the flush; shutdown gives up with ctx
	}()
	pcfg := tr.pool.Config()
	pcfg.ConnConfig.Tracer = otelpgx.NewTracer() // on Setup's providers, as shared/db does
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pgtest.SetClock(t, pool, now)
	h, err := newHandler(pool, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	served := instrument(h)

	const requests = 8 // within OPEN's budget of 10 coupons
	for i := range requests {
		req := httptest.NewRequest(http.MethodPost, "/IssueCoupon", strings.NewReader(ask(fmt.Sprintf("m%d", i), "OPEN")))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		served.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			t.Fatalf("request %d with the collector unreachable: %d %s, want 201", i, rec.Code, rec.Body.String())
		}
	}
	points := collect(t, reader)
	var dropped int64
	for _, p := range points["otel.sdk.processor.span.processed"] {
		if v, ok := p.attrs.Value("error.type"); ok && v.AsString() == "queue_full" {
			dropped += p.value
		}
	}
	if dropped == 0 {
		t.Errorf("no span dropped on a full queue: the exporter must drop rather than block")
	}
}

// assertNoClearMember checks that member appears in no span attribute, event attribute, metric
// attribute or log line.
func assertNoClearMember(t *testing.T, tr *traced, member string) {
	t.Helper()
	check := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			if strings.Contains(kv.Value.String(), member) {
				t.Errorf("member id in clear in %s attribute %s=%s", where, kv.Key, kv.Value.String())
			}
		}
	}
	for _, s := range tr.spans.GetSpans() {
		check("span "+s.Name, s.Attributes)
		for _, e := range s.Events {
			check("event "+e.Name, e.Attributes)
		}
	}
	for name, ps := range collect(t, tr.metrics) {
		for _, p := range ps {
			check("metric "+name, p.attrs.ToSlice())
		}
	}
	if strings.Contains(tr.logs.String(), member) {
		t.Errorf("member id in clear in the log: %s", tr.logs.String())
	}
}

// point is one metric data point: a sum's value, or a histogram's count and sum.
type point struct {
	attrs attribute.Set
	value int64
	count uint64
	sum   float64
}

// collect reads every metric from r, by name, and checks that Google's Telemetry API would take
// every name and attribute key.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string][]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	if err := gcpfake.CheckMetrics(rm); err != nil {
		t.Errorf("Google's Telemetry API would reject: %v", err)
	}
	out := map[string][]point{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] = append(out[m.Name], point{attrs: p.Attributes, value: p.Value})
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] = append(out[m.Name], point{attrs: p.Attributes, count: p.Count, sum: float64(p.Sum)})
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[m.Name] = append(out[m.Name], point{attrs: p.Attributes, count: p.Count, sum: p.Sum})
				}
			}
		}
	}
	return out
}

func sumOf(points map[string][]point, name string, set attribute.Set) int64 {
	for _, p := range points[name] {
		if p.attrs.Equals(&set) {
			return p.value
		}
	}
	return 0
}

func histogramOf(points map[string][]point, name string, set attribute.Set) (uint64, float64) {
	for _, p := range points[name] {
		if p.attrs.Equals(&set) {
			return p.count, p.sum
		}
	}
	return 0, 0
}

func logLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestTelemetryInvalidRequestLogsOneLine: a request that cannot be decoded also logs its one
// line, with INVALID_REQUEST, the status and the trace.
func TestTelemetryInvalidRequestLogsOneLine(t *testing.T) {
	tr := newTraced(t, issuance.Config{})
	req := httptest.NewRequest(http.MethodPost, "/IssueCoupon", strings.NewReader(`{"member_id": "m1"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", callerTraceparnt)
	rec := httptest.NewRecorder()
	tr.h.ServeHTTP(rec, req)
	lines := logLines(t, tr.logs.String())
	if rec.Code != http.StatusBadRequest || len(lines) != 1 || lines[0]["result"] != resultInvalidRequest ||
		lines[0]["status"] != 400.0 || lines[0][telemetry.LogKeyTrace] != "projects/"+testProject+"/traces/"+callerTraceID {
		t.Errorf("answer %d, log lines %v: want 400 and one INVALID_REQUEST line with status and trace", rec.Code, lines)
	}
}

// TestTelemetryDryRunIsMarked: a dry run's log line carries dry_run true, an issuance's carries
// no dry_run, so a log-based count of results can tell the app's button from a tap.
func TestTelemetryDryRunIsMarked(t *testing.T) {
	tr := newTraced(t, issuance.Config{})
	for _, body := range []string{`{"member_id": "m1", "campaign_id": "OPEN", "dry_run": true}`, ask("m1", "OPEN")} {
		req := httptest.NewRequest(http.MethodPost, "/IssueCoupon", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		tr.h.ServeHTTP(rec, req)
	}
	lines := logLines(t, tr.logs.String())
	if len(lines) != 2 {
		t.Fatalf("%d log lines, want 2: %s", len(lines), tr.logs.String())
	}
	if l := lines[0]; l["result"] != "AVAILABLE" || l["dry_run"] != true {
		t.Errorf("dry run's log line %v: want AVAILABLE with dry_run true", l)
	}
	if l := lines[1]; l["result"] != "ISSUED" || l["dry_run"] != nil {
		t.Errorf("issuance's log line %v: want ISSUED without dry_run", l)
	}
}

// TestNothingExportingKeepsTheCallersTrace: served as deployed with telemetry from an
// environment that exports nothing (no span is then made), a request's log line and its outbox
// row's trace_parent carry the caller's W3C traceparent; a request without one has neither.
func TestNothingExportingKeepsTheCallersTrace(t *testing.T) {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		t.Setenv(k, "")
	}
	t.Setenv("GOOGLE_CLOUD_PROJECT", testProject)
	ctx := context.Background()
	logger := slog.Default()
	logs := &syncbuf.Buffer{}
	shutdown, err := telemetry.Setup(ctx, telemetry.WithLogWriter(logs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = shutdown(ctx)
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
		slog.SetDefault(logger)
	})
	url := pgtest.URL(t)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.Tracer = otelpgx.NewTracer() // as shared/db does
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pgtest.SetClock(t, pool, now)
	if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "OPEN", DiscountYen: 1, BudgetYen: 10}); err != nil {
		t.Fatal(err)
	}
	h, err := New(issuance.Config{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, member := range []string{"with-trace", "without-trace"} {
		req := httptest.NewRequest(http.MethodPost, "/IssueCoupon", strings.NewReader(ask(member, "OPEN")))
		req.Header.Set("Content-Type", "application/json")
		if member == "with-trace" {
			req.Header.Set("traceparent", callerTraceparnt)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			t.Fatalf("%s: %d %s", member, rec.Code, rec.Body.String())
		}
	}
	var withTrace, withoutTrace *string
	if err := pool.QueryRow(ctx, `SELECT (SELECT trace_parent FROM notification_outbox WHERE member_id = 'with-trace'),
		(SELECT trace_parent FROM notification_outbox WHERE member_id = 'without-trace')`).Scan(&withTrace, &withoutTrace); err != nil {
		t.Fatal(err)
	}
	if withTrace == nil || *withTrace != callerTraceparnt || withoutTrace != nil {
		t.Errorf("trace_parent %v and %v, want the caller's %s and NULL", deref(withTrace), deref(withoutTrace), callerTraceparnt)
	}
	lines := logLines(t, logs.String())
	if len(lines) != 2 || lines[0][telemetry.LogKeyTrace] != "projects/"+testProject+"/traces/"+callerTraceID ||
		lines[0][telemetry.LogKeySpanID] != callerSpanID || lines[1][telemetry.LogKeyTrace] != nil {
		t.Errorf("log lines %v: want the caller's trace and span on the first, none on the second", lines)
	}
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}

// TestLogLineAllocations: the request's log line, with a trace in its context, allocates only
// what it must: the member's hash, the trace and span ids as strings, the record's room for the
// trace fields beyond slog's inline attributes, and the JSON handler's pooled buffer now and
// then. No key-value pairs are converted, no value boxed, no HMAC keyed anew.
func TestLogLineAllocations(t *testing.T) {
	h := &Handler{log: telemetry.NewLogger(io.Discard, testProject)}
	tid, _ := trace.TraceIDFromHex(callerTraceID)
	sid, _ := trace.SpanIDFromHex(callerSpanID)
	ctx := trace.ContextWithRemoteSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	req := request{MemberID: "member-0000001", CampaignID: "OPEN"}
	out := issuance.Outcome{Result: issuance.ResultIssued, Attempts: 1}
	start := time.Now()
	if allocs := testing.AllocsPerRun(1000, func() { h.logRequest(ctx, req, out, nil, start) }); allocs > maxLogLineAllocs {
		t.Errorf("a log line allocates %.1f times, want at most %d", allocs, maxLogLineAllocs)
	}
}

// maxLogLineAllocs: the member's hash, the trace and the span id, the record's attributes
// beyond its inline five, and the handler's buffer when its pool is empty.
const maxLogLineAllocs = 5
