package issue

import (
	"context"
	"errors"
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
// status instead (ServeHTTP).
func (h *Handler) logRequest(ctx context.Context, req request, out issuance.Outcome, err error, start time.Time) {
	attrs := []any{
		"campaign", req.CampaignID,
		"member", telemetry.MemberHash(req.MemberID),
		"attempts", out.Attempts,
		"duration_ms", float64(time.Since(start)) / float64(time.Millisecond),
	}
	gone := "IssueCoupon: the caller went away; its transaction was rolled back"
	if req.DryRun {
		attrs = append(attrs, "dry_run", true)
		gone = "IssueCoupon: the caller of a dry run went away"
	}
	switch {
	case errors.Is(err, context.Canceled):
		h.log.InfoContext(ctx, gone, append(attrs, "result", telemetry.ResultCancelled)...)
	case err != nil:
		h.log.ErrorContext(ctx, "IssueCoupon: issuance failed", append(attrs, "result", telemetry.ResultError, "err", err)...)
	default:
		h.log.InfoContext(ctx, "IssueCoupon", append(attrs, "result", string(out.Result))...)
	}
}
