package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/mops/coupon-api/shared/backoff"
)

// Result counts what one run did with the rows it claimed, in rows. Every claimed row is in
// exactly one count.
type Result struct {
	// Sent rows were accepted by LINE (200, or 409 for a retry key it had accepted before) and
	// marked sent.
	Sent int `json:"sent"`
	// RetryLater rows go back to the outbox for a later run: a retryable failure, or a push
	// whose outcome could not be recorded.
	RetryLater int `json:"retry_later"`
	// Parked rows were dead-lettered: refused by LINE, or out of attempts.
	Parked int `json:"parked"`
}

// Rows is the number of rows the run handled.
func (r Result) Rows() int { return r.Sent + r.RetryLater + r.Parked }

func (r *Result) add(o Result) {
	r.Sent += o.Sent
	r.RetryLater += o.RetryLater
	r.Parked += o.Parked
}

// Relay delivers outbox rows to LINE. It is safe for concurrent use, and any number of relays,
// in one process or many, may run on one database at once.
type Relay struct {
	pool    *pgxpool.Pool
	cfg     Config
	limiter *rate.Limiter
}

// New returns a Relay over pool with cfg's zero fields defaulted (see [Config.WithDefaults]).
// It refuses a cfg that [Config.Validate] rejects.
func New(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.HTTPClient = instrumentClient(cfg.HTTPClient)
	return &Relay{
		pool:    pool,
		cfg:     cfg,
		limiter: rate.NewLimiter(rate.Limit(cfg.RateLimit), cfg.Parallelism),
	}, nil
}

// claimed is one claimed row with what its message needs.
type claimed struct {
	couponID, memberID string
	attempts           int
	campaignID         string
	amountYen          int
	traceParent        *string // the issuing request's W3C traceparent, for the push span's link
}

// Run delivers at most maxRows rows due at its start (0 means [Config.MaxRows]) and returns
// what it did. A row it sends back for a retry waits for a later run.
//
// It claims batches of at most BatchSize rows with [sqlOutboxClaim] (a lease, committed at
// once: no database transaction is open while pushes run), pushes each batch with at most
// Parallelism pushes in flight and at most RateLimit per second, and records each row's
// outcome in its own statement as soon as its push ends, so a slow or failing row holds up
// nobody. It stops claiming when the outbox has no due row, maxRows are handled, or less than
// BatchTimeout + MarkTimeout is left of the run budget (RunBudget, or ctx's deadline if
// sooner).
//
// A push LINE accepted, or answered 409 for (its retry key was already accepted), is marked
// sent. A 4xx other than 409 and 429 parks the row with the reason. A timeout, 429 or 5xx sends
// it back for a later run after a full-jitter wait, or LINE's Retry-After if longer, until
// MaxAttempts, when it is parked. If the push succeeded but marking it sent fails, the row is
// released for the next run, which re-sends it with the same retry key and gets 409; if even
// that fails, the lease runs out and the row comes back the same way.
//
// Errors: a claim that fails ends the run with the error and the counts so far.
func (r *Relay) Run(ctx context.Context, maxRows int) (Result, error) {
	if maxRows <= 0 {
		maxRows = r.cfg.MaxRows
	}
	deadline := time.Now().Add(r.cfg.RunBudget)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	run := uuid.New()
	var res Result
	var start time.Time
	if err := r.pool.QueryRow(ctx, sqlRunStart).Scan(&start); err != nil {
		return res, fmt.Errorf("relay: run start: %w", err)
	}
	for res.Rows() < maxRows && time.Until(deadline) > r.cfg.BatchTimeout+r.cfg.MarkTimeout {
		rows, err := r.claim(ctx, run, start, min(r.cfg.BatchSize, maxRows-res.Rows()))
		if err != nil {
			return res, err
		}
		if len(rows) == 0 {
			break
		}
		res.add(r.deliver(ctx, run, rows))
	}
	return res, nil
}

