// Package redeem is the RedeemCoupon Cloud Run function: the cart's or the POS's call at checkout,
// through the app gateway. It decodes and validates the request, runs one operation
// (shared/redemption: validate, redeem or rollback) and answers with the result codes of
// docs/api.md, "RedeemCoupon" (docs/openapi.yaml). It registers itself with the functions
// framework in init ([Function]).
package redeem

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/lifecycle"
	"github.com/mops/coupon-api/shared/redemption"
	"github.com/mops/coupon-api/shared/telemetry"
)

// Function is RedeemCoupon as the functions framework serves it, built once per instance by
// [Open].
var Function = lifecycle.NewFunction("RedeemCoupon", Open, refuse)

func init() { functions.HTTP("RedeemCoupon", Function.ServeHTTP) }

// Open builds RedeemCoupon from the environment: the budget and timeouts IssueCoupon reads
// ([issuance.ConfigFromEnv]: ISSUE_BUDGET, ISSUE_LOCK_TIMEOUT, ISSUE_STATEMENT_TIMEOUT), then the
// database ([lifecycle.OpenDB]: reachable and migrated), then [New]. It closes the pool when New
// fails.
func Open(ctx context.Context) (*lifecycle.Instance, error) {
	cfg, err := issuance.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	d, err := lifecycle.OpenDB(ctx)
	if err != nil {
		return nil, err
	}
	h, err := New(cfg, d.Pool)
	return d.Serving(h, err, "redemption", cfg.String())
}

// New returns RedeemCoupon's handler on pool with cfg, wrapped in the server span (which
// continues the caller's trace, as IssueCoupon's) and otelhttp's server metrics. Errors:
// [redemption.New]'s.
func New(cfg issuance.Config, pool *pgxpool.Pool) (http.Handler, error) {
	svc, err := redemption.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	h := &Handler{svc: svc, log: slog.Default()}
	return otelhttp.NewHandler(h, "RedeemCoupon", otelhttp.WithPropagators(telemetry.Propagator())), nil
}

// refuse answers what the instance cannot serve: 503 RETRY_EXHAUSTED with Retry-After while it
// shuts down (nothing was done: safe to re-send), 500 INTERNAL_ERROR when it could not start.
func refuse(w http.ResponseWriter, status int) {
	if status != http.StatusServiceUnavailable {
		writeInternalError(w)
		return
	}
	w.Header().Set("Retry-After", retryAfterSeconds)
	writeJSON(w, status, response{Result: string(redemption.ResultRetryExhausted)})
}

// Handler serves RedeemCoupon over one redemption service.
type Handler struct {
	svc *redemption.Service
	log *slog.Logger
}

// ServeHTTP answers one RedeemCoupon request (docs/api.md, "RedeemCoupon") and logs it in one
// line: INFO with the action, result, attempts, duration_ms, the member's keyed hash (never the
// id) and the coupon; INFO "cancelled" for a caller that went away; ERROR with the error for a
// failure (answered 500); INVALID_REQUEST with its status for a request that could not be
// decoded.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	req, status, err := decodeRequest(w, r)
	if err != nil {
		h.log.InfoContext(r.Context(), "RedeemCoupon", "result", resultInvalidRequest, "status", status, "reason", err.Error())
		writeJSON(w, status, response{Result: resultInvalidRequest, Message: err.Error()})
		return
	}
	out, err := h.svc.Do(r.Context(), req)
	attrs := []any{"action", string(req.Action), "coupon", req.CouponID, "member", telemetry.MemberHash(req.MemberID),
		"attempts", out.Attempts, "duration_ms", float64(time.Since(start)) / float64(time.Millisecond)}
	switch {
	case errors.Is(err, context.Canceled):
		h.log.InfoContext(r.Context(), "RedeemCoupon: the caller went away", append(attrs, "result", telemetry.ResultCancelled)...)
		writeInternalError(w)
		return
	case err != nil:
		h.log.ErrorContext(r.Context(), "RedeemCoupon: failed", append(attrs, "result", telemetry.ResultError, "err", err)...)
		writeInternalError(w)
		return
	}
	h.log.InfoContext(r.Context(), "RedeemCoupon", append(attrs, "result", string(out.Result))...)
	if out.Result == redemption.ResultRetryExhausted {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	writeJSON(w, statusOf[out.Result], answer(req, out))
}

// answer is the body of out for req: the fields docs/api.md's table adds to each result.
func answer(req redemption.Request, out redemption.Outcome) response {
	resp := response{Result: string(out.Result)}
	switch out.Result {
	case redemption.ResultValid:
		resp.AmountYen, resp.ExpiresAt = out.AmountYen, rfc3339(out.ExpiresAt)
	case redemption.ResultRedeemed:
		resp.AmountYen, resp.OrderID, resp.RedeemedAt = out.AmountYen, req.OrderID, rfc3339(out.RedeemedAt)
	case redemption.ResultRolledBack:
		resp.Usable = &out.Usable
	case redemption.ResultCouponExpired:
		resp.ExpiresAt = rfc3339(out.ExpiresAt)
	}
	return resp
}

// rfc3339 formats an instant as the answers carry it: RFC 3339 at +09:00 with the fraction of a
// second the database stores; "" for none.
func rfc3339(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.In(issuance.Tokyo).Format(time.RFC3339Nano)
}

// retryAfterSeconds is the Retry-After of RETRY_EXHAUSTED, in seconds, as IssueCoupon's.
const retryAfterSeconds = "1"

// resultInvalidRequest and resultInternalError are the answers no operation produced.
const (
	resultInvalidRequest = "INVALID_REQUEST"
	resultInternalError  = "INTERNAL_ERROR"
)

// statusOf is the result-to-status table of docs/api.md, "RedeemCoupon".
var statusOf = map[redemption.Result]int{
	redemption.ResultValid:           http.StatusOK,
	redemption.ResultRedeemed:        http.StatusOK,
	redemption.ResultRolledBack:      http.StatusOK,
	redemption.ResultAlreadyRedeemed: http.StatusConflict,
	redemption.ResultNotRedeemed:     http.StatusConflict,
	redemption.ResultCouponExpired:   http.StatusConflict,
	redemption.ResultCouponVoided:    http.StatusConflict,
	redemption.ResultUnknownCoupon:   http.StatusNotFound,
	redemption.ResultRetryExhausted:  http.StatusServiceUnavailable,
}

type response struct {
	Result    string `json:"result"`
	AmountYen int    `json:"amount_yen,omitempty"`
	// ExpiresAt is the coupon's expiry (VALID, COUPON_EXPIRED), as IssueCoupon writes it.
	ExpiresAt  string `json:"expires_at,omitempty"`
	OrderID    string `json:"order_id,omitempty"`
	RedeemedAt string `json:"redeemed_at,omitempty"`
	// Usable says whether a rolled-back coupon may be redeemed now; a pointer, so that false is
	// written.
	Usable  *bool  `json:"usable,omitempty"`
	Message string `json:"message,omitempty"`
}

func writeInternalError(w http.ResponseWriter) {
	writeJSON(w, http.StatusInternalServerError, response{Result: resultInternalError, Message: "internal error"})
}

func writeJSON(w http.ResponseWriter, status int, v response) {
	if err := lifecycle.WriteJSON(w, status, v); err != nil {
		slog.Warn("RedeemCoupon: write response", "err", err)
	}
}
