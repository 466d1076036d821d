package outboxdb

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/shared/db"
)

// sqlPrune: $1 retention, $2 limit. The LIMIT sits in a MATERIALIZED CTE for the reason given
// on sqlClaim, and SKIP LOCKED lets two prunes run at once without waiting on each other. What
// each deleted row's push came to (sent, or skipped with the row's skip_reason) is kept in
// outbox_pruned in the same statement (00039), so that reconcile tells a pruned row from a lost
// one whatever the retention, and a coupon never pushed is never read as sent once its row is
// gone. The coupon row is read, never written: its issue time leads outbox_pruned's key.
const sqlPrune = `
WITH old AS MATERIALIZED (
  SELECT coupon_id FROM notification_outbox
   WHERE (sent_at IS NOT NULL OR skipped_at IS NOT NULL)
     AND COALESCE(sent_at, skipped_at) < now() - $1::interval
   ORDER BY COALESCE(sent_at, skipped_at)
   LIMIT $2
   FOR UPDATE SKIP LOCKED
), deleted AS (
  DELETE FROM notification_outbox o USING old WHERE o.coupon_id = old.coupon_id
  RETURNING o.coupon_id, CASE WHEN o.sent_at IS NOT NULL THEN 'sent' ELSE concat_ws(':', 'skipped', o.skip_reason) END AS outcome
), kept AS (
  INSERT INTO outbox_pruned (issued_at, coupon_id, outcome)
  SELECT i.issued_at, d.coupon_id, d.outcome FROM deleted d JOIN issued_coupons i USING (coupon_id)
   ORDER BY i.issued_at, d.coupon_id
  RETURNING 1
)
SELECT count(*) FROM kept`

// Prune deletes at most limit sent and skipped rows closed more than olderThan ago, oldest
// first (through the notification_outbox_closed index), and returns how many it deleted. Open
// and parked rows stay.
func Prune(ctx context.Context, q db.Querier, olderThan time.Duration, limit int) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, sqlPrune, olderThan, limit).Scan(&n)
	return n, err
}

// sqlGauges reads the outbox through its partial indexes, never the whole sent history: open
// rows and the oldest one's age in seconds (the relay's due index), parked rows (the parked
// index), and rows skipped in the last 24 hours (the closed-rows index).
const sqlGauges = `
SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8,
       (SELECT count(*) FROM notification_outbox WHERE parked_at IS NOT NULL),
       (SELECT count(*) FROM notification_outbox
         WHERE (sent_at IS NOT NULL OR skipped_at IS NOT NULL)
           AND COALESCE(sent_at, skipped_at) > now() - interval '1 day' AND skipped_at IS NOT NULL)
  FROM notification_outbox
 WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL`

// Gauges is what the outbox gauges show, in rows except OldestOpenAge.
type Gauges struct {
	Open           int64         // neither sent, parked nor skipped
	OldestOpenAge  time.Duration // age of the oldest open row; 0 when none
	Parked         int64         // dead letters
	SkippedLastDay int64         // skipped in the last 24 hours (any reason)
}

// ReadGauges reads [Gauges] in one statement.
func ReadGauges(ctx context.Context, q db.Querier) (Gauges, error) {
	var g Gauges
	var ageSeconds float64
	if err := q.QueryRow(ctx, sqlGauges).Scan(&g.Open, &ageSeconds, &g.Parked, &g.SkippedLastDay); err != nil {
		return Gauges{}, err
	}
	g.OldestOpenAge = time.Duration(ageSeconds * float64(time.Second))
	return g, nil
}

