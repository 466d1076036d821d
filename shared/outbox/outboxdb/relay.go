package outboxdb

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mops/coupon-api/shared/db"
)

// Execer runs a statement that returns no rows: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// sqlNow is the database's clock.
const sqlNow = `SELECT now()`

// Now returns the database's clock. A run claims only rows due at its start by this clock, the
// one the marks set next_attempt_at with, so a row sent back with a zero wait waits for the next
// run.
func Now(ctx context.Context, q db.Querier) (time.Time, error) {
	var t time.Time
	err := q.QueryRow(ctx, sqlNow).Scan(&t)
	return t, err
}

// sqlClaim claims and leases open rows; see [Claim]. $1 limit, $2 run, $3 lease, $4 due at,
// $5 retry-key window.
//
// The LIMIT ... FOR UPDATE SKIP LOCKED sits in a MATERIALIZED CTE, which PostgreSQL evaluates
// exactly once. In a plain `WHERE coupon_id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)` the
// planner may re-run the subquery (e.g. as the inner side of a nested loop), and each re-run
// skips the rows the previous one locked, so one claim can take more than n rows. SKIP LOCKED
// makes concurrent claims take disjoint rows instead of waiting (PostgreSQL 15 docs, SELECT,
// "The Locking Clause"); a row another claim changed meanwhile is re-checked against the WHERE
// on its newest version (13.2.1 "Read Committed Isolation Level"), so a just-claimed row, whose
// next_attempt_at is now in the future, is not taken twice.
const sqlClaim = `
WITH due AS MATERIALIZED (
  SELECT coupon_id, member_id, next_attempt_at, first_pushed_at FROM notification_outbox
   WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL AND next_attempt_at <= $4
   ORDER BY next_attempt_at
   LIMIT $1
   FOR UPDATE SKIP LOCKED
)
UPDATE notification_outbox o
   SET next_attempt_at = now() + $3::interval, claimed_by = $2,
       first_pushed_at = CASE WHEN l.line_user_id IS NULL OR i.voided_at IS NOT NULL THEN o.first_pushed_at
                              ELSE COALESCE(o.first_pushed_at, now()) END
  FROM due JOIN issued_coupons i USING (coupon_id)
       LEFT JOIN member_line_accounts l ON l.member_id = due.member_id
 WHERE o.coupon_id = due.coupon_id
RETURNING o.coupon_id::text, o.member_id, o.attempts, i.campaign_id, i.amount_yen, COALESCE(l.line_user_id, ''),
          COALESCE(o.first_pushed_at < now() - $5::interval, false), due.next_attempt_at, due.first_pushed_at,
          o.trace_parent, i.voided_at IS NOT NULL, i.expires_at`

// ClaimParams says what [Claim] takes.
type ClaimParams struct {
	Run       uuid.UUID     // the claiming run, set as claimed_by
	Limit     int           // at most this many rows
	Lease     time.Duration // how long the rows stay invisible to other claims
	DueAt     time.Time     // only rows due by then (the run's start, [Now])
	KeyWindow time.Duration // a row first pushed longer ago is KeyExpired
}

// Claimed is one claimed row: what its push needs, and what [Release] restores.
type Claimed struct {
	CouponID, MemberID string
	Attempts           int // pushes sent before this claim
	CampaignID         string
	AmountYen          int
	LineUserID         string // "" when the member has no LINE account linked
	KeyExpired         bool   // first pushed more than KeyWindow ago
	PrevNextAttemptAt  time.Time
	PrevFirstPushedAt  *time.Time
	TraceParent        *string    // the issuing request's W3C traceparent
	Voided             bool       // the coupon was voided (couponctl coupon void): never pushed
	ExpiresAt          *time.Time // the coupon's expiry, nil when its campaign gives none
}

