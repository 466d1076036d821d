// Package relay is the RelayOutbox Cloud Run function: Cloud Scheduler calls it every minute
// (and an operator may call it by hand) to deliver the transactional outbox to LINE. It decodes
// the request, runs one relay pass (shared/outbox) and answers how many rows were sent, sent
// back for a retry, parked, and skipped (docs/api.md, "RelayOutbox"). It registers itself with the
// functions framework in init.
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/mops/coupon-api/shared/lazy"
	"github.com/mops/coupon-api/shared/lifecycle"
	"github.com/mops/coupon-api/shared/outbox"
	"github.com/mops/coupon-api/shared/reqbody"
	"github.com/mops/coupon-api/shared/telemetry"
)

func init() {
	functions.HTTP("RelayOutbox", Instrument(lazy.Handler(instance, "RelayOutbox", internalError)).ServeHTTP)
}

// Start starts RelayOutbox, wherever it is served: by the functions framework (init's
// registration, on the first request), by the deployable main (functions/relay/cmd) and by
// couponctl serve. It reads and validates the settings from the environment, then gets the
// pool from open ([lifecycle.OpenDB], or the one pool couponctl serve opened that way for every
// function it serves), builds the handler and registers the outbox gauges. It returns the
// handler, to be wrapped in [Instrument].
func Start(ctx context.Context, open func(context.Context) (*lifecycle.DB, error)) (*Handler, error) {
	cfg, err := outbox.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	d, err := open(ctx)
	if err != nil {
		return nil, err
	}
	h, err := NewHandler(d.Pool, cfg)
	if err != nil {
		return nil, err
	}
	// The outbox gauges, read through the pool once per metric export.
	if _, err := telemetry.RegisterOutboxGauges(otel.GetMeterProvider(), d.Pool); err != nil {
		return nil, err
	}
	return h, nil
}

// instance is the handler the functions framework serves, started by the first request and
// kept for the instance's life.
var instance = lazy.New(func(ctx context.Context) (*Handler, error) { return Start(ctx, lifecycle.OpenDB) })

// internalError answers 500 with a generic body; the detail is in the log.
func internalError(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusInternalServerError, errorBody{Message: "internal error"})
}

// Handler serves RelayOutbox over one relay.
type Handler struct {
	relay *outbox.Relay
	log   *slog.Logger
}

// NewHandler returns a Handler relaying from pool with cfg (see [outbox.New] for its errors).
func NewHandler(pool *pgxpool.Pool, cfg outbox.Config) (*Handler, error) {
	r, err := outbox.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	return &Handler{relay: r, log: slog.Default()}, nil
}

// MaxBodyBytes is the largest request body accepted, in bytes: 4 KiB, as IssueCoupon's.
const MaxBodyBytes = 4 << 10

// MaxRowsLimit is the largest max_rows a caller may ask for, in rows: about 100 s of pushing at
// LINE's 2,000 requests per second, far beyond one run's budget.
const MaxRowsLimit = 200_000

// ServeHTTP answers one RelayOutbox request: POST with an empty body or {"max_rows": N}
// (1..[MaxRowsLimit]); without max_rows the relay's own limit applies. It answers 200 with
// {"sent": n, "retry_later": n, "parked": n, "skipped": n}; 502 with the same counts and a
// "message" when the run ended early because LINE refused the channel access token
// ([outbox.ErrTokenRefused]) or kept failing ([outbox.ErrLINEUnavailable]), so that Cloud
// Scheduler records the run as failed; 405 for a method other than POST, and 415, 413 or 400
// for a request [decodeRequest] refuses; and 500 (detail logged) when the database fails.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	maxRows, status, err := decodeRequest(w, r)
	if err != nil {
		h.log.InfoContext(r.Context(), "RelayOutbox: request refused", "status", status, "reason", err.Error())
		writeJSON(w, status, errorBody{Message: err.Error()})
		return
	}
	res, err := h.relay.Run(r.Context(), maxRows)
	counts := []any{"sent", res.Sent, "retry_later", res.RetryLater, "parked", res.Parked, "skipped", res.Skipped}
	switch {
	case errors.Is(err, outbox.ErrTokenRefused) || errors.Is(err, outbox.ErrLINEUnavailable):
		h.log.ErrorContext(r.Context(), "RelayOutbox: run ended early", append(counts, "err", err)...)
		writeJSON(w, http.StatusBadGateway, stoppedBody{Result: res, Message: err.Error()})
	case err != nil:
		h.log.ErrorContext(r.Context(), "RelayOutbox: run failed", append(counts, "err", err)...)
		writeJSON(w, http.StatusInternalServerError, errorBody{Message: "internal error"})
	default:
		h.log.InfoContext(r.Context(), "RelayOutbox: run done", counts...)
		writeJSON(w, http.StatusOK, res)
	}
}

// decodeRequest judges the request by IssueCoupon's rules and in its words (shared/reqbody),
// and returns max_rows (0: the relay's default) or the HTTP status of the first failure: the
// method (405), the headers (415: a Content-Encoding other than identity; a Content-Type other
// than application/json on a body that is not empty), the size (413: the whole body is read up
// to [MaxBodyBytes] before any of it is parsed, so an oversized body is 413 whatever it holds),
// then the content (400): one JSON object whose only field is the integer max_rows in
// 1..[MaxRowsLimit], given at most once, nothing after it. Unlike IssueCoupon's, the body may be
// empty: no bytes, with any Content-Type or none, as Cloud Scheduler and an operator's bare
// POST send it, or {} or white space sent as JSON; that is the default run. null is not empty:
// it is refused as IssueCoupon refuses it.
func decodeRequest(w http.ResponseWriter, r *http.Request) (int, int, error) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return 0, http.StatusMethodNotAllowed, fmt.Errorf("method %s: use POST", r.Method)
	}
	if enc := reqbody.Encoding(r.Header); enc != "" {
		return 0, http.StatusUnsupportedMediaType, fmt.Errorf("Content-Encoding %q: send the body uncompressed", enc)
	}
	if r.ContentLength > 0 && !reqbody.IsJSON(r.Header) {
		return 0, http.StatusUnsupportedMediaType, reqbody.ErrNotJSONType
	}
	body, status, err := reqbody.Read(w, r, MaxBodyBytes)
	if err != nil {
		return 0, status, err
	}
	if len(body) > 0 && !reqbody.IsJSON(r.Header) { // a body sent without a Content-Length
		return 0, http.StatusUnsupportedMediaType, reqbody.ErrNotJSONType
	}
	var maxRows int64
	err = reqbody.DecodeObject(body, reqbody.Fields{
		"max_rows": func(v reqbody.Value) (err error) {
			maxRows, err = v.Int(1, MaxRowsLimit)
			return err
		},
	})
	if err != nil && !errors.Is(err, reqbody.ErrEmpty) {
		return 0, http.StatusBadRequest, err
	}
	return int(maxRows), 0, nil
}

type errorBody struct {
	Message string `json:"message"`
}

// stoppedBody is the answer to a run that LINE ended early: the counts so far and why.
type stoppedBody struct {
	outbox.Result
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		slog.Warn("RelayOutbox: write response", "err", err)
	}
}