func (r *Relay) claim(ctx context.Context, run uuid.UUID, start time.Time, n int) ([]claimed, error) {
	rows, err := r.pool.Query(ctx, sqlOutboxClaim, n, run, r.cfg.Lease, start)
	if err != nil {
		return nil, fmt.Errorf("relay: claim: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (c claimed, err error) {
		err = row.Scan(&c.couponID, &c.memberID, &c.attempts, &c.campaignID, &c.amountYen, &c.traceParent)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("relay: claim: %w", err)
	}
	return batch, nil
}

// outcome is where one row ended up.
type outcome int

const (
	outcomeSent outcome = iota
	outcomeRetryLater
	outcomeParked
)

// deliver pushes one claimed batch and records every row's outcome; it returns when each row
// is recorded or BatchTimeout + MarkTimeout has passed.
func (r *Relay) deliver(ctx context.Context, run uuid.UUID, rows []claimed) Result {
	batchCtx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	outcomes := make([]outcome, len(rows))
	var g errgroup.Group
	g.SetLimit(r.cfg.Parallelism)
	for i, row := range rows {
		g.Go(func() error {
			outcomes[i] = r.handle(ctx, batchCtx, run, row)
			return nil
		})
	}
	_ = g.Wait() // the goroutines report through outcomes, never an error
	var res Result
	for _, o := range outcomes {
		switch o {
		case outcomeSent:
			res.Sent++
		case outcomeRetryLater:
			res.RetryLater++
		case outcomeParked:
			res.Parked++
		}
	}
	return res
}

// handle pushes one row inside the batch's time and records the outcome. The marks run on a
// context of their own (MarkTimeout, not cancelled with ctx): what happened at LINE is recorded
// even when the caller has gone away.
func (r *Relay) handle(ctx, batchCtx context.Context, run uuid.UUID, row claimed) outcome {
	pushCtx, cancel := context.WithTimeout(batchCtx, r.cfg.PushTimeout)
	err := r.limiter.Wait(pushCtx)
	if err != nil {
		err = &PushError{Err: fmt.Errorf("rate limiter: %w", err)}
	} else {
		err = r.tracedPush(pushCtx, row)
	}
	cancel()

	markCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.MarkTimeout)
	defer cancel()
	log := r.cfg.Logger.With("coupon_id", row.couponID, "attempt", row.attempts)
	if err == nil {
		_, markErr := r.pool.Exec(markCtx, sqlOutboxMarkSent, row.couponID)
		if markErr == nil {
			return outcomeSent
		}
		// LINE has the push; the next run re-sends it with the same retry key and gets 409.
		log.WarnContext(ctx, "relay: pushed but not marked sent; releasing for a re-send", "err", markErr)
		r.mark(markCtx, log, sqlOutboxMarkRetry, row.couponID, run, time.Duration(0),
			"pushed, but marking it sent failed: "+markErr.Error())
		return outcomeRetryLater
	}

	log.WarnContext(ctx, "relay: push failed", "err", err)
	switch {
	case errors.Is(err, ErrPushRejected):
		r.mark(markCtx, log, sqlOutboxMarkParked, row.couponID, run, err.Error())
		return outcomeParked
	case row.attempts >= r.cfg.MaxAttempts:
		r.mark(markCtx, log, sqlOutboxMarkParked, row.couponID, run,
			fmt.Sprintf("attempt limit %d reached: %v", r.cfg.MaxAttempts, err))
		return outcomeParked
	}
	wait := backoff.FullJitter(r.cfg.RetryBase, r.cfg.RetryCap, row.attempts)
	var pe *PushError
	if errors.As(err, &pe) {
		wait = max(wait, pe.RetryAfter)
	}
	r.mark(markCtx, log, sqlOutboxMarkRetry, row.couponID, run, wait, err.Error())
	return outcomeRetryLater
}

// mark runs one mark statement. A failure is logged and left to the lease: the row comes back
// when it ends.
func (r *Relay) mark(ctx context.Context, log *slog.Logger, sql string, args ...any) {
	if _, err := r.pool.Exec(ctx, sql, args...); err != nil {
		log.ErrorContext(ctx, "relay: mark failed; the row returns when its lease ends", "err", err)
	}
}
