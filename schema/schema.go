// Package schema holds the coupon-api tables as ordered SQL migrations embedded in the binary,
// applied with goose (github.com/pressly/goose/v3).
//
// The tables and what each serializes are described in migrations/00002_issuance.sql and in
// docs/api.md ("Tables"). The functions the migrations define, as a migrated database runs them,
// are in current/ (package [github.com/mops/coupon-api/schema/current]), one file per function;
// the issuance transaction is current/issue_coupons_batch_v3.sql, one implementation for every
// caller (00014_one_issuance.sql; since 00031_one_judge_one_clock.sql under that name, the
// previous releases' calls its wrappers).
package schema

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"

	// The pgx database/sql driver, registered as "pgx", which goose runs on.
	_ "github.com/jackc/pgx/v5/stdlib"
)

//go:embed migrations/*.sql
var embedded embed.FS

// Migrations returns the migration files, named NNNNN_name.sql, in the order goose applies them.
func Migrations() fs.FS {
	sub, err := fs.Sub(embedded, "migrations")
	if err != nil {
		panic(err) // the embed pattern above guarantees the directory
	}
	return sub
}

// MigrateURL opens databaseURL with the pgx driver, applies the pending migrations and closes it.
func MigrateURL(ctx context.Context, databaseURL string) ([]int64, error) {
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return nil, fmt.Errorf("schema: open: %w", err)
	}
	defer db.Close()
	return Migrate(ctx, db)
}

// Hash is a digest of every migration file's name and content; test harnesses key their
// migrated template databases on it.
func Hash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(Migrations(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(Migrations(), path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\n%d\n", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("schema: hash migrations: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
