package issuance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/ids"
)

// ResultAvailable is a dry run's answer when the member would be issued a coupon now
// ([Service.DryRun]); an issuance never answers it.
const ResultAvailable Result = "AVAILABLE"

// DryRunOutcome is what [Service.DryRun] found.
type DryRunOutcome struct {
	// Result is [ResultAvailable] or the refusal an issuance would answer now: ALREADY_ISSUED,
	// COUPON_VOIDED, NOT_ELIGIBLE, CAMPAIGN_NOT_ACTIVE, MONTHLY_CAP, BUDGET_EXCEEDED,
	// UNKNOWN_CAMPAIGN; or RETRY_EXHAUSTED when the database did not answer within the budget or
	// the call lost its connection.
	Result Result
	// CouponID is the member's coupon (ALREADY_ISSUED, COUPON_VOIDED).
	CouponID string
	// AmountYen is the coupon's face value in yen (AVAILABLE).
	AmountYen int
	// ExpiresAt is when a coupon issued now would expire (AVAILABLE), or when the member's
	// expires (ALREADY_ISSUED); nil when the campaign gives no validity.
	ExpiresAt *time.Time
	// Reason says why the campaign is not active (CAMPAIGN_NOT_ACTIVE), as [Outcome.Reason].
	Reason string
	// RemainingCoupons is how many coupons the campaign's budget stripes can still issue now, by
	// the budget and the releases (AVAILABLE, BUDGET_EXCEEDED: 0); nil otherwise.
	RemainingCoupons *int
	// NextReleaseAt is as [Outcome.NextReleaseAt], and also given on AVAILABLE.
	NextReleaseAt *time.Time
	// ReadLag is how far behind the primary the read pool was, as it measured itself in the
	// call that answered ([Service.UseReadPool]); nil when the primary answered.
	ReadLag *time.Duration
}

// DryRun answers what [Service.Issue] would answer memberID for campaignID now, writing
// nothing and locking no row: plain reads of the committed state, so it neither waits for an
// issuance nor holds one up. Its answer can be outrun: another member may take the last coupon
// right after it.
//
// The dry run is a member of a group, as an issuance is (docs/design.md, "Coalescing a hot
// campaign"), but in a coalescer of its own: alone, or with the dry runs of its campaign that
// arrive while a dry run's call for it is in flight in this instance, at most [Config.BatchMax]
// (1: never coalesced). A group is one call of issue_dry_run_batch
// (schema/current/issue_dry_run_batch.sql), one round trip on one pooled connection, and each
// member's answer is as of that call. With a read pool ([Service.UseReadPool]) the call is made
// there, and made again on the primary when the pool's lag is past its bound.
//
// It is not retried (nothing is at stake: the caller asks again); a call that does not answer
// within the budget ([Config.Budget]), or loses its connection, is RETRY_EXHAUSTED. Errors: a
// wrapped [ids.ErrInvalid] for malformed ids, ctx's error when the caller gives up, an error
// wrapping a panic of the call, and any database error.
func (s *Service) DryRun(ctx context.Context, memberID, campaignID string) (DryRunOutcome, error) {
	if err := ids.Request(memberID, campaignID); err != nil {
		return DryRunOutcome{}, err
	}
	deadline := attemptsEnd(time.Now().Add(s.cfg.Budget))
	waitCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	j := &dryJoined{caller: ctx, ctx: waitCtx, memberID: memberID, campaignID: campaignID, deadline: deadline,
		answer: make(chan dryAnswered, 1), lead: make(chan []*dryJoined, 1)}
	if s.dry == nil {
		s.runDry([]*dryJoined{j})
		a := <-j.answer
		return a.out, a.err
	}
	a := s.dry.do(j, s.runDry)
	return a.out, a.err
}

// dryJoined is one dry run: a member of the group that one call of issue_dry_run_batch answers.
type dryJoined struct {
	caller               context.Context // the caller's: its cancellation is an error, not RETRY_EXHAUSTED
	ctx                  context.Context // caller's, ending at deadline too
	memberID, campaignID string
	deadline             time.Time // its call's end
	answer               chan dryAnswered
	lead                 chan []*dryJoined
	answered             bool // its answer was sent (by the one goroutine that may answer it)
}

type dryAnswered struct {
	out DryRunOutcome
	err error
}

// reply sends j its answer, unless it has one already.
func (j *dryJoined) reply(out DryRunOutcome, err error) {
	if j.answered {
		return
	}
	j.answered = true
	j.answer <- dryAnswered{out: out, err: err}
}

