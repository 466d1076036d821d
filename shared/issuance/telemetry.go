package issuance

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/mops/coupon-api/shared/telemetry"
)

// SpanName is the name of the span around one [Service.Issue] call; its attempts' calls (otelpgx's
// batch spans, shared/db) are its children.
const SpanName = "issuance.Issue"

// EventAttemptFailed is the span event of one failed attempt: its SQLSTATE
// (db.response.status_code, or error.type when there is none) and the full-jitter wait before
// the next attempt in ms (coupon.backoff_ms, 0 when no attempt follows).
const EventAttemptFailed = "attempt failed"

// AttrBackoffMs is the wait after a failed attempt, in ms.
const AttrBackoffMs = attribute.Key("coupon.backoff_ms")

// issueSpan is the telemetry of one Issue call: its span, the failure of the latest attempt
// until its wait is known, and the call's start for the duration metric. The member id is
// never recorded.
type issueSpan struct {
	span     trace.Span
	campaign string
	start    time.Time
	failed   error // the latest failed attempt, not yet turned into an event
	attempt  int
}

// startIssue starts the call's span with its campaign.
func startIssue(ctx context.Context, r request) (context.Context, *issueSpan) {
	ctx, span := otel.Tracer(telemetry.ScopeName).Start(ctx, SpanName, trace.WithAttributes(
		telemetry.AttrCampaign.String(r.campaignID)))
	return ctx, &issueSpan{span: span, campaign: r.campaignID, start: time.Now()}
}

// attempted notes the outcome of attempt n: a failure (an error; a refusal is an answer) is
// kept for its event.
func (s *issueSpan) attempted(n int, err error) {
	if err == nil {
		return
	}
	s.failed, s.attempt = err, n
}

// waiting records the pending failure's event with the wait before the next attempt.
func (s *issueSpan) waiting(wait time.Duration) {
	if s.failed == nil {
		return
	}
	attrs := []attribute.KeyValue{telemetry.AttrAttempts.Int(s.attempt), AttrBackoffMs.Int64(wait.Milliseconds())}
	if code := sqlState(s.failed); code != "" {
		attrs = append(attrs, semconv.DBResponseStatusCode(code))
	} else {
		attrs = append(attrs, semconv.ErrorTypeKey.String(errorType(s.failed)))
	}
	s.span.AddEvent(EventAttemptFailed, trace.WithAttributes(attrs...))
	s.failed = nil
}

// end records the call's result (and an issued coupon's month, as the database stamped it) on
// the span and in the metrics, and ends the span. A caller that went away is recorded as
// cancelled, not as a database error.
func (s *issueSpan) end(ctx context.Context, out Outcome, err error) {
	s.waiting(0) // the last attempt's failure, if any: no attempt followed it
	result := string(out.Result)
	switch {
	case errors.Is(err, context.Canceled):
		result = telemetry.ResultCancelled
		s.span.SetStatus(codes.Error, "cancelled: the caller went away; the transaction was rolled back")
	case err != nil:
		result = telemetry.ResultError
		s.span.RecordError(err)
		s.span.SetStatus(codes.Error, err.Error())
	}
	s.span.SetAttributes(telemetry.AttrResult.String(result), telemetry.AttrAttempts.Int(out.Attempts))
	if out.Month != "" {
		s.span.SetAttributes(telemetry.AttrMonth.String(out.Month))
	}
	s.span.End()
	// A cancelled call's ctx is done; the metric is recorded all the same.
	telemetry.Global().RecordIssuance(context.WithoutCancel(ctx), s.campaign, result, out.Attempts, time.Since(s.start))
}

// sqlState returns err's PostgreSQL SQLSTATE, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// errorType names a failure without a SQLSTATE, for error.type: "timeout", "cancelled", or the
// semantic conventions' "_OTHER" (a lost connection, a network error).
func errorType(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	default:
		return "_OTHER"
	}
}

// traceParent returns the W3C traceparent of ctx's span, stored on the outbox row so that the
// relay's push links back to this issuance; nil (NULL) when ctx holds no valid span.
func traceParent(ctx context.Context) *string {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if tp, ok := carrier["traceparent"]; ok {
		return &tp
	}
	return nil
}
