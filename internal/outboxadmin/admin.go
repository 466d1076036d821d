package outboxadmin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/outbox"
)

// Status counts the outbox rows by state, in rows, and lists the dead letters.
type Status struct {
	Sent     int64 // delivered (sent_at set)
	Skipped  int64 // closed without a push: the member has no LINE account linked (skipped_at set)
	Due      int64 // waiting for the next run
	Waiting  int64 // backing off after a failed push (next_attempt_at in the future)
	InFlight int64 // claimed by a run whose lease has not ended
	Parked   int64 // dead letters (parked_at set)
	// ParkedRows are the dead letters, oldest first, at most the limit given to [ReadStatus].
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

const sqlStatus = `
SELECT count(*) FILTER (WHERE sent_at IS NOT NULL),
       count(*) FILTER (WHERE skipped_at IS NOT NULL),
       count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL
                          AND next_attempt_at <= now()),
       count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL
                          AND next_attempt_at > now() AND claimed_by IS NULL),
       count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL
                          AND next_attempt_at > now() AND claimed_by IS NOT NULL),
       count(*) FILTER (WHERE parked_at IS NOT NULL)
  FROM notification_outbox`

const sqlOutboxParkedList = `
SELECT coupon_id::text, member_id, attempts, parked_at, COALESCE(last_error, '')
  FROM notification_outbox WHERE parked_at IS NOT NULL
 ORDER BY parked_at, coupon_id LIMIT $1`

// Status reads the outbox through q, listing at most limit parked rows.
func ReadStatus(ctx context.Context, q db.Querier, limit int) (Status, error) {
	var s Status
	if err := q.QueryRow(ctx, sqlStatus).Scan(&s.Sent, &s.Skipped, &s.Due, &s.Waiting, &s.InFlight, &s.Parked); err != nil {
		return s, fmt.Errorf("outboxadmin: outbox status: %w", err)
	}
	rows, err := q.Query(ctx, sqlOutboxParkedList, limit)
	if err != nil {
		return s, fmt.Errorf("outboxadmin: parked rows: %w", err)
	}
	s.ParkedRows, err = pgx.CollectRows(rows, pgx.RowToStructByPos[ParkedRow])
	if err != nil {
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

// sqlOutboxRequeue reopens closed rows: all parked and skipped rows when $1, else those in $2.
// A row is reopened when its member has a LINE account linked and its first push is inside the
// retry-key window $3, or when $4 (force) says to send it anyway; forcing clears first_pushed_at,
// since the push will be new to LINE. The attempt count starts again, last_error is kept for
// history. It returns each row it looked at with whether it was reopened and why not.
const sqlOutboxRequeue = `
WITH target AS MATERIALIZED (
  SELECT o.coupon_id,
         COALESCE(o.first_pushed_at < now() - $3::interval, false) AS key_expired,
         EXISTS (SELECT 1 FROM member_line_accounts l WHERE l.member_id = o.member_id) AS linked
    FROM notification_outbox o
   WHERE (o.parked_at IS NOT NULL OR o.skipped_at IS NOT NULL) AND ($1 OR o.coupon_id = ANY($2::uuid[]))
     FOR UPDATE OF o
), reopened AS (
  UPDATE notification_outbox o
     SET parked_at = NULL, skipped_at = NULL, attempts = 0, next_attempt_at = now(),
         first_pushed_at = CASE WHEN $4 THEN NULL ELSE o.first_pushed_at END
    FROM target t
   WHERE o.coupon_id = t.coupon_id AND t.linked AND (NOT t.key_expired OR $4)
  RETURNING o.coupon_id
)
SELECT t.coupon_id::text, r.coupon_id IS NOT NULL, t.key_expired, t.linked
  FROM target t LEFT JOIN reopened r USING (coupon_id)
 ORDER BY t.coupon_id`

// Requeue puts parked and skipped rows back into the outbox for the next run: every one when
// all is true, else those among couponIDs (UUIDs; rows that are neither are left alone). A row
// first pushed more than [outbox.RetryKeyWindow] ago is refused unless force (see
// [RequeueResult.KeyExpired]); a row whose member has no LINE account linked is left as it is.
// Errors: a malformed UUID (SQLSTATE 22P02) or any database error; nothing is requeued then.
func Requeue(ctx context.Context, q db.Querier, all bool, couponIDs []string, force bool) (RequeueResult, error) {
	var res RequeueResult
	rows, err := q.Query(ctx, sqlOutboxRequeue, all, couponIDs, outbox.RetryKeyWindow, force)
	if err != nil {
		return res, fmt.Errorf("outboxadmin: requeue: %w", err)
	}
	var id string
	var requeued, keyExpired, linked bool
	_, err = pgx.ForEachRow(rows, []any{&id, &requeued, &keyExpired, &linked}, func() error {
		switch {
		case requeued:
			res.Requeued = append(res.Requeued, id)
		case !linked:
			res.Unlinked = append(res.Unlinked, id)
		case keyExpired:
			res.KeyExpired = append(res.KeyExpired, id)
		}
		return nil
	})
	if err != nil {
		return RequeueResult{}, fmt.Errorf("outboxadmin: requeue: %w", err)
	}
	return res, nil
}
