package opsverbs

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
)

// ErrViolations is returned by a verb that has printed which rules broke or which counters
// drifted: the command exits 1 without printing it again.
var ErrViolations = errors.New("rules broken")

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
