package telemetry

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// ScopeName is the instrumentation scope of coupon-api's own spans and metrics.
const ScopeName = "github.com/mops/coupon-api"

// The metrics coupon-api emits, named and unitted after the OpenTelemetry semantic conventions
// (dotted names, UCUM units, {annotations} for counted things); docs/operations.md gives each
// one's normal range and alert. deploy/monitoring references only these names.
const (
	// MetricIssuances counts IssueCoupon calls by AttrCampaign and AttrResult ({issuance}).
	MetricIssuances = "coupon.issuances"
	// MetricIssuanceAttempts is the histogram of transactions started per call ({attempt}).
	MetricIssuanceAttempts = "coupon.issuance.attempts"
	// MetricIssuanceDuration is the histogram of one call's time, retries included (ms).
	MetricIssuanceDuration = "coupon.issuance.duration"
	// MetricBatchSize is the histogram of the members of each coalesced IssueCoupon call, by
	// AttrCampaign ({member}): shared/issuance's batches of one hot campaign (ISSUE_BATCH_MAX).
	MetricBatchSize = "coupon.issuance.batch.size"
	// MetricRetryableErrors counts attempts that failed with a retryable SQLSTATE (40001,
	// 40P01, 55P03), by db.response.status_code ({error}).
	MetricRetryableErrors = "coupon.issuance.retryable_errors"
	// MetricBudgetUtilization is each recent campaign's issued_yen / budget_yen (1), read from
	// campaign_budgets.
	MetricBudgetUtilization = "coupon.campaign.budget.utilization"
	// MetricOutboxUnsent is the open outbox rows: neither sent, parked nor skipped ({row}).
	MetricOutboxUnsent = "coupon.outbox.unsent"
	// MetricOutboxOldestAge is the age of the oldest unsent, unparked outbox row (s).
	MetricOutboxOldestAge = "coupon.outbox.oldest_unsent.age"
	// MetricOutboxParked is the dead-lettered outbox rows ({row}).
	MetricOutboxParked = "coupon.outbox.parked"
	// MetricOutboxSkipped is the outbox rows skipped in the last 24 hours, never to be pushed:
	// their member has no LINE account linked, or their coupon was voided or expired ({row}).
	MetricOutboxSkipped = "coupon.outbox.skipped"
	// MetricLINEPushes counts pushes to LINE by http.response.status_code; a push with no
	// answer (timeout, refused) has error.type instead ({push}).
	MetricLINEPushes = "coupon.line.pushes"
	// MetricDryRunFallbacks counts the dry runs that the read pool did not answer and the
	// primary did, by AttrFallbackReason: the read pool's lag was past ISSUE_DRY_RUN_MAX_LAG or
	// unknown ("lag"), or its call failed ("error") ({dry_run}).
	MetricDryRunFallbacks = "coupon.dry_run.fallbacks"
	// MetricDriftYen is what reconcile (`couponops reconcile`, the daily job) found: campaign
	// counters minus their coupons, in yen, summed in absolute value by AttrDriftKind ({yen}).
	MetricDriftYen = "coupon.reconcile.drift.amount"
	// MetricDriftRows is the rows reconcile found broken, by AttrDriftKind ({row}).
	MetricDriftRows = "coupon.reconcile.drift.rows"
)

// MetricNames lists every metric above, for tests that check dashboards and alerts against
// the code.
func MetricNames() []string {
	return []string{MetricIssuances, MetricIssuanceAttempts, MetricIssuanceDuration, MetricBatchSize, MetricRetryableErrors,
		MetricBudgetUtilization, MetricOutboxUnsent, MetricOutboxOldestAge, MetricOutboxParked, MetricOutboxSkipped,
		MetricLINEPushes, MetricDryRunFallbacks, MetricDriftYen, MetricDriftRows}
}

// Attribute keys of coupon-api's spans and metrics. Campaign ids and result codes are few;
// member ids never appear (use [MemberHash] in logs).
const (
	AttrCampaign  = attribute.Key("coupon.campaign")
	AttrResult    = attribute.Key("coupon.result")
	AttrAttempts  = attribute.Key("coupon.attempts")
	AttrMonth     = attribute.Key("coupon.month")
	AttrDriftKind = attribute.Key("coupon.drift.kind")
	AttrBatchSize = attribute.Key("coupon.batch.size")
	// AttrFallbackReason is why a dry run went to the primary ([MetricDryRunFallbacks]).
	AttrFallbackReason = attribute.Key("coupon.fallback.reason")
)

// Result codes of [Metrics.RecordIssuance] besides the issuance results.
const (
	ResultCancelled = "CANCELLED" // the caller went away; the transaction was rolled back
	ResultError     = "ERROR"     // an unexpected failure (the handler answered 500)
)

// Bucket boundaries. Duration in ms around the 2.5 s budget and the 3 s app timeout (see
// shared/issuance); attempts 1..5 (issuance.MaxAttempts).
var (
	durationBucketsMs = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 1500, 2000, 2500, 3000}
	attemptBuckets    = []float64{1, 2, 3, 4, 5}
	batchBuckets      = []float64{2, 4, 8, 16, 32, 64, 128}
)

// Metrics records coupon-api's synchronous metrics. Its methods are safe for concurrent use and
// cost one map lookup and an atomic add each.
type Metrics struct {
	mp        metric.MeterProvider
	issuances metric.Int64Counter
	attempts  metric.Int64Histogram
	duration  metric.Float64Histogram
	batch     metric.Int64Histogram
	retryable metric.Int64Counter
	pushes    metric.Int64Counter
	fallbacks metric.Int64Counter
	driftYen  metric.Int64Gauge
	driftRows metric.Int64Gauge
}

