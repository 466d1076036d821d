package outbox

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/mops/coupon-api/shared/telemetry"
)

// instrumentClient returns a copy of c whose requests record LINE's status on the push span and
// in [telemetry.MetricLINEPushes], each inside an otelhttp client span.
func instrumentClient(c *http.Client) *http.Client {
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	traced := *c
	traced.Transport = statusRecorder{next: otelhttp.NewTransport(base)}
	return &traced
}

// statusRecorder records each response's status on the caller's span (the push span) and in
// the push counter.
type statusRecorder struct{ next http.RoundTripper }

func (s statusRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := s.next.RoundTrip(req)
	ctx := req.Context()
	if err != nil {
		errType := "connection"
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			errType = "timeout"
		}
		telemetry.Global().RecordPush(ctx, 0, errType)
		trace.SpanFromContext(ctx).SetAttributes(semconv.ErrorTypeKey.String(errType))
		return res, err
	}
	telemetry.Global().RecordPush(ctx, res.StatusCode, "")
	trace.SpanFromContext(ctx).SetAttributes(AttrLINEStatus.Int(res.StatusCode))
	return res, nil
}
