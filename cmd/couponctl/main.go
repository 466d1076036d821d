// Command couponctl is the local and operator tool of coupon-api: the Silver Week demo, schema
// migrations, campaigns, serving a function as deployed, and reconciliation. Run
// `couponctl --help` for the verbs.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/opsverbs"
	"github.com/mops/coupon-api/internal/testkit/localpg"
	"github.com/mops/coupon-api/shared/issuance"
)

// errViolations makes couponctl exit 1 after it has printed which rules broke; the operator
// verbs of internal/ops/opsverbs return the same.
var errViolations = opsverbs.ErrViolations

func main() {
	ctx, stop := interruptible(context.Background())
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// interrupted is the cause of the context [interruptible] cancels on a signal.
type interrupted struct{ sig os.Signal }

func (i interrupted) Error() string { return "interrupted by " + i.sig.String() }

// exitCode is what a shell expects of a process that a signal ended: 128 + the signal's
// number (130 for SIGINT, Ctrl-C; 143 for SIGTERM).
func (i interrupted) exitCode() int {
	if s, ok := i.sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 130
}

// interruptible returns a context cancelled, with an [interrupted] cause, on the first SIGINT
// (Ctrl-C) or SIGTERM. Later signals are caught too, and ignored, so that the verb can still
// clean up (stop its throwaway server, remove its temporary files) after a second Ctrl-C; stop
// ends the catching.
func interruptible(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			cancel(interrupted{s})
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}

// usageError is a command line couponctl does not understand: an unknown verb, flag or
// argument. It is printed with the usage of the verb it was given to.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// fileError is an input file couponctl refuses (a line that is not an id, a missing file):
// exit 2 as a [usageError], printed without the usage, the file and the line in its text.
type fileError struct{ err error }

func (f fileError) Error() string { return f.err.Error() }
func (f fileError) Unwrap() error { return f.err }

// flagError is a flag value or argument couponctl refuses: a [usageError].
func flagError(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Exit codes besides 0 and 1 (a failure, or a finding: a rule broken, drift).
const (
	exitUsage = 2 // a command line couponctl does not understand, a flag value or a file it refuses
)

// run runs the command line args and returns the process's exit code. An error is printed once
// on stderr, as "couponctl: ...", its times at +09:00 ([refusalTimes]): with the verb's usage when the command line was not understood
// (exit 2); as "couponctl: interrupted" when a signal ended the verb (exit 130 for Ctrl-C, 143
// for SIGTERM), whatever the phase it interrupted failed with (a cancelled request, SQLSTATE
// 57014 from a cancelled query): the verbs clean up before they return.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	var sig interrupted
	var usage usageError
	switch {
	case errors.As(context.Cause(ctx), &sig):
		if err == nil {
			return 0 // the verb finished its work, or stopped as asked (serve drains and exits 0)
		}
		fmt.Fprintln(stderr, "couponctl: interrupted")
		return sig.exitCode()
	case err == nil:
		return 0
	case errors.As(err, &usage), errors.As(err, new(opsverbs.UsageError)):
		fmt.Fprintf(stderr, "couponctl: %s\n\n%s", refusalTimes(err.Error()), cmd.UsageString())
		return exitUsage
	case errors.As(err, new(fileError)):
		fmt.Fprintf(stderr, "couponctl: %s\n", err)
		return exitUsage
	case errors.Is(err, errViolations):
		return 1
	}
	fmt.Fprintln(stderr, "couponctl:", refusalTimes(err.Error()))
	return 1
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "couponctl",
		Short: "Local and operator tool of coupon-api (IssueCoupon and RelayOutbox on PostgreSQL)",
		Long: `couponctl runs the coupon-api Silver Week demo, migrates the schema, manages campaigns,
serves a function as deployed, reconciles counters with rows, shows and requeues the
notification outbox, runs the isolation lab, drills faults under load and audits what
IssueCoupon answered against what it wrote.

Database: every verb connects as the functions do: DATABASE_URL (a PostgreSQL URL), or Cloud
SQL through the Go connector when INSTANCE_CONNECTION_NAME is set (with DB_USER, DB_NAME,
DB_IAM_AUTH, DB_PRIVATE_IP). "demo", "sim" and "drill" use DATABASE_URL, or start a throwaway
local PostgreSQL when it is unset.`,
		// Errors and usage are printed by run, once: a verb's failure without the usage, a
		// command line couponctl does not understand with it.
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		// SuggestionsFor below reads it as is; cobra sets its default of 2 only on its own path.
		SuggestionsMinimumDistance: 2,
		// Without arguments couponctl prints its help; with one that names no verb, Args
		// refuses it (cobra's own check of a root's arguments says nothing of the usage).
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
			}
			return errors.New(msg)
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		// A verb run with MONTHLY_CAP_YEN set is refused before it starts: the cap is the
		// database's now, and whoever set the variable expects it to count.
		PersistentPreRunE: func(*cobra.Command, []string) error { return issuance.RefuseMonthlyCapEnv() },
	}
	root.AddCommand(demoCmd(), opsverbs.Migrate(), campaignCmd(), serveCmd(), opsverbs.Reconcile(), simCmd(), benchCmd(), latencyProxyCmd(), loadCmd(), auditCmd(), drillCmd(),
		outboxCmd(), lineCmd(), legacyCmd(), couponCmd(), grantCmd(), rulesCmd(), schemaCmd(),
		consoleCmd(consoleGrantCmd(), consoleRolesCmd()))
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	wrapVerbs(root)
	return root
}

