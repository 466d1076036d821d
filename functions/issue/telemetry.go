package issue

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/telemetry"
)

// instrument wraps h with the IssueCoupon server span, which continues the caller's trace
// (W3C traceparent, or Cloud Run's X-Cloud-Trace-Context; see [telemetry.Propagator]), and
// the HTTP server metrics of otelhttp.
func instrument(h http.Handler) http.Handler {
	return otelhttp.NewHandler(h, "IssueCoupon", otelhttp.WithPropagators(telemetry.Propagator()))
}

// logRequest writes the request's one log line, joined to its trace by the context: INFO with
// the result, attempts, duration_ms, campaign and the member's keyed hash (never the id), and
// dry_run true for a dry run (its result is what the member would get: a log-based count of
// refusals filters it out); INFO "cancelled" for a caller that went away, ERROR with the error for
// a failure (answered 500). A request that could not be decoded logs INVALID_REQUEST with its
// status instead (ServeHTTP). The fields are typed attributes in an array on the stack: no
// key-value pairs to convert, no value boxed.
func (h *Handler) logRequest(ctx context.Context, req request, out issuance.Outcome, err error, start time.Time) {
	var buf [7]slog.Attr
	attrs := append(buf[:0],
		slog.String("campaign", req.CampaignID),
		slog.String("member", telemetry.MemberHash(req.MemberID)),
		slog.Int("attempts", out.Attempts),
		slog.Float64("duration_ms", float64(time.Since(start))/float64(time.Millisecond)),
	)
	level, msg := slog.LevelInfo, "IssueCoupon"
	gone := "IssueCoupon: the caller went away; its transaction was rolled back"
	if req.DryRun {
		attrs = append(attrs, slog.Bool("dry_run", true))
		gone = "IssueCoupon: the caller of a dry run went away"
	}
	switch {
	case errors.Is(err, context.Canceled):
		msg, attrs = gone, append(attrs, slog.String("result", telemetry.ResultCancelled))
	case err != nil:
		level, msg = slog.LevelError, "IssueCoupon: issuance failed"
		attrs = append(attrs, slog.String("result", telemetry.ResultError), slog.Any("err", err))
	default:
		attrs = append(attrs, slog.String("result", string(out.Result)))
	}
	h.log.LogAttrs(ctx, level, msg, attrs...)
}
