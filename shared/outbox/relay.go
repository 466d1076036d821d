package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/mops/coupon-api/shared/backoff"
)

// Result counts what one run did with the rows it claimed, in rows. A claimed row is in at most
// one count: a row the run gave back unpushed (refused token, LINE down, batch out of time) is
// in none.
type Result struct {
	// Sent rows were accepted by LINE (2xx, or 409 for a retry key it had accepted before) and
	// marked sent.
	Sent int `json:"sent"`
	// RetryLater rows go back to the outbox for a later run: a retryable failure, or a push
	// whose outcome could not be recorded.
	RetryLater int `json:"retry_later"`
	// Parked rows were dead-lettered: refused by LINE, out of attempts, or past LINE's retry-key
	// window ([RetryKeyWindow]).
	Parked int `json:"parked"`
	// Skipped rows were closed without a push: their member has no LINE account linked.
	Skipped int `json:"skipped"`
}

// Rows is the number of rows the run handled.
func (r Result) Rows() int { return r.Sent + r.RetryLater + r.Parked + r.Skipped }

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

// claimed is one claimed row with what its message needs and what giving it back restores.
type claimed struct {
	couponID, memberID string
	attempts           int // pushes sent before this claim
	campaignID         string
	amountYen          int
	lineUserID         string // "" when the member has no LINE account linked
	keyExpired         bool   // first pushed more than RetryKeyWindow ago
	prevNextAttemptAt  time.Time
	prevFirstPushedAt  *time.Time
	traceParent        *string // the issuing request's W3C traceparent, for the push span's link
}

// Run delivers at most maxRows rows due at its start (0 means [Config.MaxRows]) and returns
// what it did. A row it sends back for a retry waits for a later run.
//
// It claims batches of at most BatchSize rows with [sqlOutboxClaim] (a lease, committed at
// once: no database transaction is open while pushes run), pushes each batch with at most
// Parallelism pushes in flight and at most RateLimit per second, and records each row's
// outcome in its own statement as soon as its push ends, so a slow or failing row holds up
// nobody. It stops claiming when the outbox has no due row or maxRows are handled.
//
// What bounds a run: it returns within RunBudget (or ctx's deadline if sooner). Its start and
// each claim are statements bounded by MarkTimeout; a batch's pushes end by the batch's start +
// BatchTimeout and all of its marks by its start + BatchTimeout + MarkTimeout (one deadline
// shared by the batch, not one per mark); a claim is made only while more than
// BatchTimeout + 2*MarkTimeout is left.
//
// Each row ends in one of these ways:
//   - its member has no LINE account linked: marked skipped, never pushed;
//   - it was first pushed more than [RetryKeyWindow] ago: parked, not re-sent;
//   - LINE answered 2xx (even if the body could not be read) or 409: marked sent;
//   - a 4xx other than 401, 403, 409 and 429: parked with the reason;
//   - a timeout, 429 or 5xx: sent back for a later run after a full-jitter wait, or LINE's
//     Retry-After (at most RetryCap) if longer, until MaxAttempts pushes, when it is parked;
//   - 401 or 403 (the token was refused): the run ends at once with an ERROR log and
//     [ErrTokenRefused], every row not accepted given back unharmed;
//   - BreakerFailures timeouts, connection errors or 5xx in a row: the run ends early with
//     [ErrLINEUnavailable], the rows not yet pushed given back unharmed;
//   - the batch's time ran out before its push: given back unharmed.
//
// "Given back unharmed" means no attempt charged and next_attempt_at and first_pushed_at as
// before the claim. Only a push actually written to LINE counts as an attempt. If the push
// succeeded but marking it sent fails, the row is released for the next run, which re-sends it
// with the same retry key and gets 409; if even that fails, the lease runs out and the row comes
// back the same way.
//
// A run deletes nothing: its database role, coupon_relay, may only update the relay's columns
// (docs/roles.md). Closed rows past the retention go with [Prune], run by the daily operator job
// `couponctl outbox prune` as coupon_admin.
//
// Errors: a claim that fails ends the run with the error and the counts so far, as do
// [ErrTokenRefused] and [ErrLINEUnavailable] (errors.Is).
func (r *Relay) Run(ctx context.Context, maxRows int) (Result, error) {
	if maxRows <= 0 {
		maxRows = r.cfg.MaxRows
	}
	deadline := time.Now().Add(r.cfg.RunBudget)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	run := runState{id: uuid.New(), breaker: r.newBreaker()}
	var res Result
	var start time.Time
	if err := r.withTimeout(ctx, func(ctx context.Context) error {
		return r.pool.QueryRow(ctx, sqlRunStart).Scan(&start)
	}); err != nil {
		return res, fmt.Errorf("outbox: run start: %w", err)
	}
	var stop error
	for res.Rows() < maxRows && time.Until(deadline) > r.cfg.BatchTimeout+2*r.cfg.MarkTimeout {
		rows, err := r.claim(ctx, run.id, start, min(r.cfg.BatchSize, maxRows-res.Rows()))
		if err != nil {
			return res, err
		}
		if len(rows) == 0 {
			break
		}
		res = add(res, r.deliver(ctx, &run, rows))
		if stop = run.stopped(); stop != nil {
			break
		}
	}
	return res, stop
}

