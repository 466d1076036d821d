package issuance

import (
	"context"
	"errors"
	"fmt"
	"time"
	_ "time/tzdata" // Asia/Tokyo must load on images without a zoneinfo database

	"github.com/jackc/pgx/v5"
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
	// Attempts is how many transactions were started, 1 to [MaxAttempts].
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
// Attempts that fail with 40001, 40P01 or 55P03 are retried after a full-jitter wait, at most
// [MaxAttempts] in all and never past the budget; then the result is RETRY_EXHAUSTED, as it is
// when statement_timeout or the budget's deadline ends an attempt.
//
// Errors: a wrapped [ids.ErrInvalid] for malformed ids, ctx's error when the caller gives up,
// and any other database error unretried (the caller answers 500).
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
	for attempt := 1; ; attempt++ {
		left := time.Until(deadline)
		if left < minAttemptTime {
			return exhausted(attempt - 1)
		}
		out, err := s.attempt(ctx, req, left)
		span.attempted(ctx, attempt, err)
		out.Attempts = attempt
		var rej *rejection
		switch {
		case err == nil:
			return out, nil
		case errors.As(err, &rej):
			rej.out.Attempts = attempt
			return rej.out, nil
		case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
			return Outcome{}, fmt.Errorf("issuance: %w", ctx.Err()) // the caller went away
		case isTimeout(err):
			return exhausted(attempt)
		case !IsRetryable(err):
			return Outcome{}, fmt.Errorf("issuance: attempt %d: %w", attempt, err)
		case attempt == MaxAttempts:
			return exhausted(attempt)
		}
		wait := backoff.FullJitter(BackoffBase, BackoffCap, attempt)
		if time.Until(deadline)-wait < minAttemptTime {
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
func (s *Service) attempt(ctx context.Context, r request, left time.Duration) (Outcome, error) {
	lockTimeout, statementTimeout := s.cfg.attemptTimeouts(left)
	out := Outcome{Result: ResultIssued, Month: r.month}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlTimeoutsSet, pgInterval(lockTimeout), pgInterval(statementTimeout)); err != nil {
			return err
		}

		// R2: one coupon per (campaign, member), judged by the unique index.
		var stripes int
		err := tx.QueryRow(ctx, sqlCouponInsert, r.campaignID, r.memberID, r.month, r.issuedAt).
			Scan(&out.CouponID, &out.AmountYen, &stripes)
		if errors.Is(err, pgx.ErrNoRows) {
			return whyNotInserted(ctx, tx, r)
		}
		if err != nil {
			return err
		}

		// R3: the member x month row, created first so that there is a row to collide on.
		if _, err := tx.Exec(ctx, sqlUsageEnsure, r.memberID, r.month); err != nil {
			return err
		}
		var usedYen int
		err = tx.QueryRow(ctx, sqlUsageAdd, r.memberID, r.month, out.AmountYen, s.cfg.MonthlyCapYen).Scan(&usedYen)
		if errors.Is(err, pgx.ErrNoRows) {
			return &rejection{Outcome{Result: ResultMonthlyCap}}
		}
		if err != nil {
			return err
		}

		// Transactional outbox: the push is the relay's job, after COMMIT.
		if _, err := tx.Exec(ctx, sqlOutboxInsert, out.CouponID, r.memberID, r.issuedAt, traceParent(ctx)); err != nil {
			return err
		}

		// R1: a campaign budget stripe row, last; COMMIT follows at once.
		return addToBudget(ctx, tx, r.campaignID, out.AmountYen, stripes)
	})
	return out, err
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
