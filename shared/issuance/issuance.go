package issuance

import (
	"context"
	"errors"
	"fmt"
	"time"
	_ "time/tzdata" // Asia/Tokyo must load on images without a zoneinfo database

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/shared/backoff"
	"github.com/mops/coupon-api/shared/ids"
)

// Result is the outcome code callers branch on (docs/api.md, "IssueCoupon").
type Result string

// The results of one call. Only ResultIssued wrote anything.
const (
	ResultIssued            Result = "ISSUED"              // coupon, usage, budget and outbox row committed together
	ResultAlreadyIssued     Result = "ALREADY_ISSUED"      // R2: this member holds this campaign's coupon (double tap, re-send)
	ResultMonthlyCap        Result = "MONTHLY_CAP"         // R3 would be broken
	ResultBudgetExceeded    Result = "BUDGET_EXCEEDED"     // R1 would be broken
	ResultCampaignNotActive Result = "CAMPAIGN_NOT_ACTIVE" // outside starts_at..ends_at
	ResultUnknownCampaign   Result = "UNKNOWN_CAMPAIGN"    // no such campaign
	ResultRetryExhausted    Result = "RETRY_EXHAUSTED"     // contention or timeouts outlasted the budget; safe to re-send
)

// Outcome is what one call did.
type Outcome struct {
	Result Result
	// CouponID is the issued coupon (ISSUED) or the one the member already holds (ALREADY_ISSUED).
	CouponID string
	// AmountYen is the coupon's face value in yen (ISSUED).
	AmountYen int
	// Month is the Asia/Tokyo calendar month the coupon counts against, YYYY-MM (ISSUED).
	Month string
	// Attempts is how many transactions were started: at most [MaxAttempts] lost to
	// contention, more when connections failed (then the budget bounds them).
	Attempts int
}

// Tokyo is the time zone of the R3 calendar month (the member cap regulation counts in JST).
var Tokyo = mustLoad("Asia/Tokyo")

// Month returns the Asia/Tokyo calendar month of t as YYYY-MM.
func Month(t time.Time) string { return t.In(Tokyo).Format("2006-01") }

// Service issues coupons on a pgx pool. It is safe for concurrent use.
type Service struct {
	pool *pgxpool.Pool
	cfg  Config
}

// New returns a Service over pool, with cfg's zero fields defaulted. It refuses a cfg that
// [Config.Validate] rejects.
func New(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Service{pool: pool, cfg: cfg}, nil
}

// Issue gives member memberID one coupon of campaign campaignID, or says why not.
//
// Each attempt is one READ COMMITTED transaction that takes its locks in this order:
//
//  1. R2: the coupon insert, judged by the unique index on (campaign_id, member_id);
//  2. R3: the member x month usage row, created if missing, then one conditional add;
//  3. the outbox row (a new row: it waits on nobody);
//  4. R1: the campaign budget row (or one of its budget stripes, see [addToBudget]), one
//     conditional add, last, so the hottest lock is held only for the COMMIT round trip
//     (docs/hot-row.md).
//
// A check that fails rolls the whole transaction back: a rejected request writes nothing.
// Attempts are run again, after a full-jitter wait and never past the budget, when:
//
//   - they fail with 40001, 40P01 or 55P03 (contention), at most [MaxAttempts] in all;
//   - their connection fails before COMMIT is sent (a database restart or failover: 57P01 on
//     every pooled connection; a refused dial while the database is down), since the server
//     rolled the transaction back; these retries end only with the budget;
//   - they fail with 0A000 "cached plan must not change result type" (a migration changed a
//     column type under a pooled connection's prepared statement), once per call.
//
// When the budget ends first, or statement_timeout ends an attempt, the result is
// RETRY_EXHAUSTED: nothing was written. When the COMMIT was sent but its answer lost, Issue
// settles it before answering (see [Service.resolve]): ISSUED if the coupon was committed.
//
// Errors: a wrapped [ids.ErrInvalid] for malformed ids, ctx's error when the caller gives up,
// [ErrOutcomeUnknown] when a lost COMMIT answer cannot be settled, and any other database
// error unretried (the caller answers 500).
func (s *Service) Issue(ctx context.Context, memberID, campaignID string) (out Outcome, err error) {
	if err := ids.Request(memberID, campaignID); err != nil {
		return Outcome{}, err
	}
	deadline := time.Now().Add(s.cfg.Budget)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	issuedAt := s.cfg.Now()
	req := request{memberID: memberID, campaignID: campaignID, issuedAt: issuedAt, month: Month(issuedAt)}
	ctx, span := startIssue(ctx, req)
	defer func() { span.end(ctx, out, err) }()
	exhausted := func(attempts int) (Outcome, error) {
		return Outcome{Result: ResultRetryExhausted, Attempts: attempts}, nil
	}
	contended, stalePlans := 0, 0
	for attempt := 1; ; attempt++ {
		left := time.Until(deadline)
		if left < minAttemptTime+serverMargin {
			return exhausted(attempt - 1)
		}
		out, err := s.attempt(ctx, req, left)
		span.attempted(ctx, attempt, err)
		out.Attempts = attempt
		var rej *rejection
		var unknown *commitUnknownError
		if errors.As(err, &unknown) {
			out, err = s.resolve(ctx, req, out, unknown)
			out.Attempts = attempt
		}
		switch {
		case err == nil:
			return out, nil
		case errors.As(err, &rej):
			rej.out.Attempts = attempt
			return rej.out, nil
		case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
			return Outcome{}, fmt.Errorf("issuance: %w", ctx.Err()) // the caller went away
		case errors.Is(err, ErrOutcomeUnknown):
			return Outcome{}, err
		case errors.As(err, new(*connLostError)):
			// Retried until the budget ends: each dead pooled connection costs one round trip.
		case isTimeout(err):
			return exhausted(attempt)
		case isStalePlan(err) && stalePlans == 0:
			stalePlans++
			continue // the statement is prepared afresh at once: no contention to wait out
		case !IsRetryable(err):
			return Outcome{}, fmt.Errorf("issuance: attempt %d: %w", attempt, err)
		default:
			if contended++; contended == MaxAttempts {
				return exhausted(attempt)
			}
		}
		wait := backoff.FullJitter(BackoffBase, BackoffCap, attempt)
		if time.Until(deadline)-wait < minAttemptTime+serverMargin {
			return exhausted(attempt)
		}
		span.waiting(wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return exhausted(attempt)
		}
	}
}