// sqlCounts: a row the previous release skipped has no skip_reason; its last_error says which
// of its two reasons it was.
const sqlCounts = `
WITH o AS (
  SELECT sent_at, skipped_at, parked_at, next_attempt_at, claimed_by,
         CASE WHEN skipped_at IS NOT NULL THEN COALESCE(skip_reason, CASE WHEN last_error LIKE 'skipped: the coupon was voided%'
                                                                         THEN 'voided' ELSE 'no_line_account' END) END AS skip_reason
    FROM notification_outbox
)
SELECT count(*) FILTER (WHERE sent_at IS NOT NULL),
       count(*) FILTER (WHERE skipped_at IS NOT NULL),
       count(*) FILTER (WHERE skip_reason = 'no_line_account'),
       count(*) FILTER (WHERE skip_reason = 'voided'),
       count(*) FILTER (WHERE skip_reason = 'redeemed'),
       count(*) FILTER (WHERE skip_reason = 'expired'),
       count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL
                          AND next_attempt_at <= now()),
       count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL
                          AND next_attempt_at > now() AND claimed_by IS NULL),
       count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL
                          AND next_attempt_at > now() AND claimed_by IS NOT NULL),
       count(*) FILTER (WHERE parked_at IS NOT NULL)
  FROM o`

// Counts counts the outbox rows by state, in rows.
type Counts struct {
	Sent    int64 // delivered (sent_at set)
	Skipped int64 // closed without a push (skipped_at set), never to be pushed: the four below
	// Skipped by reason (notification_outbox.skip_reason, 00015_expiry.sql).
	SkippedNoLINEAccount int64 // the member has no LINE account linked
	SkippedVoided        int64 // the coupon was voided before its push
	SkippedRedeemed      int64 // the coupon was redeemed before its push (00032)
	SkippedExpired       int64 // the coupon expired before its push
	Due                  int64 // waiting for the next run
	Waiting              int64 // backing off after a failed push (next_attempt_at in the future)
	InFlight             int64 // claimed by a run whose lease has not ended
	Parked               int64 // dead letters (parked_at set)
}

// ReadCounts counts the rows by state in one scan of the table.
func ReadCounts(ctx context.Context, q db.Querier) (Counts, error) {
	var c Counts
	err := q.QueryRow(ctx, sqlCounts).Scan(&c.Sent, &c.Skipped, &c.SkippedNoLINEAccount, &c.SkippedVoided, &c.SkippedRedeemed, &c.SkippedExpired, &c.Due, &c.Waiting, &c.InFlight, &c.Parked)
	return c, err
}

const sqlParked = `
SELECT coupon_id::text, member_id, attempts, parked_at, COALESCE(last_error, '')
  FROM notification_outbox WHERE parked_at IS NOT NULL
 ORDER BY parked_at, coupon_id LIMIT $1`

// ParkedRow is one dead letter.
type ParkedRow struct {
	CouponID  string
	MemberID  string
	Attempts  int
	ParkedAt  time.Time
	LastError string
}

// ReadParked lists at most limit dead letters, oldest first.
func ReadParked(ctx context.Context, q db.Querier, limit int) ([]ParkedRow, error) {
	rows, err := q.Query(ctx, sqlParked, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[ParkedRow])
}

// sqlRequeue: $1 all, $2 coupon ids, $3 retry-key window, $4 force.
const sqlRequeue = `
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

// RequeueParams says what [Requeue] takes.
type RequeueParams struct {
	All       bool          // every parked and skipped row, else those in CouponIDs
	CouponIDs []string      // UUIDs
	KeyWindow time.Duration // a row first pushed longer ago is KeyExpired
	Force     bool          // reopen KeyExpired rows too, clearing first_pushed_at
}

// RequeueRow is one parked or skipped row [Requeue] looked at.
type RequeueRow struct {
	CouponID   string
	Requeued   bool // reopened
	KeyExpired bool // first pushed more than KeyWindow ago
	Linked     bool // its member has a LINE account linked
}

// Requeue reopens parked and skipped rows in one statement: a row is reopened when its member
// has a LINE account linked and its first push is inside p.KeyWindow, or p.Force says to send
// it anyway (the push will be new to LINE, so first_pushed_at is cleared). A reopened row is
// due now with a fresh attempt count; last_error is kept for history.
func Requeue(ctx context.Context, q db.Querier, p RequeueParams) ([]RequeueRow, error) {
	rows, err := q.Query(ctx, sqlRequeue, p.All, p.CouponIDs, p.KeyWindow, p.Force)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[RequeueRow])
}