// Claim takes up to p.Limit open rows due at p.DueAt for run p.Run and leases them for p.Lease
// by moving next_attempt_at past it, in one autocommit statement: no transaction stays open
// while they are pushed. It charges no attempt (the marks do). For a member with a LINE account
// whose coupon is not voided it sets first_pushed_at if unset, before the push goes out, so a crash between push and mark
// cannot lose the start of LINE's retry-key window.
func Claim(ctx context.Context, q db.Querier, p ClaimParams) ([]Claimed, error) {
	rows, err := q.Query(ctx, sqlClaim, p.Limit, p.Run, p.Lease, p.DueAt, p.KeyWindow)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Claimed])
}

// sqlMarkSent: $1 coupon_id.
const sqlMarkSent = `
UPDATE notification_outbox
   SET sent_at = now(), parked_at = NULL, claimed_by = NULL, attempts = attempts + 1
 WHERE coupon_id = $1 AND sent_at IS NULL`

// MarkSent records a push LINE accepted (2xx, or 409 for a retry key it had accepted before)
// and charges its attempt. It does not ask for the claim: a push that happened is true whoever
// holds the row.
func MarkSent(ctx context.Context, e Execer, couponID string) error {
	_, err := e.Exec(ctx, sqlMarkSent, couponID)
	return err
}

// The marks below change a row only while run still holds its claim ($1 coupon_id, $2 run).

// sqlMarkRetry: $3 wait, $4 last_error.
const sqlMarkRetry = `
UPDATE notification_outbox
   SET next_attempt_at = now() + $3::interval, last_error = $4, claimed_by = NULL, attempts = attempts + 1
 WHERE coupon_id = $1 AND claimed_by = $2 AND sent_at IS NULL`

// MarkRetry sends a pushed row back for another attempt after wait, with lastErr, and charges
// the push's attempt.
func MarkRetry(ctx context.Context, e Execer, run uuid.UUID, couponID string, wait time.Duration, lastErr string) error {
	_, err := e.Exec(ctx, sqlMarkRetry, couponID, run, wait, lastErr)
	return err
}

// Charge is the attempts a mark counts.
type Charge int

const (
	// NotPushed charges nothing: the row's push was never written to LINE.
	NotPushed Charge = 0
	// Pushed charges one attempt: the push was written to LINE.
	Pushed Charge = 1
)

// sqlMarkParked: $3 last_error, $4 attempts charged.
const sqlMarkParked = `
UPDATE notification_outbox
   SET parked_at = now(), last_error = $3, claimed_by = NULL, attempts = attempts + $4
 WHERE coupon_id = $1 AND claimed_by = $2 AND sent_at IS NULL`

// MarkParked dead-letters the row with reason, charging c.
func MarkParked(ctx context.Context, e Execer, run uuid.UUID, couponID, reason string, c Charge) error {
	if c != NotPushed && c != Pushed {
		return fmt.Errorf("outboxdb: charge %d: want NotPushed or Pushed", c)
	}
	_, err := e.Exec(ctx, sqlMarkParked, couponID, run, reason, int(c))
	return err
}

// sqlMarkSkipped: $3 last_error.
const sqlMarkSkipped = `
UPDATE notification_outbox SET skipped_at = now(), last_error = $3, claimed_by = NULL
 WHERE coupon_id = $1 AND claimed_by = $2 AND sent_at IS NULL`

// MarkSkipped closes the row without a push (its member has no LINE account linked), with reason.
func MarkSkipped(ctx context.Context, e Execer, run uuid.UUID, couponID, reason string) error {
	_, err := e.Exec(ctx, sqlMarkSkipped, couponID, run, reason)
	return err
}

// sqlRelease: $3 next_attempt_at, $4 first_pushed_at, as before the claim.
const sqlRelease = `
UPDATE notification_outbox SET next_attempt_at = $3, first_pushed_at = $4, claimed_by = NULL
 WHERE coupon_id = $1 AND claimed_by = $2 AND sent_at IS NULL`

// Release gives back a claimed row that was not pushed: no attempt charged, next_attempt_at and
// first_pushed_at as before the claim, as if it had never been claimed.
func Release(ctx context.Context, e Execer, run uuid.UUID, c Claimed) error {
	_, err := e.Exec(ctx, sqlRelease, c.CouponID, run, c.PrevNextAttemptAt, c.PrevFirstPushedAt)
	return err
}