type request struct {
	memberID, campaignID string
	issuedAt             time.Time
	month                string
}

// attempt runs one issuance transaction with timeouts derived from left, the time remaining.
// Besides a [rejection] or a statement's error it returns a [connLostError] when the connection
// failed before COMMIT was sent, and a [commitUnknownError] when it failed after.
func (s *Service) attempt(ctx context.Context, r request, left time.Duration) (out Outcome, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		if isConnLost(err, false) {
			return out, &connLostError{err}
		}
		return out, err
	}
	defer conn.Release()
	defer func() { // classify a failure before COMMIT once, here
		var unknown *commitUnknownError
		if err != nil && !errors.As(err, &unknown) && isConnLost(err, conn.Conn().IsClosed()) && ctx.Err() == nil {
			err = &connLostError{err}
		}
	}()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return out, err
	}
	var xid string
	if out, xid, err = s.statements(ctx, tx, r, left); err != nil {
		// The rollback runs even when the caller has gone: a connection handed back to the
		// pool must not carry a transaction, and its locks must not outlive the request.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = tx.Rollback(rctx) // on failure pgx closes the connection; the pool drops it
		return out, err
	}
	if err := tx.Commit(ctx); err != nil {
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Severity == "ERROR":
			return out, err // the server refused the COMMIT: rolled back
		case ctx.Err() != nil && pgconn.SafeToRetry(err) && errors.Is(err, ctx.Err()):
			// pgx checks the context before sending: the budget (or the caller) ended first and
			// the COMMIT never left; pgx closed the connection, so the server rolls back.
			return out, err
		}
		// Anything else is settled by a look-up, even a plain pgconn.SafeToRetry: pgx v5.12
		// reports a connection that dropped while COMMIT's answer was awaited as "conn closed",
		// safe to retry, though the server had committed (TestLostCommitAnswer).
		return out, &commitUnknownError{err: err, pid: conn.Conn().PgConn().PID(), xid: xid}
	}
	return out, nil
}

// statements runs the statements of one attempt in tx, in lock order. It returns the outcome
// and the transaction's id (for settling a lost COMMIT answer).
func (s *Service) statements(ctx context.Context, tx pgx.Tx, r request, left time.Duration) (Outcome, string, error) {
	lockTimeout, statementTimeout := s.cfg.attemptTimeouts(left)
	out := Outcome{Result: ResultIssued, Month: r.month}
	if _, err := tx.Exec(ctx, sqlTimeoutsSet, pgInterval(lockTimeout), pgInterval(statementTimeout)); err != nil {
		return out, "", err
	}

	// R2: one coupon per (campaign, member), judged by the partial unique index.
	var stripes int
	err := tx.QueryRow(ctx, sqlCouponInsert, r.campaignID, r.memberID, r.month, r.issuedAt).
		Scan(&out.CouponID, &out.AmountYen, &stripes)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, "", whyNotInserted(ctx, tx, r)
	}
	if err != nil {
		return out, "", err
	}

	// R3: the member x month row, created first so that there is a row to collide on.
	if _, err := tx.Exec(ctx, sqlUsageEnsure, r.memberID, r.month); err != nil {
		return out, "", err
	}
	var usedYen int
	err = tx.QueryRow(ctx, sqlUsageAdd, r.memberID, r.month, out.AmountYen, s.cfg.MonthlyCapYen).Scan(&usedYen)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, "", &rejection{Outcome{Result: ResultMonthlyCap}}
	}
	if err != nil {
		return out, "", err
	}

	// Transactional outbox: the push is the relay's job, after COMMIT.
	if _, err := tx.Exec(ctx, sqlOutboxInsert, out.CouponID, r.memberID, r.issuedAt, traceParent(ctx)); err != nil {
		return out, "", err
	}

	// R1: a campaign budget stripe row, last; COMMIT follows at once.
	xid, err := addToBudget(ctx, tx, r.campaignID, out.AmountYen, stripes)
	return out, xid, err
}

