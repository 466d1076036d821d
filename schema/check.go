package schema

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"
)

// CheckTimeout bounds the start-up check, in seconds: a Cloud SQL dial with a fresh certificate
// takes about a second; a database that does not answer in this time is not there.
const CheckTimeout = 10 * time.Second

// Newest returns the version of the newest migration embedded in this binary: the schema
// version the code expects.
func Newest() (int64, error) {
	names, err := fs.Glob(Migrations(), "*.sql")
	if err != nil {
		return 0, fmt.Errorf("schema: list migrations: %w", err)
	}
	var newest int64
	for _, name := range names {
		v, err := goose.NumericComponent(name)
		if err != nil {
			return 0, fmt.Errorf("schema: migration %s: %w", name, err)
		}
		newest = max(newest, v)
	}
	if newest == 0 {
		return 0, errors.New("schema: no embedded migrations")
	}
	return newest, nil
}

// Check is the start-up check of the deployable mains and `couponctl serve`: the database is
// reachable with the configured credentials and migrated at least to [Newest]. Its errors say
// what is wrong and how to fix it, naming `couponctl migrate` when that is the fix. A database
// ahead of the binary passes: migrations are additive, and an older revision keeps serving
// while a newer one rolls out.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, CheckTimeout)
	defer cancel()
	cc := pool.Config().ConnConfig
	if err := pool.Ping(ctx); err != nil {
		return explainConnect(err, cc)
	}
	want, err := Newest()
	if err != nil {
		return err
	}
	// Read goose's version table without goose: its provider would create the table when
	// missing, and a start-up check writes nothing (the runtime roles may not create tables).
	var table *string
	var have int64
	err = pool.QueryRow(ctx, `SELECT to_regclass('goose_db_version')::text`).Scan(&table)
	if err == nil && table != nil {
		err = pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`).Scan(&have)
	}
	switch {
	case err != nil:
		return fmt.Errorf("schema: read the schema version of database %q: %w", cc.Database, err)
	case table == nil:
		return fmt.Errorf("database %q has no coupon-api schema (no goose_db_version table): "+
			"run `couponctl migrate` with DATABASE_URL pointing at it", cc.Database)
	case have < want:
		return fmt.Errorf("database %q is at schema version %d, this binary needs %d: "+
			"run `couponctl migrate` with DATABASE_URL pointing at it", cc.Database, have, want)
	}
	return nil
}

// loginHint is what a refused login of a deployed function usually needs: the runtime user of
// the deploy scripts, its IAM grant and its group role.
const loginHint = "with DB_IAM_AUTH=true, DB_USER is the service account's email without \".gserviceaccount.com\", " +
	"an IAM user of the instance granted roles/cloudsql.instanceUser and a coupon_* group role (docs/roles.md, docs/deploy.md)"

// explainConnect turns a failed first connection into what an operator can act on.
func explainConnect(err error, cc *pgx.ConnConfig) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgerrcode.IsInvalidAuthorizationSpecification(pgErr.Code):
			return fmt.Errorf("database refused to log in user %q: %s: %w", cc.User, loginHint, err)
		case pgErr.Code == pgerrcode.InvalidCatalogName:
			return fmt.Errorf("database %q does not exist (DB_NAME, or DATABASE_URL): create it, "+
				"then run `couponctl migrate`: %w", cc.Database, err)
		}
		return fmt.Errorf("database refused the connection: %w", err)
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("database unreachable: is it running, and are DATABASE_URL or "+
			"INSTANCE_CONNECTION_NAME right? %w", err)
	}
	return fmt.Errorf("database unreachable: %w", err)
}