// A dry run as the dry runs' coalescer queues it ([waiter]), and its answer on a panic (answerPanic).
func (j *dryJoined) campaign() string          { return j.campaignID }
func (j *dryJoined) due() time.Time            { return j.deadline }
func (j *dryJoined) context() context.Context  { return j.ctx }
func (j *dryJoined) answers() chan dryAnswered { return j.answer }
func (j *dryJoined) leads() chan []*dryJoined  { return j.lead }
func (j *dryJoined) fail(err error)            { j.reply(DryRunOutcome{}, err) }
func (j *dryJoined) quit(cause error)          { j.reply(j.failed(cause)) }

// failed is j's answer when its call, or its wait for one, ended in err: ctx's error when its
// caller gave up; RETRY_EXHAUSTED when err is nil (its time cannot fit a call), the deadline, a
// timeout, contention or a lost connection (isConnLost: a refused dial, a session the server
// ended), as an issuance whose database stays unreachable answers; else err, wrapped.
func (j *dryJoined) failed(err error) (DryRunOutcome, error) {
	switch {
	case j.caller.Err() != nil:
		return DryRunOutcome{}, fmt.Errorf("issuance: dry run: %w", j.caller.Err())
	case err == nil, errors.Is(err, context.DeadlineExceeded), isTimeout(err), IsRetryable(err), isConnLost(err, false):
		return DryRunOutcome{Result: ResultRetryExhausted}, nil
	}
	return DryRunOutcome{}, fmt.Errorf("issuance: dry run: %w", err)
}

// runDry answers each member of group, all of one campaign, from one call of
// issue_dry_run_batch, on every path, a panic included. A dry run alone calls under its caller's
// context; a group's call no member's cancellation ends. The call ends by the group's tightest
// deadline.
func (s *Service) runDry(group []*dryJoined) {
	defer answerPanic(group)
	ctx := group[0].ctx
	if len(group) > 1 {
		ctx = context.WithoutCancel(ctx)
	}
	tightest := group[0].deadline
	members := make([]string, len(group))
	for i, j := range group {
		members[i] = j.memberID
		if j.deadline.Before(tightest) {
			tightest = j.deadline
		}
	}
	ctx, cancel := context.WithDeadline(ctx, tightest)
	defer cancel()
	outs, err := s.dryCall(ctx, group[0].campaignID, members)
	for i, j := range group {
		if err != nil {
			j.reply(j.failed(err))
		} else {
			j.reply(outs[i], nil)
		}
	}
}

// dryQuery is one call of issue_dry_run_batch on q with query (sqlDryRunBatch, or with lagged
// sqlDryRunBatchLagged, whose last column is the server's lag in microseconds): the answers of
// members, in their order, and with lagged the lag (nil when the server could not tell).
func dryQuery(ctx context.Context, q db.Querier, query, campaignID string, members []string, lagged bool) ([]DryRunOutcome, *time.Duration, error) {
	rows, err := q.Query(ctx, query, campaignID, members)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	outs := make([]DryRunOutcome, len(members))
	var lag *time.Duration
	got := 0
	for rows.Next() {
		i, out, lagUs, err := scanDry(rows, lagged)
		if err != nil {
			return nil, nil, err
		}
		if i < 1 || i > len(members) {
			return nil, nil, fmt.Errorf("issue_dry_run_batch answered member %d of %d", i, len(members))
		}
		if lagUs != nil {
			d := time.Duration(max(*lagUs, 0)) * time.Microsecond
			lag = &d
		}
		outs[i-1] = out
		got++
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	if got != len(members) {
		return nil, nil, fmt.Errorf("issue_dry_run_batch answered %d rows for %d members", got, len(members))
	}
	return outs, lag, nil
}

// scanDry reads one row of dryQuery's call: the member's index from 1, its answer, and with
// lagged the server's lag in microseconds.
func scanDry(rows pgx.Rows, lagged bool) (i int, out DryRunOutcome, lagUs *int64, err error) {
	var result string
	var coupon, reason *string
	var amount *int
	dest := []any{&i, &result, &coupon, &amount, &reason, &out.ExpiresAt, &out.RemainingCoupons, &out.NextReleaseAt}
	if lagged {
		dest = append(dest, &lagUs)
	}
	if err := rows.Scan(dest...); err != nil {
		return 0, out, nil, err
	}
	out.Result = Result(result)
	if coupon != nil {
		out.CouponID = *coupon
	}
	if amount != nil {
		out.AmountYen = *amount
	}
	if reason != nil {
		out.Reason = *reason
	}
	return i, out, lagUs, nil
}
