package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/shared/db"
)

// OutboxStatus counts the outbox rows by state, in rows, and lists the dead letters.
type OutboxStatus struct {
	Sent     int64 // delivered (sent_at set)
	Due      int64 // waiting for the next run
	Waiting  int64 // backing off after a failed push (next_attempt_at in the future)
	InFlight int64 // claimed by a run whose lease has not ended
	Parked   int64 // dead letters (parked_at set)
	// ParkedRows are the dead letters, oldest first, at most the limit given to [Status].
	ParkedRows []ParkedRow
}

// ParkedRow is one dead letter.
type ParkedRow struct {
	CouponID  string
	MemberID  string
	Attempts  int
	ParkedAt  time.Time
	LastError string
}

const sqlOutboxStatus = `
SELECT count(*) FILTER (WHERE sent_at IS NOT NULL),
       count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND next_attempt_at <= now()),
       count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND next_attempt_at > now()
                          AND claimed_by IS NULL),
       count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND next_attempt_at > now()
                          AND claimed_by IS NOT NULL),
       count(*) FILTER (WHERE parked_at IS NOT NULL)
  FROM notification_outbox`

const sqlOutboxParkedList = `
SELECT coupon_id::text, member_id, attempts, parked_at, COALESCE(last_error, '')
  FROM notification_outbox WHERE parked_at IS NOT NULL
 ORDER BY parked_at, coupon_id LIMIT $1`

// Status reads the outbox through q, listing at most limit parked rows.
func Status(ctx context.Context, q db.Querier, limit int) (OutboxStatus, error) {
	var s OutboxStatus
	if err := q.QueryRow(ctx, sqlOutboxStatus).Scan(&s.Sent, &s.Due, &s.Waiting, &s.InFlight, &s.Parked); err != nil {
		return s, fmt.Errorf("relay: outbox status: %w", err)
	}
	rows, err := q.Query(ctx, sqlOutboxParkedList, limit)
	if err != nil {
		return s, fmt.Errorf("relay: parked rows: %w", err)
	}
	s.ParkedRows, err = pgx.CollectRows(rows, pgx.RowToStructByPos[ParkedRow])
	if err != nil {
		return s, fmt.Errorf("relay: parked rows: %w", err)
	}
	return s, nil
}

// sqlOutboxRequeue un-parks dead letters: all of them when $1, else those in $2. The attempt
// count starts again, last_error is kept for history, and the next run takes them.
const sqlOutboxRequeue = `
UPDATE notification_outbox SET parked_at = NULL, attempts = 0, next_attempt_at = now()
 WHERE parked_at IS NOT NULL AND ($1 OR coupon_id = ANY($2::uuid[]))
RETURNING coupon_id::text`

// Requeue puts parked rows back into the outbox for the next run: every parked row when all is
// true, else the parked ones among couponIDs (UUIDs; rows that are not parked are left alone).
// It returns the coupon ids requeued. Errors: a malformed UUID (SQLSTATE 22P02) or any database
// error; nothing is requeued then.
func Requeue(ctx context.Context, q db.Querier, all bool, couponIDs []string) ([]string, error) {
	rows, err := q.Query(ctx, sqlOutboxRequeue, all, couponIDs)
	if err != nil {
		return nil, fmt.Errorf("relay: requeue: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("relay: requeue: %w", err)
	}
	return ids, nil
}
