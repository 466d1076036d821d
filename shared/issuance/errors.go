package issuance

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATEs that say PostgreSQL rolled the transaction back and nothing was written
// (PostgreSQL 15 docs, Appendix A "PostgreSQL Error Codes").
const (
	sqlstateSerializationFailure = "40001" // serialization_failure
	sqlstateDeadlockDetected     = "40P01" // deadlock_detected
	sqlstateLockNotAvailable     = "55P03" // lock_not_available: lock_timeout expired
	sqlstateQueryCanceled        = "57014" // query_canceled: statement_timeout expired
)

// ErrInvalidRequest is returned (wrapped) by [Service.Issue] for a member or campaign id that
// breaks the formats of CONTRACT.md.
var ErrInvalidRequest = errors.New("invalid request")

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
	case sqlstateSerializationFailure, sqlstateDeadlockDetected, sqlstateLockNotAvailable:
		return true
	}
	return false
}

// isTimeout reports whether err is the budget running out: statement_timeout (57014) or the
// call's context deadline. Such an attempt wrote nothing, but there is no time left to retry it.
func isTimeout(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlstateQueryCanceled {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// rejection ends a transaction with a business result (ALREADY_ISSUED, MONTHLY_CAP, ...): it is
// returned from the transaction's closure so that pgx rolls everything back, then turned into
// the [Outcome].
type rejection struct{ out Outcome }

func (r *rejection) Error() string { return fmt.Sprintf("issuance: rejected: %s", r.out.Result) }
