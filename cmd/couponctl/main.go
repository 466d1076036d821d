// Command couponctl is the local and operator tool of coupon-api: the Silver Week demo, schema
// migrations, campaigns, serving a function as deployed, and reconciliation. Run
// `couponctl --help` for the verbs.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/localpg"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
)

// errViolations makes couponctl exit 1 after it has printed which rules broke.
var errViolations = errors.New("rules broken")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := rootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		if !errors.Is(err, errViolations) {
			fmt.Fprintln(os.Stderr, "couponctl:", err)
		}
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "couponctl",
		Short: "Local and operator tool of coupon-api (IssueCoupon and RelayOutbox on PostgreSQL)",
		Long: `couponctl runs the coupon-api Silver Week demo, migrates the schema, manages campaigns,
serves a function as deployed, reconciles counters with rows, shows and requeues the
notification outbox, and runs the isolation lab.

Database: every verb connects as the functions do: DATABASE_URL (a PostgreSQL URL), or Cloud
SQL through the Go connector when INSTANCE_CONNECTION_NAME is set (with DB_USER, DB_NAME,
DB_IAM_AUTH, DB_PRIVATE_IP). "demo" and "sim" use DATABASE_URL, or start a throwaway local
PostgreSQL when it is unset.`,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		SilenceErrors:     true,
	}
	root.AddCommand(demoCmd(), migrateCmd(), campaignCmd(), serveCmd(), reconcileCmd(), simCmd(), benchCmd(), loadCmd(), outboxCmd(), lineCmd(), legacyCmd())
	return root
}

// groupCmd is a verb made of sub-verbs, such as "campaign create". Alone or with an unknown
// sub-verb it prints its help and fails, so that a typo never exits 0.
func groupCmd(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_ = cmd.Help()
			return fmt.Errorf("%s needs a verb (see above)", cmd.CommandPath())
		},
	}
	c.AddCommand(subs...)
	return c
}

// databaseOrThrowaway returns DATABASE_URL, or starts a throwaway local PostgreSQL (durable
// settings, so latencies mean something) and returns its URL with a function that removes it.
func databaseOrThrowaway(ctx context.Context, cmd *cobra.Command) (string, func(), error) {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), "using DATABASE_URL")
		return u, func() {}, nil
	}
	fmt.Fprintln(cmd.ErrOrStderr(), "DATABASE_URL not set: starting a throwaway PostgreSQL...")
	srv, err := localpg.Start(ctx, localpg.Options{Durable: true})
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "throwaway server on 127.0.0.1:%d (removed on exit): %s, binaries in %s\n",
		srv.Port(), srv.Version(), srv.BinDir())
	return srv.URL(), func() { _ = srv.Stop() }, nil
}

// openMigrated opens the pool as every verb does (shared/db: DATABASE_URL or the Cloud SQL
// connector) and checks, as the functions do at start-up, that the database is reachable and
// migrated ([schema.Check]): an operator verb on an unmigrated database says to run
// `couponctl migrate` instead of failing on a missing table. The caller closes the pool.
func openMigrated(ctx context.Context) (*pgxpool.Pool, func(), error) {
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
