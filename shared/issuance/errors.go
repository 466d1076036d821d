package issuance

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// IsRetryable reports whether err, at any depth of wrapping (fmt.Errorf %w, errors.Join), is a
// PostgreSQL error of contention, after which the whole transaction may be run again: 40001
// serialization_failure, 40P01 deadlock_detected or 55P03 lock_not_available. Any other error,
// 57014 and 23505 included, is not (what the issuance sends again: [Service.run]).
func IsRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case pgerrcode.SerializationFailure, pgerrcode.DeadlockDetected, pgerrcode.LockNotAvailable:
		return true
	}
	return false
}

// isTimeout reports whether err is the budget running out: statement_timeout (57014) or the
// call's context deadline. Such an attempt wrote nothing, but there is no time left to retry it.
func isTimeout(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.QueryCanceled {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// ErrOutcomeUnknown is returned when an attempt's call was sent but its answer was lost (the
// connection failed or the deadline cut it while the call ran or committed) and the look-up
// that settles it could not be made either: the coupon may or may not exist. The caller answers
// 500, never RETRY_EXHAUSTED ("nothing was written"); a re-send is safe and answers
// ALREADY_ISSUED if the coupon exists (docs/api.md, "IssueCoupon").
var ErrOutcomeUnknown = errors.New("issuance: the call's answer was lost and the coupon could not be looked up")

// connLostError is an attempt whose connection failed before its call was sent, or whose lost
// answer was settled as nothing written: the attempt may be run again on a fresh connection.
type connLostError struct{ err error }

func (e *connLostError) Error() string { return fmt.Sprintf("issuance: connection lost: %v", e.err) }
func (e *connLostError) Unwrap() error { return e.err }

// isStalePlan reports whether err is 0A000 "cached plan must not change result type": a migration
// changed issue_coupons_batch_v3's result columns under a call prepared on a pooled connection. pgx drops
// the statement from its cache on any error, so one more attempt prepares it afresh.
func isStalePlan(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.FeatureNotSupported
}

// answerLostError is an attempt whose call was sent but whose answer never came: the call may
// have committed. The session says which server session to end before the look-up.
type answerLostError struct {
	err     error
	session session
}

func (e *answerLostError) Error() string {
	return fmt.Sprintf("issuance: call sent, answer lost: %v", e.err)
}
func (e *answerLostError) Unwrap() error { return e.err }

// isConnLost reports whether err, met on a connection before the call was sent, means the
// connection rather than the request failed: pgx closed the connection (a network error or a deadline
// cut it), nothing reached the server (pgconn.SafeToRetry: a failed dial, a refused
// connection), or the server ended the session (a FATAL error such as 57P01
// admin_shutdown during a restart or failover, or class 08 connection_exception).
func isConnLost(err error, closed bool) bool {
	if closed || pgconn.SafeToRetry(err) {
		return true
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.SeverityUnlocalized == "FATAL" || pgErr.SeverityUnlocalized == "PANIC" ||
			pgerrcode.IsConnectionException(pgErr.Code) ||
			(pgerrcode.IsOperatorIntervention(pgErr.Code) && pgErr.Code != pgerrcode.QueryCanceled)
	}
	return false
}
