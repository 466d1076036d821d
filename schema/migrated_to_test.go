package schema_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/pressly/goose/v3"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema"
)

// migratedTo is an empty database of the test migrated up to version (an earlier release's
// schema), with the goose provider that migrates it further; the database is closed at the end.
func migratedTo(t *testing.T, version int64) (string, *sql.DB, *goose.Provider) {
	t.Helper()
	url := pgtest.EmptyURL(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, schema.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(context.Background(), version); err != nil {
		t.Fatal(err)
	}
	return url, db, p
}
