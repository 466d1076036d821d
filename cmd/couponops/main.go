// Command couponops runs the operator verbs that production runs: migrate (cloudbuild.yaml's
// migrate step) and reconcile and outbox prune (the daily Cloud Run jobs of deploy/daily.sh),
// as the database role coupon_admin or the migrations' user. It holds those verbs and nothing
// else (deps_test.go checks its build); they are couponctl's verbs of the same names
// (internal/ops/opsverbs), and couponctl stays the tool for people.
//
// Exit codes: 0 done, 1 a finding (drift, a broken rule) or a failure, 2 a command line it does
// not understand.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/opsverbs"
	"github.com/mops/coupon-api/shared/issuance"
)

func main() {
	// Cloud Run sends SIGTERM when it stops a task (its timeout, or a cancelled execution).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is a command line couponops does not understand.
type usageError struct{ error }

// run runs the command line args and returns the exit code; an error is printed once, as
// "couponops: ...", with the verb's usage when the command line was not understood.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	var usage usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, opsverbs.ErrViolations):
		return 1
	case errors.As(err, &usage), errors.As(err, new(opsverbs.UsageError)):
		fmt.Fprintf(stderr, "couponops: %v\n\n%s", err, cmd.UsageString())
		return 2
	}
	fmt.Fprintln(stderr, "couponops:", err)
	return 1
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "couponops",
		Short: "The operator verbs coupon-api runs in production: migrate, reconcile, outbox prune",
		Long: `couponops is what the deploy build and the daily Cloud Run jobs run: migrate applies the
schema, reconcile checks every counter against the rows (exit 1 on drift), outbox prune deletes
sent and skipped outbox rows past the retention. People use couponctl, which has the same verbs
and the tools around them.

Database: DATABASE_URL (a PostgreSQL URL), or Cloud SQL through the Go connector when
INSTANCE_CONNECTION_NAME is set (with DB_USER, DB_NAME, DB_IAM_AUTH, DB_PRIVATE_IP).`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		Args:              cobra.NoArgs,
		RunE:              func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		// A verb run with MONTHLY_CAP_YEN set is refused before it starts (issuance.RefuseMonthlyCapEnv).
		PersistentPreRunE: func(*cobra.Command, []string) error { return issuance.RefuseMonthlyCapEnv() },
	}
	outbox := &cobra.Command{
		Use:   "outbox",
		Short: "The notification outbox: prune",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{errors.New("outbox needs a verb: prune")}
		},
	}
	outbox.AddCommand(opsverbs.OutboxPrune())
	root.AddCommand(opsverbs.Migrate(), opsverbs.Reconcile(), outbox)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	markUsage(root)
	return root
}

// markUsage makes the argument checks of c and its verbs refuse with a [usageError].
func markUsage(c *cobra.Command) {
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := check(cmd, a); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		markUsage(sub)
	}
}
