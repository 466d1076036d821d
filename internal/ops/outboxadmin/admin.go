package outboxadmin

import (
	"context"
	"fmt"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/outbox"
	"github.com/mops/coupon-api/shared/outbox/outboxdb"
)

// Status counts the outbox rows by state, in rows, and lists the dead letters.
type Status struct {
	outboxdb.Counts
	// ParkedRows are the dead letters, oldest first, at most the limit given to [ReadStatus].
	ParkedRows []outboxdb.ParkedRow
}

// ReadStatus reads the outbox through q, listing at most limit parked rows.
func ReadStatus(ctx context.Context, q db.Querier, limit int) (Status, error) {
	var s Status
	var err error
	if s.Counts, err = outboxdb.ReadCounts(ctx, q); err != nil {
		return s, fmt.Errorf("outboxadmin: outbox status: %w", err)
	}
	if s.ParkedRows, err = outboxdb.ReadParked(ctx, q, limit); err != nil {
		return s, fmt.Errorf("outboxadmin: parked rows: %w", err)
	}
	return s, nil
}

// RequeueResult is what [Requeue] did with each parked or skipped row it was given.
type RequeueResult struct {
	// Requeued rows go to the next run with a fresh attempt count.
	Requeued []string
	// KeyExpired rows were left parked: first pushed more than [outbox.RetryKeyWindow] ago, so LINE no
	// longer knows their retry key and a re-send may deliver the coupon twice. Requeue with
	// force sends them anyway, as a new push.
	KeyExpired []string
	// Unlinked rows were left skipped: their member still has no LINE account linked.
	Unlinked []string
}

// RequeueRequest says which parked and skipped rows [Requeue] puts back.
type RequeueRequest struct {
	// All is every parked and skipped row; otherwise those among CouponIDs (UUIDs; rows that
	// are neither parked nor skipped are left alone).
	All       bool
	CouponIDs []string
	// Force requeues a row first pushed more than [outbox.RetryKeyWindow] ago too, as a new
	// push (see [RequeueResult.KeyExpired]).
	Force bool
}

// Requeue puts the parked and skipped rows req names back into the outbox for the next run
// ([outboxdb.Requeue]). A row first pushed more than [outbox.RetryKeyWindow] ago is refused
// unless req.Force; a row whose member has no LINE account linked is left as it is. Errors: a
// malformed UUID (SQLSTATE 22P02) or any database error; nothing is requeued then.
func Requeue(ctx context.Context, q db.Querier, req RequeueRequest) (RequeueResult, error) {
	rows, err := outboxdb.Requeue(ctx, q, outboxdb.RequeueParams{
		All: req.All, CouponIDs: req.CouponIDs, KeyWindow: outbox.RetryKeyWindow, Force: req.Force})
	if err != nil {
		return RequeueResult{}, fmt.Errorf("outboxadmin: requeue: %w", err)
	}
	var res RequeueResult
	for _, row := range rows {
		switch {
		case row.Requeued:
			res.Requeued = append(res.Requeued, row.CouponID)
		case !row.Linked:
			res.Unlinked = append(res.Unlinked, row.CouponID)
		case row.KeyExpired:
			res.KeyExpired = append(res.KeyExpired, row.CouponID)
		}
	}
	return res, nil
}