func add(a, b Result) Result {
	return Result{Sent: a.Sent + b.Sent, RetryLater: a.RetryLater + b.RetryLater,
		Parked: a.Parked + b.Parked, Skipped: a.Skipped + b.Skipped}
}

// withTimeout runs f under ctx bounded by MarkTimeout.
func (r *Relay) withTimeout(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.MarkTimeout)
	defer cancel()
	return f(ctx)
}

func (r *Relay) claim(ctx context.Context, run uuid.UUID, start time.Time, n int) ([]claimed, error) {
	var batch []claimed
	err := r.withTimeout(ctx, func(ctx context.Context) error {
		rows, err := r.pool.Query(ctx, sqlOutboxClaim, n, run, r.cfg.Lease, start, RetryKeyWindow)
		if err != nil {
			return err
		}
		batch, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (c claimed, err error) {
			var lineUserID *string
			err = row.Scan(&c.couponID, &c.memberID, &c.attempts, &c.campaignID, &c.amountYen, &lineUserID,
				&c.keyExpired, &c.prevNextAttemptAt, &c.prevFirstPushedAt, &c.traceParent)
			if lineUserID != nil {
				c.lineUserID = *lineUserID
			}
			return c, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	return batch, nil
}

// runState is what the pushes of one run share: its id (the claim), its circuit breaker, and
// whether LINE refused the token.
type runState struct {
	id           uuid.UUID
	breaker      *gobreaker.CircuitBreaker[bool]
	tokenRefused atomic.Pointer[error]
}

// stopped returns why the run must stop pushing, or nil.
func (s *runState) stopped() error {
	if err := s.tokenRefused.Load(); err != nil {
		return *err
	}
	if s.breaker.State() == gobreaker.StateOpen {
		return ErrLINEUnavailable
	}
	return nil
}

// newBreaker returns a run's circuit breaker (sony/gobreaker): closed at the start of the run,
// open after BreakerFailures outage failures in a row ([PushError.Outage]); any other answer,
// refusals included, shows LINE is up and resets the streak. It never half-opens within a run:
// the next run starts with a closed breaker of its own.
func (r *Relay) newBreaker() *gobreaker.CircuitBreaker[bool] {
	threshold := uint32(r.cfg.BreakerFailures)
	return gobreaker.NewCircuitBreaker[bool](gobreaker.Settings{
		Name:    "LINE push",
		Timeout: 2 * r.cfg.RunBudget,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= threshold
		},
		IsSuccessful: func(err error) bool {
			var pe *PushError
			return !errors.As(err, &pe) || !pe.Outage()
		},
	})
}

// outcome is where one row ended up.
type outcome int

const (
	outcomeSent outcome = iota
	outcomeRetryLater
	outcomeParked
	outcomeSkipped
	outcomeReleased
)

// deliver pushes one claimed batch and records every row's outcome; it returns when each row
// is recorded or BatchTimeout + MarkTimeout has passed since it started.
func (r *Relay) deliver(ctx context.Context, run *runState, rows []claimed) Result {
	begin := time.Now()
	batchCtx, cancel := context.WithDeadline(ctx, begin.Add(r.cfg.BatchTimeout))
	defer cancel()
	// Marks outlive the caller (WithoutCancel) but not the batch: one deadline for them all.
	markCtx, cancelMarks := context.WithDeadline(context.WithoutCancel(ctx), begin.Add(r.cfg.BatchTimeout+r.cfg.MarkTimeout))
	defer cancelMarks()
	outcomes := make([]outcome, len(rows))
	var g errgroup.Group
	g.SetLimit(r.cfg.Parallelism)
	for i, row := range rows {
		g.Go(func() error {
			outcomes[i] = r.handle(batchCtx, markCtx, run, row)
			return nil
		})
	}
	_ = g.Wait() // the goroutines report through outcomes, never an error
	var res Result
	released := 0
	for _, o := range outcomes {
		switch o {
		case outcomeSent:
			res.Sent++
		case outcomeRetryLater:
			res.RetryLater++
		case outcomeParked:
			res.Parked++
		case outcomeSkipped:
			res.Skipped++
		case outcomeReleased:
			released++
		}
	}
	if released > 0 {
		r.cfg.Logger.InfoContext(ctx, "outbox: rows given back unpushed", "rows", released)
	}
	return res
}

// noLINEAccount is last_error for a skipped row.
const noLINEAccount = "skipped: the member has no LINE account linked (couponctl line link, then outbox requeue)"

// handle pushes one row inside the batch's time and records the outcome with markCtx.
func (r *Relay) handle(batchCtx, markCtx context.Context, run *runState, row claimed) outcome {
	log := r.cfg.Logger.With("coupon_id", row.couponID, "attempt", row.attempts+1)
	switch {
	case row.lineUserID == "":
		r.mark(markCtx, log, sqlOutboxMarkSkipped, row.couponID, run.id, noLINEAccount)
		return outcomeSkipped
	case row.keyExpired:
		r.mark(markCtx, log, sqlOutboxMarkParked, row.couponID, run.id, fmt.Sprintf(
			"not re-sent: first pushed more than %s ago, and LINE honours a retry key for 24 hours only, "+
				"so a re-send could deliver it twice (couponctl outbox requeue --force sends it anyway)",
			RetryKeyWindow), 0)
		return outcomeParked
	case run.stopped() != nil:
		return r.release(markCtx, log, run, row)
	}

	pushCtx, cancel := context.WithTimeout(batchCtx, r.cfg.PushTimeout)
	defer cancel()
	if err := r.limiter.Wait(pushCtx); err != nil {
		return r.release(markCtx, log, run, row) // the batch's time is up: not pushed
	}
	sent, err := run.breaker.Execute(func() (bool, error) { return r.tracedPush(pushCtx, row) })
	switch {
	case err == nil:
		if _, markErr := r.pool.Exec(markCtx, sqlOutboxMarkSent, row.couponID); markErr != nil {
			// LINE has the push; the next run re-sends it with the same retry key and gets 409.
			log.WarnContext(markCtx, "outbox: pushed but not marked sent; releasing for a re-send", "err", markErr)
			r.mark(markCtx, log, sqlOutboxMarkRetry, row.couponID, run.id, time.Duration(0),
				"pushed, but marking it sent failed: "+markErr.Error(), 1)
			return outcomeRetryLater
		}
		return outcomeSent
	case errors.Is(err, ErrTokenRefused):
		stop := fmt.Errorf("%w (renew LINE_CHANNEL_ACCESS_TOKEN): %w", ErrTokenRefused, err)
		if run.tokenRefused.CompareAndSwap(nil, &stop) {
			log.ErrorContext(markCtx, "outbox: LINE refused the channel access token; run ended, rows given back unharmed",
				"err", err)
		}
		return r.release(markCtx, log, run, row)
	case !sent: // open breaker, or the request never left: LINE saw nothing
		return r.release(markCtx, log, run, row)
	}

	log.WarnContext(markCtx, "outbox: push failed", "err", err)
	switch {
	case errors.Is(err, ErrPushRejected):
		r.mark(markCtx, log, sqlOutboxMarkParked, row.couponID, run.id, err.Error(), 1)
		return outcomeParked
	case row.attempts+1 >= r.cfg.MaxAttempts:
		r.mark(markCtx, log, sqlOutboxMarkParked, row.couponID, run.id,
			fmt.Sprintf("attempt limit %d reached: %v", r.cfg.MaxAttempts, err), 1)
		return outcomeParked
	}
	wait := backoff.FullJitter(r.cfg.RetryBase, r.cfg.RetryCap, row.attempts+1)
	var pe *PushError
	if errors.As(err, &pe) {
		wait = max(wait, min(pe.RetryAfter, r.cfg.RetryCap))
	}
	r.mark(markCtx, log, sqlOutboxMarkRetry, row.couponID, run.id, wait, err.Error(), 1)
	return outcomeRetryLater
}

// release gives an unpushed row back as it was before the claim ([sqlOutboxRelease]).
func (r *Relay) release(ctx context.Context, log *slog.Logger, run *runState, row claimed) outcome {
	r.mark(ctx, log, sqlOutboxRelease, row.couponID, run.id, row.prevNextAttemptAt, row.prevFirstPushedAt)
	return outcomeReleased
}

// mark runs one mark statement. A failure is logged and left to the lease: the row comes back
// when it ends.
func (r *Relay) mark(ctx context.Context, log *slog.Logger, sql string, args ...any) {
	if _, err := r.pool.Exec(ctx, sql, args...); err != nil {
		log.ErrorContext(ctx, "outbox: mark failed; the row returns when its lease ends", "err", err)
	}
}