// NewMetrics creates the instruments on mp. Errors from instrument creation go to otel's
// error handler and leave a no-op instrument, as the OpenTelemetry API specifies.
func NewMetrics(mp metric.MeterProvider) *Metrics {
	m := mp.Meter(ScopeName)
	return &Metrics{
		mp: mp,
		issuances: handled(m.Int64Counter(MetricIssuances, metric.WithUnit("{issuance}"),
			metric.WithDescription("IssueCoupon calls by campaign and result"))),
		attempts: handled(m.Int64Histogram(MetricIssuanceAttempts, metric.WithUnit("{attempt}"),
			metric.WithDescription("Transactions started per IssueCoupon call"),
			metric.WithExplicitBucketBoundaries(attemptBuckets...))),
		duration: handled(m.Float64Histogram(MetricIssuanceDuration, metric.WithUnit("ms"),
			metric.WithDescription("IssueCoupon issuance time, retries and waits included"),
			metric.WithExplicitBucketBoundaries(durationBucketsMs...))),
		batch: handled(m.Int64Histogram(MetricBatchSize, metric.WithUnit("{member}"),
			metric.WithDescription("Members per coalesced IssueCoupon call of one campaign"),
			metric.WithExplicitBucketBoundaries(batchBuckets...))),
		retryable: handled(m.Int64Counter(MetricRetryableErrors, metric.WithUnit("{error}"),
			metric.WithDescription("Issuance attempts that failed with a retryable SQLSTATE"))),
		pushes: handled(m.Int64Counter(MetricLINEPushes, metric.WithUnit("{push}"),
			metric.WithDescription("LINE push requests by HTTP status"))),
		fallbacks: handled(m.Int64Counter(MetricDryRunFallbacks, metric.WithUnit("{dry_run}"),
			metric.WithDescription("Dry runs the read pool did not answer, asked of the primary, by reason"))),
		driftYen: handled(m.Int64Gauge(MetricDriftYen, metric.WithUnit("{yen}"),
			metric.WithDescription("Counter drift found by reconcile, in yen"))),
		driftRows: handled(m.Int64Gauge(MetricDriftRows, metric.WithUnit("{row}"),
			metric.WithDescription("Rows breaking a rule found by reconcile"))),
	}
}

// handled returns v, giving err, if any, to otel's error handler.
func handled[T any](v T, err error) T {
	if err != nil {
		otel.Handle(err)
	}
	return v
}

var global atomic.Pointer[Metrics]

// Global returns the Metrics of the global meter provider that [Setup] installed (no-op before
// it), made once per provider.
func Global() *Metrics {
	mp := otel.GetMeterProvider()
	if m := global.Load(); m != nil && m.mp == mp {
		return m
	}
	m := NewMetrics(mp)
	global.Store(m)
	return m
}

// RecordIssuance records one IssueCoupon call of campaign that ended with result (an
// issuance result code, [ResultCancelled] or [ResultError]) after attempts transactions and d.
func (m *Metrics) RecordIssuance(ctx context.Context, campaign, result string, attempts int, d time.Duration) {
	set := metric.WithAttributeSet(attribute.NewSet(AttrCampaign.String(campaign), AttrResult.String(result)))
	m.issuances.Add(ctx, 1, set)
	m.attempts.Record(ctx, int64(attempts), set)
	m.duration.Record(ctx, float64(d)/float64(time.Millisecond), set)
}

// RecordBatch records one coalesced call of campaign's issuances for members members.
func (m *Metrics) RecordBatch(ctx context.Context, campaign string, members int) {
	m.batch.Record(ctx, int64(members), metric.WithAttributes(AttrCampaign.String(campaign)))
}

// RecordRetryableError records one attempt that failed with the retryable SQLSTATE sqlstate.
func (m *Metrics) RecordRetryableError(ctx context.Context, sqlstate string) {
	m.retryable.Add(ctx, 1, metric.WithAttributes(semconv.DBResponseStatusCode(sqlstate)))
}

// RecordPush records one push request to LINE: status is the HTTP status LINE answered, or 0
// when no answer came (errorType then says why, e.g. "timeout").
func (m *Metrics) RecordPush(ctx context.Context, status int, errorType string) {
	if status == 0 {
		m.pushes.Add(ctx, 1, metric.WithAttributes(semconv.ErrorTypeKey.String(errorType)))
		return
	}
	m.pushes.Add(ctx, 1, metric.WithAttributes(semconv.HTTPResponseStatusCode(status)))
}

// RecordDryRunFallback records n dry runs asked of the primary after the read pool did not
// answer them, for reason ("lag" or "error").
func (m *Metrics) RecordDryRunFallback(ctx context.Context, reason string, n int) {
	m.fallbacks.Add(ctx, int64(n), metric.WithAttributes(AttrFallbackReason.String(reason)))
}

// RecordDrift records what one reconciliation found of kind (e.g. "budget_counter",
// "usage_counter", "coupons_without_outbox"): yen of counter drift and rows breaking a rule.
// Zero is recorded too, so a dashboard shows that the check ran.
func (m *Metrics) RecordDrift(ctx context.Context, kind string, yen, rows int64) {
	set := metric.WithAttributes(AttrDriftKind.String(kind))
	m.driftYen.Record(ctx, yen, set)
	m.driftRows.Record(ctx, rows, set)
}
