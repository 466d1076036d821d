package opsverbs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
)

// ErrViolations is returned by a verb that has printed which rules broke or which counters
// drifted: the command exits 1 without printing it again.
var ErrViolations = errors.New("rules broken")

// UsageError is a flag value a verb refuses: the command line's fault, which the command answers
// with the verb's usage and exit 2.
type UsageError struct{ Err error }

func (u UsageError) Error() string { return u.Err.Error() }
func (u UsageError) Unwrap() error { return u.Err }

func flagError(format string, args ...any) error { return UsageError{fmt.Errorf(format, args...)} }

// OpenMigrated opens the pool as the functions do (shared/db: DATABASE_URL or the Cloud SQL
// connector) and checks, as they do at start-up, that the database is reachable and migrated
// ([schema.Check]): a verb on an unmigrated database says to run migrate instead of failing on
// a missing table. The caller closes the pool with the returned function.
func OpenMigrated(ctx context.Context) (*pgxpool.Pool, func(), error) {
	pool, closePool, err := db.OpenFromEnv(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := schema.Check(ctx, pool); err != nil {
		closePool()
		return nil, nil, err
	}
	return pool, closePool, nil
}
