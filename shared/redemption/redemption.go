// Package redemption is RedeemCoupon's work: validate, redeem or roll back one coupon for a cart's
// or a POS's order, each one call of a database function that judges and writes in one statement
// (schema/current/coupon_validate.sql, coupon_redeem.sql, coupon_redemption_rollback.sql; their
// one judge, redemption_judge). The database decides everything (the coupon's member, its void,
// its expiry by the database's clock, which order holds it); this package sends the call under
// the issuance's budget and retry policy and reads the answer. docs/design.md, "Redemption".
package redemption

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/shared/backoff"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/ids"
	"github.com/mops/coupon-api/shared/issuance"
)

// Action is one of RedeemCoupon's three operations (docs/api.md, "RedeemCoupon").
type Action string

const (
	// Validate answers whether the coupon could be redeemed now: no lock, nothing written.
	Validate Action = "validate"
	// Redeem redeems the coupon for the order, exactly once.
	Redeem Action = "redeem"
	// Rollback undoes the order's redemption, for a reason.
	Rollback Action = "rollback"
)

// Result is the answer's result code (docs/api.md, "RedeemCoupon").
type Result string

// The results the database answers, and the service's own.
const (
	ResultValid           Result = "VALID"
	ResultRedeemed        Result = "REDEEMED"
	ResultRolledBack      Result = "ROLLED_BACK"
	ResultAlreadyRedeemed Result = "ALREADY_REDEEMED"
	ResultNotRedeemed     Result = "NOT_REDEEMED"
	ResultCouponExpired   Result = "COUPON_EXPIRED"
	ResultCouponVoided    Result = "COUPON_VOIDED"
	ResultUnknownCoupon   Result = "UNKNOWN_COUPON"
	// ResultRetryExhausted: no answer within the budget (contention, or the database did not
	// answer in time); the same request is safe to send again, as every operation answers the
	// same to the same order.
	ResultRetryExhausted Result = "RETRY_EXHAUSTED"
)

// MaxReasonChars bounds a rollback's reason, in characters (docs/api.md; the database's
// coupon_redemptions.reason_of_rollback).
const MaxReasonChars = 1000

// Request is one operation on one coupon.
type Request struct {
	Action   Action
	CouponID string // as IssueCoupon answered it ([ids.Coupon])
	MemberID string // the member the coupon was issued to ([ids.Member])
	OrderID  string // the cart's or the POS's order ([ids.Order])
	Reason   string // a rollback's, 1-[MaxReasonChars] characters, not blank; no other action takes one
}

// Check returns an error naming the first field of r out of format, in this order: an unknown
// action; the coupon, member and order ids (a wrapped [ids.ErrInvalid]); a reason where none
// belongs, or a rollback's missing, blank, too long or holding a control character. The same formats as the database's
// (redemption_args_check).
func (r Request) Check() error {
	switch r.Action {
	case Validate, Redeem, Rollback:
	default:
		return fmt.Errorf("action %q: want validate, redeem or rollback", r.Action)
	}
	if _, err := ids.Coupon(r.CouponID); err != nil {
		return err
	}
	if err := ids.Member(r.MemberID); err != nil {
		return err
	}
	if err := ids.Order(r.OrderID); err != nil {
		return err
	}
	return checkReason(r.Action, r.Reason)
}

// Outcome is the database's answer. The fields beside Result are set as docs/api.md's table says
// for that result, and never for UNKNOWN_COUPON (nothing about another member's coupon leaks).
type Outcome struct {
	Result     Result
	AmountYen  int        // the coupon's amount, in yen
	ExpiresAt  *time.Time // the coupon's expiry; nil when its campaign gives none
	RedeemedAt *time.Time // when the order's redemption was made (REDEEMED)
	Usable     bool       // ROLLED_BACK: a new order may redeem the coupon now (false once expired)
	Attempts   int        // calls sent, retries included
}

// Service runs the operations on a pool of connections in role coupon_redeem. It is safe for
// concurrent use.
type Service struct {
	pool *pgxpool.Pool
	cfg  issuance.Config
}

// New returns a Service on pool with cfg's budget and timeouts ([issuance.Config]: ISSUE_BUDGET,
// ISSUE_LOCK_TIMEOUT, ISSUE_STATEMENT_TIMEOUT; its BatchMax is not used: a redemption is never
// coalesced), zero fields defaulted. It refuses a cfg that [issuance.Config.Validate] rejects.
func New(pool *pgxpool.Pool, cfg issuance.Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Service{pool: pool, cfg: cfg}, nil
}

// The calls: $1 coupon id, $2 member id, $3 order id, and for a rollback $4 the reason.
const (
	sqlValidate = `SELECT result, amount_yen, expires_at, redeemed_at, usable FROM coupon_validate($1, $2, $3)`
	sqlRedeem   = `SELECT result, amount_yen, expires_at, redeemed_at, usable FROM coupon_redeem($1, $2, $3)`
	sqlRollback = `SELECT result, NULL::integer, expires_at, NULL::timestamptz, usable FROM coupon_redemption_rollback($1, $2, $3, $4)`
)

// minAttemptTime is the least time left for which a call is still sent: a round trip and a
// queue on one coupon's row.
const minAttemptTime = 20 * time.Millisecond

