// Package issue is the IssueCoupon Cloud Run function: the app gateway's "クーポンを受け取る"
// call. It decodes and validates the request, runs one issuance (shared/issuance) and answers
// with the result codes of docs/api.md (docs/openapi.yaml). It registers itself with the
// functions framework in init ([Function]).
package issue

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/lifecycle"
)

// Function is IssueCoupon as the functions framework serves it, built once per instance by
// [Open].
var Function = lifecycle.NewFunction("IssueCoupon", Open, refuse)

func init() { functions.HTTP("IssueCoupon", Function.ServeHTTP) }

// Open builds IssueCoupon from the environment: its settings ([issuance.ConfigFromEnv]), then
// the database ([lifecycle.OpenDB]: reachable and migrated), then the dry runs' read pool when
// DATABASE_READ_URL or READ_INSTANCE_CONNECTION_NAME is set ([lifecycle.OpenReadDB]), then
// [NewWithReadPool]. It closes the pools when a later step fails.
func Open(ctx context.Context) (*lifecycle.Instance, error) {
	cfg, err := issuance.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	d, err := lifecycle.OpenDB(ctx)
	if err != nil {
		return nil, err
	}
	if d.Read, err = lifecycle.OpenReadDB(ctx); err != nil {
		return d.Serving(nil, err)
	}
	var read *pgxpool.Pool
	if d.Read != nil {
		read = d.Read.Pool
	}
	h, err := NewWithReadPool(cfg, d.Pool, read)
	return d.Serving(h, err, "issuance", cfg.String())
}

// New returns IssueCoupon's handler issuing on pool with cfg, instrumented (see instrument),
// after registering the campaign budget gauge on the global meter provider
// ([issuance.RegisterBudgetGauge]). Errors: [issuance.New]'s and the gauge's.
func New(cfg issuance.Config, pool *pgxpool.Pool) (http.Handler, error) {
	return NewWithReadPool(cfg, pool, nil)
}

// NewWithReadPool is [New] with the dry runs answered by read, a pool on a streaming standby,
// within cfg's lag bound ([issuance.Service.UseReadPool]); a nil read is [New].
func NewWithReadPool(cfg issuance.Config, pool, read *pgxpool.Pool) (http.Handler, error) {
	h, err := newHandler(pool, cfg)
	if err != nil {
		return nil, err
	}
	if read != nil {
		h.svc.UseReadPool(read)
	}
	if _, err := issuance.RegisterBudgetGauge(otel.GetMeterProvider(), pool); err != nil {
		return nil, err
	}
	return instrument(h), nil
}

// refuse answers what the instance cannot serve: 503 RETRY_EXHAUSTED with Retry-After while it
// shuts down (nothing was written: safe to re-send), 500 INTERNAL_ERROR when it could not start.
func refuse(w http.ResponseWriter, status int) {
	if status != http.StatusServiceUnavailable {
		writeInternalError(w)
		return
	}
	w.Header().Set("Retry-After", retryAfterSeconds)
	writeJSON(w, status, response{Result: string(issuance.ResultRetryExhausted)})
}

// Handler serves IssueCoupon over one issuance service.
type Handler struct {
	svc *issuance.Service
	log *slog.Logger
}

// newHandler returns a Handler issuing on pool with cfg (see [issuance.New] for its errors).
func newHandler(pool *pgxpool.Pool, cfg issuance.Config) (*Handler, error) {
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
	if req.DryRun {
		h.dryRun(w, r, req, start)
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
		resp.ExpiresAt = rfc3339(*out.ExpiresAt)
	}
	if out.NextReleaseAt != nil {
		resp.NextReleaseAt = rfc3339(*out.NextReleaseAt)
	}
	writeJSON(w, statusOf[out.Result], resp)
}

