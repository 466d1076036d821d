package opsverbs

import (
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
)

// Migrate is "migrate": it applies the pending schema/ migrations.
func Migrate() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply the schema/ migrations to DATABASE_URL (or Cloud SQL through the connector)",
		Long: `Apply the pending schema/ migrations (goose, embedded in the binary), each in its own
transaction. The database is DATABASE_URL, or Cloud SQL through the Go connector when
INSTANCE_CONNECTION_NAME is set (with DB_USER, DB_NAME, DB_IAM_AUTH, DB_PRIVATE_IP), as the
functions connect.

A migration that fails on a lock (SQLSTATE 55P03, its lock_timeout, or 40P01, a deadlock) is run
again after a full-jitter wait, up to 5 tries; each retry is reported on stderr with the
migration, the SQLSTATE, the wait and the try. After the last it gives up naming the sessions
that held the lock, and exits 1: the migrations before it stay applied, and migrate can be run
again once the lock is free.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, closePool, err := db.OpenFromEnv(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			sqlDB := stdlib.OpenDBFromPool(pool)
			defer sqlDB.Close()
			applied, err := schema.Migrator{Report: cmd.ErrOrStderr()}.Up(cmd.Context(), sqlDB)
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "schema is up to date")
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied migrations %v\n", applied)
			return nil
		},
	}
}
