// Package relay is the RelayOutbox Cloud Run function: Cloud Scheduler calls it every minute
// (and an operator may call it by hand) to deliver the transactional outbox to LINE. It decodes
// the request, runs one relay pass (shared/outbox) and answers how many rows were sent, sent
// back for a retry, parked, and skipped (docs/api.md, "RelayOutbox"). It registers itself with the
// functions framework in init ([Function]).
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/mops/coupon-api/shared/lifecycle"
	"github.com/mops/coupon-api/shared/outbox"
	"github.com/mops/coupon-api/shared/reqbody"
)

// Function is RelayOutbox as the functions framework serves it, built once per instance by
// [Open].
var Function = lifecycle.NewFunction("RelayOutbox", Open, refuse)

func init() { functions.HTTP("RelayOutbox", Function.ServeHTTP) }

// Open builds RelayOutbox from the environment: its settings ([outbox.ConfigFromEnv]), then
// the database ([lifecycle.OpenDB]: reachable and migrated), then [New]. It closes the pool
// when New fails.
func Open(ctx context.Context) (*lifecycle.Instance, error) {
	cfg, err := outbox.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	d, err := lifecycle.OpenDB(ctx)
	if err != nil {
		return nil, err
	}
	h, err := New(cfg, d.Pool)
	return d.Serving(h, err, "relay", cfg.String())
}

// New returns RelayOutbox's handler relaying from pool with cfg, instrumented (see
// instrument), after registering the outbox gauges on the global meter provider
// ([outbox.RegisterGauges]). Errors: [outbox.New]'s and the gauges'.
func New(cfg outbox.Config, pool *pgxpool.Pool) (http.Handler, error) {
	r, err := outbox.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := outbox.RegisterGauges(otel.GetMeterProvider(), pool); err != nil {
		return nil, err
	}
	return instrument(&handler{relay: r, log: slog.Default()}), nil
}

// refuse answers what the instance cannot serve, with a message: 503 while it shuts down (the
// next scheduled run takes the rows), 500 when it could not start (the detail is in the log).
func refuse(w http.ResponseWriter, status int) {
	msg := "internal error"
	if status == http.StatusServiceUnavailable {
		msg = "shutting down: the next run relays the rows"
	}
	writeJSON(w, status, errorBody{Message: msg})
}

// handler serves RelayOutbox over one relay.
type handler struct {
	relay *outbox.Relay
	log   *slog.Logger
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
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
// it is refused as IssueCoupon refuses it. The answers decided by the headers (405, 415, 413 by
// Content-Length) close the connection without reading the body (reqbody.SkipBody).
func decodeRequest(w http.ResponseWriter, r *http.Request) (int, int, error) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		reqbody.SkipBody(w, r)
		return 0, http.StatusMethodNotAllowed, fmt.Errorf("method %s: use POST", r.Method)
	}
	if enc := reqbody.Encoding(r.Header); enc != "" {
		reqbody.SkipBody(w, r)
		return 0, http.StatusUnsupportedMediaType, fmt.Errorf("Content-Encoding %q: send the body uncompressed", enc)
	}
	if r.ContentLength > 0 && !reqbody.IsJSON(r.Header) {
		reqbody.SkipBody(w, r)
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
	if err := lifecycle.WriteJSON(w, status, v); err != nil {
		slog.Warn("RelayOutbox: write response", "err", err)
	}
}
