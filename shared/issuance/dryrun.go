package issuance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mops/coupon-api/shared/ids"
)

// ResultAvailable is a dry run's answer when the member would be issued a coupon now
// ([Service.DryRun]); an issuance never answers it.
const ResultAvailable Result = "AVAILABLE"

// DryRunOutcome is what [Service.DryRun] found.
type DryRunOutcome struct {
	// Result is [ResultAvailable] or the refusal an issuance would answer now: ALREADY_ISSUED,
	// COUPON_VOIDED, NOT_ELIGIBLE, CAMPAIGN_NOT_ACTIVE, MONTHLY_CAP, BUDGET_EXCEEDED,
	// UNKNOWN_CAMPAIGN; or RETRY_EXHAUSTED when the database did not answer within the budget.
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
}

// DryRun answers what [Service.Issue] would answer memberID for campaignID now, writing
// nothing and locking no row: one call of issue_dry_run (schema/current/issue_dry_run.sql),
// plain reads of the committed state, so it neither waits for an issuance nor holds one up.
// Its answer can be outrun: another member may take the last coupon right after it.
//
// It is not retried (nothing is at stake: the caller asks again); a call that does not answer
// within the budget ([Config.Budget]) is RETRY_EXHAUSTED. Errors: a wrapped [ids.ErrInvalid]
// for malformed ids, ctx's error when the caller gives up, and any database error.
func (s *Service) DryRun(ctx context.Context, memberID, campaignID string) (DryRunOutcome, error) {
	if err := ids.Request(memberID, campaignID); err != nil {
		return DryRunOutcome{}, err
	}
	callCtx, cancel := context.WithDeadline(ctx, attemptsEnd(time.Now().Add(s.cfg.Budget)))
	defer cancel()
	var out DryRunOutcome
	var result string
	var coupon, reason *string
	var amount, remaining *int
	err := s.pool.QueryRow(callCtx, sqlDryRun, campaignID, memberID).
		Scan(&result, &coupon, &amount, &reason, &out.ExpiresAt, &remaining, &out.NextReleaseAt)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return DryRunOutcome{}, fmt.Errorf("issuance: dry run: %w", ctx.Err())
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err) || IsRetryable(err):
		return DryRunOutcome{Result: ResultRetryExhausted}, nil
	default:
		return DryRunOutcome{}, fmt.Errorf("issuance: dry run: %w", err)
	}
	out.Result, out.RemainingCoupons = Result(result), remaining
	if coupon != nil {
		out.CouponID = *coupon
	}
	if amount != nil {
		out.AmountYen = *amount
	}
	if reason != nil {
		out.Reason = *reason
	}
	return out, nil
}