// dryRun answers a dry run (docs/api.md, "Dry run"): 200 with AVAILABLE or the refusal the
// member would get now, UNKNOWN_CAMPAIGN 404 and RETRY_EXHAUSTED 503 as for an issuance.
func (h *Handler) dryRun(w http.ResponseWriter, r *http.Request, req request, start time.Time) {
	out, err := h.svc.DryRun(r.Context(), req.MemberID, req.CampaignID)
	h.logRequest(r.Context(), req, issuance.Outcome{Result: out.Result, CouponID: out.CouponID, Reason: out.Reason}, err, start)
	if err != nil {
		writeInternalError(w)
		return
	}
	status := http.StatusOK
	switch out.Result {
	case issuance.ResultUnknownCampaign:
		status = http.StatusNotFound
	case issuance.ResultRetryExhausted:
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	resp := response{Result: string(out.Result), CouponID: out.CouponID, AmountYen: out.AmountYen, Reason: out.Reason,
		RemainingCoupons: out.RemainingCoupons}
	if out.ReadLag != nil {
		w.Header().Set(HeaderReadLag, strconv.FormatFloat(float64(*out.ReadLag)/float64(time.Millisecond), 'f', 3, 64))
	}
	if out.ExpiresAt != nil && out.Result != issuance.ResultCouponVoided {
		resp.ExpiresAt = rfc3339(*out.ExpiresAt)
	}
	if out.NextReleaseAt != nil {
		resp.NextReleaseAt = rfc3339(*out.NextReleaseAt)
	}
	writeJSON(w, status, resp)
}

// HeaderReadLag is the header of a dry run's answer that the read pool gave: how far behind
// the primary the pool was, as it measured itself in the call that answered, in milliseconds
// with three decimals ("0.000" when it had replayed all it had received). An answer of the
// primary has none. A header, not a body field: the answers' bodies are closed schemas
// (docs/openapi.yaml) shared with the issuance's.
const HeaderReadLag = "X-Read-Pool-Lag-Ms"

// rfc3339 formats an instant as the answers carry it: RFC 3339 at +09:00, with the fraction of a
// second the database stores.
func rfc3339(t time.Time) string { return t.In(issuance.Tokyo).Format(time.RFC3339Nano) }

// retryAfterSeconds is the Retry-After of RETRY_EXHAUSTED, in seconds: contention on one
// campaign row clears within a second (docs/hot-row.md).
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
	issuance.ResultNotEligible:       http.StatusForbidden,
	issuance.ResultUnknownCampaign:   http.StatusNotFound,
	issuance.ResultRetryExhausted:    http.StatusServiceUnavailable,
}

type response struct {
	Result    string `json:"result"`
	CouponID  string `json:"coupon_id,omitempty"`
	AmountYen int    `json:"amount_yen,omitempty"`
	Month     string `json:"month,omitempty"`
	Reason    string `json:"reason,omitempty"`
	// ExpiresAt is the coupon's expiry in RFC 3339 at +09:00 with the fraction of a second the
	// database stores (ISSUED, ALREADY_ISSUED), when its campaign gives a validity.
	ExpiresAt string `json:"expires_at,omitempty"`
	// NextReleaseAt is the campaign's next scheduled release, as ExpiresAt is written
	// (BUDGET_EXCEEDED, CAMPAIGN_NOT_ACTIVE NOT_STARTED, a dry run's AVAILABLE).
	NextReleaseAt string `json:"next_release_at,omitempty"`
	// RemainingCoupons is what the campaign can still issue now (a dry run's AVAILABLE and
	// BUDGET_EXCEEDED); a pointer, so that 0 is written.
	RemainingCoupons *int   `json:"remaining_coupons,omitempty"`
	Message          string `json:"message,omitempty"`
}

func writeInternalError(w http.ResponseWriter) {
	writeJSON(w, http.StatusInternalServerError, response{Result: resultInternalError, Message: "internal error"})
}

func writeJSON(w http.ResponseWriter, status int, v response) {
	if err := lifecycle.WriteJSON(w, status, v); err != nil {
		slog.Warn("IssueCoupon: write response", "err", err)
	}
}