// Do runs r as one database call, sent again as the issuance's retry policy says (stated once, at
// issuance's Service.run) with one difference: every operation answers the same to the same
// order, so a call whose answer was lost is simply sent again. Contention (40001, 40P01, 55P03)
// is retried after a full-jitter wait at most [issuance.MaxAttempts] times; a lost connection or
// 57014 as time allows; after that, or when the budget ([issuance.Config.Budget], from the call's
// start, or ctx's deadline if sooner) leaves no attempt, it answers RETRY_EXHAUSTED. Errors: r
// out of format ([Request.Check]), the caller gone (ctx's error), and any other database error,
// never retried.
func (s *Service) Do(ctx context.Context, r Request) (Outcome, error) {
	if err := r.Check(); err != nil {
		return Outcome{}, err
	}
	end := s.attemptsEnd(ctx)
	contended := 0
	for n := 1; ; n++ {
		left := time.Until(end)
		if left < minAttemptTime+issuance.ServerMargin {
			return Outcome{Result: ResultRetryExhausted, Attempts: n - 1}, nil
		}
		out, lost, err := s.call(ctx, r, left)
		out.Attempts = n
		switch {
		case err == nil:
			return out, nil
		case ctx.Err() != nil:
			return out, fmt.Errorf("redemption: %s: %w", r.Action, ctx.Err())
		case issuance.IsRetryable(err):
			if contended++; contended == issuance.MaxAttempts {
				return Outcome{Result: ResultRetryExhausted, Attempts: n}, nil
			}
		case !lost && !isStatementTimeout(err):
			return out, fmt.Errorf("redemption: %s, attempt %d: %w", r.Action, n, err)
		}
		if waited, err := pause(ctx, end, n); err != nil {
			return out, fmt.Errorf("redemption: %s: %w", r.Action, err)
		} else if !waited {
			return Outcome{Result: ResultRetryExhausted, Attempts: n}, nil
		}
	}
}

// attemptsEnd is when a call's attempts must end: its budget from now, less the time a
// cancelled statement may take to stop ([db.CancelGrace]), or ctx's deadline if sooner.
func (s *Service) attemptsEnd(ctx context.Context) time.Time {
	end := time.Now().Add(s.cfg.Budget - db.CancelGrace)
	if d, ok := ctx.Deadline(); ok && d.Before(end) {
		end = d
	}
	return end
}

// pause waits the full-jitter wait after failed attempt n, and reports false, without waiting,
// when no attempt would fit before end after it. Errors: ctx's, when it ends first.
func pause(ctx context.Context, end time.Time, n int) (bool, error) {
	wait := backoff.FullJitter(issuance.BackoffBase, issuance.BackoffCap, n)
	if time.Until(end) < wait+minAttemptTime+issuance.ServerMargin {
		return false, nil
	}
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-time.After(wait):
		return true, nil
	}
}

// call sends r as one pipelined call on a connection of its own, its timeouts derived from the
// time left, by a deadline [issuance.ServerMargin] after the statement's, so that the server ends
// a late call first. lost says the connection was closed under the call (a network failure, the
// deadline, a FATAL error): whatever the call did, sending it again answers the same.
func (s *Service) call(ctx context.Context, r Request, left time.Duration) (out Outcome, lost bool, err error) {
	b := &pgx.Batch{}
	statement := s.cfg.QueueTimeouts(b, left)
	ctx, cancel := context.WithTimeout(ctx, statement+issuance.ServerMargin)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return out, true, err
	}
	defer conn.Release()
	query, args := sqlValidate, []any{r.CouponID, r.MemberID, r.OrderID}
	switch r.Action {
	case Redeem:
		query = sqlRedeem
	case Rollback:
		query, args = sqlRollback, append(args, r.Reason)
	}
	var result string
	var amount *int
	var usable *bool
	b.Queue(query, args...).QueryRow(func(row pgx.Row) error {
		return row.Scan(&result, &amount, &out.ExpiresAt, &out.RedeemedAt, &usable)
	})
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return out, conn.Conn().IsClosed(), err
	}
	out.Result = Result(result)
	if amount != nil {
		out.AmountYen = *amount
	}
	if usable != nil {
		out.Usable = *usable
	}
	return out, false, nil
}

// isStatementTimeout reports whether err is 57014 query_canceled: the call ran past its
// statement_timeout and was rolled back.
func isStatementTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.QueryCanceled
}

// checkReason refuses a reason that action does not take, or a rollback's reason that is blank,
// longer than [MaxReasonChars] characters, or holds a control character (PostgreSQL's text takes
// no NUL, and a line break or an escape would garble `couponctl coupon show`).
func checkReason(action Action, reason string) error {
	n := utf8.RuneCountInString(reason)
	switch {
	case action != Rollback && reason != "":
		return errors.New("reason: only a rollback takes one")
	case action == Rollback && (strings.TrimSpace(reason) == "" || n > MaxReasonChars || !utf8.ValidString(reason)):
		return fmt.Errorf("reason: a rollback needs one of 1-%d characters, not blank (got %d)", MaxReasonChars, n)
	case strings.IndexFunc(reason, unicode.IsControl) >= 0:
		return errors.New("reason: no control characters (a line break, a tab, an escape): one line of text")
	}
	return nil
}