// resolve settles an attempt whose COMMIT answer was lost (docs/api.md: never "nothing was
// written" for a coupon that exists), on a fresh connection and a fresh context of
// [ResolveTimeout]: the caller's deadline has often passed already. It first makes sure the attempt's transaction is over
// (if its backend still runs it, COMMIT is in flight or never arrived: the backend is
// terminated and waited for), then looks the coupon up by (campaign_id, member_id):
//
//   - found, with the attempt's id: ISSUED, as the attempt would have answered;
//   - found, another id: ALREADY_ISSUED with that id;
//   - absent: nothing was written; a [connLostError], so Issue retries while the budget lasts.
//
// If the transaction's end cannot be confirmed, or the look-up fails, it returns
// [ErrOutcomeUnknown].
func (s *Service) resolve(ctx context.Context, r request, attempted Outcome, lost *commitUnknownError) (Outcome, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ResolveTimeout)
	defer cancel()
	// A connection of its own, not one from the pool: under load every pooled connection may
	// be busy (measured at 256 clients on a pool of 256), and the look-up must not queue.
	// The network that lost the answer may be back a moment later: dial again until the
	// look-up's time is up.
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	for err != nil && ctx.Err() == nil {
		time.Sleep(terminateStep)
		conn, err = pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	}
	if err != nil {
		return Outcome{}, fmt.Errorf("%w: %v (after: %v)", ErrOutcomeUnknown, err, lost.err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Terminate and wait in short steps, each re-reading whether the backend still runs the
	// transaction: it drops it (backend_xid) as soon as the abort is done, before it exits, and
	// pg_terminate_backend itself only looks every 100 ms.
	var ended bool
	deadline, _ := ctx.Deadline()
	for !ended && time.Until(deadline) > 2*terminateStep {
		if err := conn.QueryRow(ctx, sqlTransactionEnd, int64(lost.pid), lost.xid, terminateStep.Milliseconds()).Scan(&ended); err != nil {
			return Outcome{}, fmt.Errorf("%w: %v (after: %v)", ErrOutcomeUnknown, err, lost.err)
		}
	}
	var existing *string
	if err := conn.QueryRow(ctx, sqlCouponOf, r.campaignID, r.memberID).Scan(&existing); err != nil {
		return Outcome{}, fmt.Errorf("%w: %v (after: %v)", ErrOutcomeUnknown, err, lost.err)
	}
	switch {
	case existing != nil && *existing == attempted.CouponID:
		return attempted, nil
	case existing != nil:
		return Outcome{Result: ResultAlreadyIssued, CouponID: *existing}, nil
	case !ended:
		return Outcome{}, fmt.Errorf("%w: the transaction of backend %d still runs (after: %v)", ErrOutcomeUnknown, lost.pid, lost.err)
	}
	return Outcome{}, &connLostError{lost.err}
}

// whyNotInserted turns a coupon insert that wrote nothing into its rejection.
func whyNotInserted(ctx context.Context, tx pgx.Tx, r request) error {
	var existing *string
	var known bool
	if err := tx.QueryRow(ctx, sqlCouponWhyNot, r.campaignID, r.memberID).Scan(&existing, &known); err != nil {
		return err
	}
	switch {
	case existing != nil:
		return &rejection{Outcome{Result: ResultAlreadyIssued, CouponID: *existing}}
	case !known:
		return &rejection{Outcome{Result: ResultUnknownCampaign}}
	default:
		return &rejection{Outcome{Result: ResultCampaignNotActive}}
	}
}

// pgInterval formats d as a PostgreSQL duration setting in whole milliseconds, at least 1 ms
// (0 would mean "no timeout").
func pgInterval(d time.Duration) string {
	return fmt.Sprintf("%dms", max(1, d.Milliseconds()))
}

func mustLoad(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err) // time/tzdata is embedded, so this cannot fail
	}
	return loc
}
