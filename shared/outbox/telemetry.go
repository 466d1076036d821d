package outbox

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/mops/coupon-api/shared/outbox/outboxdb"
	"github.com/mops/coupon-api/shared/telemetry"
)

// PushSpanName is the span of one row's push, a child of the run's span that links to the
// trace of the IssueCoupon request that issued the coupon. Its child is otelhttp's client span
// of the HTTP request to LINE.
const PushSpanName = "outbox.push"

// Attributes of the push span: the coupon (not the member) and LINE's answer.
const (
	AttrCouponID   = attribute.Key("coupon.id")
	AttrLINEStatus = attribute.Key("coupon.line.status")
)

// tracedPush is push inside its span.
func (r *Relay) tracedPush(ctx context.Context, row outboxdb.Claimed) (sent bool, err error) {
	opts := []trace.SpanStartOption{trace.WithAttributes(AttrCouponID.String(row.CouponID))}
	if link, ok := issuingLink(row.TraceParent); ok {
		opts = append(opts, trace.WithLinks(link))
	}
	ctx, span := otel.Tracer(telemetry.ScopeName).Start(ctx, PushSpanName, opts...)
	defer span.End()
	sent, err = r.push(ctx, row)
	var pe *PushError
	switch {
	case err == nil:
	case errors.As(err, &pe) && pe.Status != 0:
		span.SetStatus(codes.Error, pe.Error())
	default:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return sent, err
}

// issuingLink is the link to the issuing request's span, from the W3C traceparent stored on
// the outbox row; false when the row has none or it does not parse.
func issuingLink(traceParent *string) (trace.Link, bool) {
	if traceParent == nil {
		return trace.Link{}, false
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": *traceParent})
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: sc}, true
}
