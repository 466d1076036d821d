package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/mops/coupon-api/shared/backoff"
	"github.com/mops/coupon-api/shared/outbox/outboxdb"
)

// Result counts what one run did with the rows it claimed, in rows. A claimed row is in at most
// one count: a row the run gave back (see the package doc) is in none.
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
	// Skipped rows were closed by the claim without a push, never to be pushed; SkippedReasons
	// counts them by reason.
	Skipped        int            `json:"skipped"`
	SkippedReasons SkippedReasons `json:"skipped_reasons"`
}

// SkippedReasons counts the skipped rows of a run by the reason the claim gave
// ([outboxdb.Claimed.SkipReason]), in rows. Their sum is [Result.Skipped], less any row of a
// reason a later schema adds, which is counted in Skipped alone.
type SkippedReasons struct {
	NoLINEAccount int `json:"no_line_account"` // the member has no LINE account linked
	Voided        int `json:"voided"`          // the coupon was voided before its push
	Redeemed      int `json:"redeemed"`        // the coupon was redeemed before its push
	Expired       int `json:"expired"`         // the coupon expired before its push could reach LINE
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

// Run delivers at most maxRows rows due at its start (0 means [Config.MaxRows]) within
// RunBudget (or ctx's deadline if sooner) and returns what it did with them. How a run claims,
// pushes, marks and keeps to its budget, and how each row ends, is in the package doc.
//
// Errors: a failed claim ends the run with the error and the counts so far, as do
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
	run := runState{id: uuid.New(), breaker: &breaker{threshold: r.cfg.BreakerFailures}}
	var res Result
	var start time.Time
	if err := r.withTimeout(ctx, func(ctx context.Context) (err error) {
		start, err = outboxdb.Now(ctx, r.pool)
		return err
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
		Parked: a.Parked + b.Parked, Skipped: a.Skipped + b.Skipped,
		SkippedReasons: SkippedReasons{
			NoLINEAccount: a.SkippedReasons.NoLINEAccount + b.SkippedReasons.NoLINEAccount,
			Voided:        a.SkippedReasons.Voided + b.SkippedReasons.Voided,
			Redeemed:      a.SkippedReasons.Redeemed + b.SkippedReasons.Redeemed,
			Expired:       a.SkippedReasons.Expired + b.SkippedReasons.Expired}}
}

// withTimeout runs f under ctx bounded by MarkTimeout.
func (r *Relay) withTimeout(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.MarkTimeout)
	defer cancel()
	return f(ctx)
}