// wrapVerbs makes every verb under c (and c) say the same way what it cannot do: its argument
// checks' and required flags' refusals become [usageError]s, and its failures to log in to the database are
// explained by what the server refused ([explainLogin]), whichever path connected (the pool's
// start-up check, goose, a verb's own connection).
func wrapVerbs(c *cobra.Command) {
	args := c.Args
	if args == nil {
		args = cobra.ArbitraryArgs
	}
	c.Args = func(cmd *cobra.Command, a []string) error {
		if err := args(cmd, a); err != nil {
			return usageError{err}
		}
		// Cobra checks the required flags right after the arguments, with an error of no type
		// of its own: checked here first, a missing one is a usage error too.
		if err := cmd.ValidateRequiredFlags(); err != nil {
			return usageError{err}
		}
		return nil
	}
	if runE := c.RunE; runE != nil {
		c.RunE = func(cmd *cobra.Command, a []string) error { return explainLogin(runE(cmd, a)) }
	}
	for _, sub := range c.Commands() {
		wrapVerbs(sub)
	}
}

// groupCmd is a verb made of sub-verbs, such as "campaign create". Alone or with an unknown
// sub-verb it is a command line couponctl does not understand: exit 2 with its usage, which
// lists the sub-verbs, so that a typo never exits 0.
func groupCmd(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return flagError("%s needs a verb", cmd.CommandPath())
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
	srv, err := startThrowaway(ctx, cmd)
	if err != nil {
		return "", nil, err
	}
	return srv.URL(), func() { _ = srv.Stop() }, nil
}

// startThrowaway starts a throwaway local PostgreSQL (durable settings), saying so on stderr.
func startThrowaway(ctx context.Context, cmd *cobra.Command) (*localpg.Server, error) {
	fmt.Fprintln(cmd.ErrOrStderr(), "DATABASE_URL not set: starting a throwaway PostgreSQL...")
	srv, err := localpg.Start(ctx, localpg.Options{Durable: true})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "throwaway server on 127.0.0.1:%d (removed on exit): %s, binaries in %s\n",
		srv.Port(), srv.Version(), srv.BinDir())
	return srv, nil
}

// openMigrated opens the pool as every verb does and checks that the database is migrated
// ([opsverbs.OpenMigrated]).
var openMigrated = opsverbs.OpenMigrated
