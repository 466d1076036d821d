// Package issue is the IssueCoupon Cloud Run function: the app gateway's "クーポンを受け取る"
// call. It decodes and validates the request, runs one issuance (shared/issuance) and answers
// with the result codes of docs/api.md (docs/openapi.yaml). It registers itself with the
// functions framework in init.
package issue

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/lazy"
	"github.com/mops/coupon-api/shared/lifecycle"
	"github.com/mops/coupon-api/shared/telemetry"
)

func init() {
	functions.HTTP("IssueCoupon", Instrument(lazy.Handler(instance, "IssueCoupon", func(w http.ResponseWriter, _ *http.Request) {
		writeInternalError(w)
	})).ServeHTTP)
}

// Start starts IssueCoupon, wherever it is served: by the functions framework (init's
// registration, on the first request), by the deployable main (functions/issue/cmd) and by
// couponctl serve. It reads and validates the settings from the environment, then gets the
// pool from open ([lifecycle.OpenDB], or the one pool couponctl serve opened that way for every
// function it serves), builds the handler and registers the budget gauge. It returns the
// handler, to be wrapped in [Instrument], and its effective settings.
func Start(ctx context.Context, open func(context.Context) (*lifecycle.DB, error)) (*Handler, string, error) {
	cfg, err := issuance.ConfigFromEnv()
	if err != nil {
		return nil, "", err
	}
	d, err := open(ctx)
	if err != nil {
		return nil, "", err
	}
	h, err := NewHandler(d.Pool, cfg)
	if err != nil {
		return nil, "", err
	}
	// The campaign budget gauge, read through the pool once per metric export.
	if _, err := telemetry.RegisterBudgetGauge(otel.GetMeterProvider(), d.Pool); err != nil {
		return nil, "", err
	}
	return h, cfg.String(), nil
}

// instance is the handler the functions framework serves, started by the first request and
// kept for the instance's life.
var instance = lazy.New(func(ctx context.Context) (*Handler, error) {
	h, _, err := Start(ctx, lifecycle.OpenDB)
	return h, err
})

// Handler serves IssueCoupon over one issuance service.
type Handler struct {
	svc *issuance.Service
	log *slog.Logger
}

// NewHandler returns a Handler issuing on pool with cfg (see [issuance.New] for its errors).
func NewHandler(pool *pgxpool.Pool, cfg issuance.Config) (*Handler, error) {
	svc, err := issuance.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	return &Handler{svc: svc, log: slog.Default()}, nil
}

// ServeHTTP answers one IssueCoupon request (docs/api.md, "IssueCoupon") and logs it in one
// line (see logRequest).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	req, status, err := decodeRequest(w, r)
	if err != nil {
		h.log.InfoContext(r.Context(), "IssueCoupon", "result", resultInvalidRequest, "status", status, "reason", err.Error())
		writeJSON(w, status, response{Result: resultInvalidRequest, Message: err.Error()})
		return
	}
	out, err := h.svc.Issue(r.Context(), req.MemberID, req.CampaignID)
	h.logRequest(r.Context(), req, out, err, start)
	if err != nil {
		writeInternalError(w)
		return
	}
	if out.Result == issuance.ResultRetryExhausted {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	resp := response{Result: string(out.Result), CouponID: out.CouponID, Reason: out.Reason}
	if out.Result == issuance.ResultIssued {
		resp.AmountYen, resp.Month = out.AmountYen, out.Month
	}
	if out.ExpiresAt != nil && out.Result != issuance.ResultCouponVoided {
		resp.ExpiresAt = out.ExpiresAt.In(issuance.Tokyo).Format(time.RFC3339)
	}
	writeJSON(w, statusOf[out.Result], resp)
}

// retryAfterSeconds is the Retry-After of RETRY_EXHAUSTED, in seconds: contention on one
// campaign row clears within a second at the measured 32-client p99 (docs/hot-row.md).
const retryAfterSeconds = "1"

// resultInvalidRequest and resultInternalError are the answers that no issuance produced.
// INTERNAL_ERROR (500) is the last row of docs/api.md's table: it answers an unexpected failure whose
// detail goes to the log, never to the caller.
const (
	resultInvalidRequest = "INVALID_REQUEST"
	resultInternalError  = "INTERNAL_ERROR"
)

// statusOf is the result-to-status table of docs/api.md.
var statusOf = map[issuance.Result]int{
	issuance.ResultIssued:            http.StatusCreated,
	issuance.ResultAlreadyIssued:     http.StatusOK,
	issuance.ResultMonthlyCap:        http.StatusConflict,
	issuance.ResultBudgetExceeded:    http.StatusConflict,
	issuance.ResultCampaignNotActive: http.StatusConflict,
	issuance.ResultCouponVoided:      http.StatusConflict,
	issuance.ResultUnknownCampaign:   http.StatusNotFound,
	issuance.ResultRetryExhausted:    http.StatusServiceUnavailable,
}

type response struct {
	Result    string `json:"result"`
	CouponID  string `json:"coupon_id,omitempty"`
	AmountYen int    `json:"amount_yen,omitempty"`
	Month     string `json:"month,omitempty"`
	Reason    string `json:"reason,omitempty"`
	// ExpiresAt is the coupon's expiry in RFC 3339 at +09:00 (ISSUED, ALREADY_ISSUED), when its
	// campaign gives a validity.
	ExpiresAt string `json:"expires_at,omitempty"`
	Message   string `json:"message,omitempty"`
}

func writeInternalError(w http.ResponseWriter) {
	writeJSON(w, http.StatusInternalServerError, response{Result: resultInternalError, Message: "internal error"})
}

func writeJSON(w http.ResponseWriter, status int, v response) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		slog.Warn("IssueCoupon: write response", "err", err)
	}
}
