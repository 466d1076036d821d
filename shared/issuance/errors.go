package issuance

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// IsRetryable reports whether err, at any depth of wrapping (fmt.Errorf %w, errors.Join), is a
// PostgreSQL error after which the whole transaction may be run again: 40001
// serialization_failure, 40P01 deadlock_detected or 55P03 lock_not_available. Any other error,
// 57014 and 23505 included, is not.
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

// rejection ends a transaction with a business result (ALREADY_ISSUED, MONTHLY_CAP, ...): it is
// returned from the transaction's closure so that pgx rolls everything back, then turned into
// the [Outcome].
type rejection struct{ out Outcome }

func (r *rejection) Error() string { return fmt.Sprintf("issuance: rejected: %s", r.out.Result) }