func (r *Relay) claim(ctx context.Context, run uuid.UUID, start time.Time, n int) ([]outboxdb.Claimed, error) {
	var batch []outboxdb.Claimed
	err := r.withTimeout(ctx, func(ctx context.Context) (err error) {
		batch, err = outboxdb.Claim(ctx, r.pool, outboxdb.ClaimParams{
			Run: run, Limit: n, Lease: r.cfg.Lease, DueAt: start, KeyWindow: RetryKeyWindow})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	return batch, nil
}

// runState is what the pushes of one run share: its id (the claim), its breaker, and whether
// LINE refused the token.
type runState struct {
	id           uuid.UUID
	breaker      *breaker
	tokenRefused atomic.Pointer[error]
}

// stopped returns why the run must stop pushing, or nil.
func (s *runState) stopped() error {
	if err := s.tokenRefused.Load(); err != nil {
		return *err
	}
	if s.breaker.isOpen() {
		return ErrLINEUnavailable
	}
	return nil
}

// outcome is where one row ended up.
type outcome int

const (
	outcomeSent outcome = iota
	outcomeRetryLater
	outcomeParked
	outcomeReleased
)

// deliver counts the rows the claim closed as skipped, pushes the others and records every
// row's outcome; it returns when each row is recorded or BatchTimeout + MarkTimeout has passed
// since it started.
func (r *Relay) deliver(ctx context.Context, run *runState, rows []outboxdb.Claimed) Result {
	var res Result
	rows = slices.DeleteFunc(rows, func(row outboxdb.Claimed) bool {
		if row.SkipReason != "" {
			r.countSkipped(ctx, &res, row)
		}
		return row.SkipReason != ""
	})
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
	released := 0
	for _, o := range outcomes {
		switch o {
		case outcomeSent:
			res.Sent++
		case outcomeRetryLater:
			res.RetryLater++
		case outcomeParked:
			res.Parked++
		case outcomeReleased:
			released++
		}
	}
	if released > 0 {
		r.cfg.Logger.InfoContext(ctx, "outbox: rows given back unpushed", "rows", released)
	}
	return res
}

// countSkipped counts a row the claim closed without a push under its reason.
func (r *Relay) countSkipped(ctx context.Context, res *Result, row outboxdb.Claimed) {
	res.Skipped++
	switch row.SkipReason {
	case outboxdb.SkipNoLINEAccount:
		res.SkippedReasons.NoLINEAccount++
	case outboxdb.SkipVoided:
		res.SkippedReasons.Voided++
	case outboxdb.SkipRedeemed:
		res.SkippedReasons.Redeemed++
	case outboxdb.SkipExpired:
		res.SkippedReasons.Expired++
	default:
		r.cfg.Logger.WarnContext(ctx, "outbox: the claim skipped a row for a reason this release does not know",
			"coupon_id", row.CouponID, "skip_reason", row.SkipReason)
	}
}

// keyExpiredReason is last_error for a row parked because its retry key expired.
var keyExpiredReason = fmt.Sprintf("not re-sent: first pushed more than %s ago, and LINE honours a retry key for 24 hours only, "+
	"so a re-send could deliver it twice (couponctl outbox requeue --force sends it anyway)", RetryKeyWindow)

// handle pushes one row inside the batch's time and records the outcome with markCtx.
func (r *Relay) handle(batchCtx, markCtx context.Context, run *runState, row outboxdb.Claimed) outcome {
	log := r.cfg.Logger.With("coupon_id", row.CouponID, "attempt", row.Attempts+1)
	if row.KeyExpired {
		logMark(markCtx, log, outboxdb.MarkParked(markCtx, r.pool, run.id, row.CouponID, keyExpiredReason, outboxdb.NotPushed))
		return outcomeParked
	}
	pushCtx, cancel := context.WithTimeout(batchCtx, r.cfg.PushTimeout)
	defer cancel()
	// Not pushed when the run has stopped, before or while waiting for the limiter, or when the
	// batch's time ran out in the wait.
	if run.stopped() != nil || r.limiter.Wait(pushCtx) != nil || run.stopped() != nil {
		return r.release(markCtx, log, run, row)
	}
	sent, err := r.tracedPush(pushCtx, row)
	run.breaker.record(err)
	switch {
	case err == nil:
		return r.markSent(markCtx, log, run, row)
	case errors.Is(err, ErrTokenRefused):
		stop := fmt.Errorf("%w (renew LINE_CHANNEL_ACCESS_TOKEN): %w", ErrTokenRefused, err)
		if run.tokenRefused.CompareAndSwap(nil, &stop) {
			log.ErrorContext(markCtx, "outbox: LINE refused the channel access token; run ended, rows given back unharmed",
				"err", err)
		}
		return r.release(markCtx, log, run, row)
	case !sent: // the request never left: LINE saw nothing
		return r.release(markCtx, log, run, row)
	}
	log.WarnContext(markCtx, "outbox: push failed", "err", err)
	return r.markFailed(markCtx, log, run, row, err)
}

// markSent records an accepted push. If that fails, the row is sent back at once for a
// re-send: the next run pushes it with the same retry key and LINE answers 409.
func (r *Relay) markSent(ctx context.Context, log *slog.Logger, run *runState, row outboxdb.Claimed) outcome {
	err := outboxdb.MarkSent(ctx, r.pool, row.CouponID)
	if err == nil {
		return outcomeSent
	}
	log.WarnContext(ctx, "outbox: pushed but not marked sent; releasing for a re-send", "err", err)
	logMark(ctx, log, outboxdb.MarkRetry(ctx, r.pool, run.id, row.CouponID, 0, "pushed, but marking it sent failed: "+err.Error()))
	return outcomeRetryLater
}

// markFailed records a push LINE did not accept: parked when LINE refused it or it was the
// last attempt, else sent back after a full-jitter wait, or LINE's Retry-After (at most
// RetryCap) if longer.
func (r *Relay) markFailed(ctx context.Context, log *slog.Logger, run *runState, row outboxdb.Claimed, err error) outcome {
	park := func(reason string) outcome {
		logMark(ctx, log, outboxdb.MarkParked(ctx, r.pool, run.id, row.CouponID, reason, outboxdb.Pushed))
		return outcomeParked
	}
	switch {
	case errors.Is(err, ErrPushRejected):
		return park(err.Error())
	case row.Attempts+1 >= r.cfg.MaxAttempts:
		return park(fmt.Sprintf("attempt limit %d reached: %v", r.cfg.MaxAttempts, err))
	}
	wait := backoff.FullJitter(r.cfg.RetryBase, r.cfg.RetryCap, row.Attempts+1)
	var pe *PushError
	if errors.As(err, &pe) {
		wait = max(wait, min(pe.RetryAfter, r.cfg.RetryCap))
	}
	logMark(ctx, log, outboxdb.MarkRetry(ctx, r.pool, run.id, row.CouponID, wait, err.Error()))
	return outcomeRetryLater
}

// release gives an unpushed row back ([outboxdb.Release]).
func (r *Relay) release(ctx context.Context, log *slog.Logger, run *runState, row outboxdb.Claimed) outcome {
	logMark(ctx, log, outboxdb.Release(ctx, r.pool, run.id, row))
	return outcomeReleased
}

// logMark logs a mark's failure, which is left to the lease: the row returns when it ends.
func logMark(ctx context.Context, log *slog.Logger, err error) {
	if err != nil {
		log.ErrorContext(ctx, "outbox: mark failed; the row returns when its lease ends", "err", err)
	}
}
