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

// sqlClaim runs the claim, outbox_claim (schema/current/outbox_claim.sql): $1 limit, $2 run,
// $3 lease, $4 due at, $5 retry-key window.
const sqlClaim = `SELECT coupon_id, member_id, attempts, campaign_id, amount_yen, line_user_id, key_expired,
       prev_next_attempt_at, prev_first_pushed_at, trace_parent, expires_at, COALESCE(skip_reason, '')
  FROM outbox_claim($1, $2, $3, $4, $5)`

// The reasons the claim gives for a row it closed without a push ([Claimed.SkipReason]).
const (
	SkipNoLINEAccount = "no_line_account" // the member has no LINE account linked
	SkipVoided        = "voided"          // the coupon was voided before its push
	SkipRedeemed      = "redeemed"        // the coupon was redeemed before its push (00032)
	SkipExpired       = "expired"         // the coupon expires before the claim's lease ends
)

// ClaimParams says what [Claim] takes.
type ClaimParams struct {
	Run       uuid.UUID     // the claiming run, set as claimed_by
	Limit     int           // at most this many rows
	Lease     time.Duration // how long the rows stay invisible to other claims
	DueAt     time.Time     // only rows due by then (the run's start, [Now])
	KeyWindow time.Duration // a row first pushed longer ago is KeyExpired
}

// Claimed is one claimed row: what its push needs, and what [Release] restores; or, when
// SkipReason is set, a row the claim closed without a push.
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
	ExpiresAt          *time.Time // the coupon's expiry, nil when its campaign gives none
	// SkipReason is why the claim closed the row as skipped, never to be pushed ([SkipVoided],
	// [SkipRedeemed], [SkipExpired], [SkipNoLINEAccount], or a reason a later schema adds), "" for a row leased
	// to the run for its push.
	SkipReason string
}

// Claim takes up to p.Limit open rows due at p.DueAt for run p.Run in one autocommit statement,
// the database function outbox_claim: no transaction stays open while they are pushed. The
// database decides what may be pushed: a row whose coupon was voided, was redeemed or expires
// before the lease ends, or whose member has no LINE account, is closed as skipped with its [Claimed.SkipReason];
// every other row is leased for p.Lease (next_attempt_at moved past it) with first_pushed_at set
// if unset, before the push goes out, so a crash between push and mark cannot lose the start of
// LINE's retry-key window. It charges no attempt (the marks do).
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
