package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/mail"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/console"
	"github.com/mops/coupon-api/internal/ops/opsverbs"
	"github.com/mops/coupon-api/shared/lifecycle"
)

// defaultConsoleListen is where `couponctl console` serves unless --listen says otherwise.
const defaultConsoleListen = "127.0.0.1:8090"

// consoleOptions are the flags of `couponctl console`.
type consoleOptions struct {
	listen, jwks, audience, operator string
}

// consoleCmd serves the console; its sub-verbs manage who may do what (console_roles.go).
func consoleCmd(subs ...*cobra.Command) *cobra.Command {
	var o consoleOptions
	c := &cobra.Command{
		Use:   "console [--listen HOST:PORT] (--iap-jwks FILE --iap-audience AUD | --operator EMAIL)",
		Short: "Serve the promotion team's web console (the coupon-console service) on this machine",
		Long: `Serve the console the coupon-console service serves (console/, docs/console.md): the
campaign list, each campaign's burn-down, pause, resume, end, budget changes, change requests
and history, and coupons with their void, in Japanese, on DATABASE_URL (or the Cloud SQL
connector, as every verb).

Who is asking is verified on every request:
  --iap-jwks FILE --iap-audience AUD  verify each request's X-Goog-IAP-JWT-Assertion (ES256,
                                      the audience, not expired, issuer
                                      https://cloud.google.com/iap) against the JWK set in FILE,
                                      as the deployed service verifies Google's; the person is
                                      the assertion's email. A request without a valid one: 401.
  --operator EMAIL                    no proxy: every request is EMAIL's. Loopback only.

What each person may do is their console role in the database (couponctl console grant):
a viewer reads; an operator also pauses, resumes, ends, changes budgets and voids; an
approver also approves. Ctrl-C stops it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return serveConsole(cmd, o) },
	}
	f := c.Flags()
	f.StringVar(&o.listen, "listen", defaultConsoleListen, "HOST:PORT to serve on")
	f.StringVar(&o.jwks, "iap-jwks", "", "a JWK set file (JSON) to verify IAP assertions with")
	f.StringVar(&o.audience, "iap-audience", "", "the audience the IAP assertions must name")
	f.StringVar(&o.operator, "operator", "", "serve as this one person, without IAP (loopback only)")
	c.AddCommand(subs...)
	return c
}

// identity checks the flags and returns whom the console serves.
func (o consoleOptions) identity() (console.Identifier, error) {
	host, _, err := net.SplitHostPort(o.listen)
	if err != nil {
		return nil, flagError("--listen %q: give HOST:PORT, such as %s", o.listen, defaultConsoleListen)
	}
	switch {
	case o.operator != "" && (o.jwks != "" || o.audience != ""):
		return nil, flagError("give --operator, or --iap-jwks with --iap-audience, not both")
	case o.operator != "":
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, flagError("--operator serves without verifying anyone: --listen must be a loopback address (127.0.0.1:8090), not %q", o.listen)
		}
		email, err := operatorEmail(o.operator)
		if err != nil {
			return nil, err
		}
		return console.Operator(email), nil
	case o.jwks == "" || o.audience == "":
		return nil, flagError("give --iap-jwks FILE and --iap-audience AUD (verify IAP assertions), or --operator EMAIL (loopback only)")
	}
	return console.NewIAPFromFile(o.jwks, o.audience)
}

// operatorEmail is --operator's email, lower-cased as the console records it; a malformed one
// (not a bare address such as ops@example.com) is a usage error, before the database is opened.
// The database's operator_email checks it again, and more strictly, on each change.
func operatorEmail(s string) (string, error) {
	a, err := mail.ParseAddress(s)
	if err != nil || a.Name != "" || a.Address != s || !strings.Contains(a.Address[strings.LastIndex(a.Address, "@"):], ".") {
		return "", flagError("--operator %q: want an email address such as ops@example.com", s)
	}
	return strings.ToLower(s), nil
}

func serveConsole(cmd *cobra.Command, o consoleOptions) error {
	id, err := o.identity()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	pool, closePool, err := opsverbs.OpenMigrated(ctx)
	if err != nil {
		return err
	}
	defer closePool()
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
	h, err := console.New(console.Config{Pool: pool, Identity: id, Plaintext: true, Log: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	who := "each request's IAP assertion, verified with " + o.jwks
	if op, ok := id.(console.Operator); ok {
		who = string(op) + " (--operator)"
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "couponctl console: http://%s/ as %s (Ctrl-C stops)\n", ln.Addr(), who)
	return serveUntilDone(ctx, ln, h, cmd.ErrOrStderr())
}

// serveUntilDone serves h on ln until ctx ends, then gives the requests in flight
// lifecycle.DrainTimeout to finish.
func serveUntilDone(ctx context.Context, ln net.Listener, h http.Handler, stderr io.Writer) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: lifecycle.HeaderTimeout, IdleTimeout: lifecycle.IdleTimeout}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), lifecycle.DrainTimeout)
	defer cancel()
	err := srv.Shutdown(shut)
	if errors.Is(<-served, http.ErrServerClosed) && err == nil {
		fmt.Fprintln(stderr, "couponctl console: stopped")
	}
	return err
}

// demoOperator is who `couponctl demo --console` serves the console as: an approver.
const demoOperator = "demo-operator@example.com"

// serveDemoConsole serves the console on pool, the demo's database, on loopback as
// demoOperator (made an approver), until ctx ends: at defaultConsoleListen, or another free
// port of loopback when that one is taken.
func serveDemoConsole(ctx context.Context, stderr io.Writer, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `SELECT count(*) FROM console_role_set($1, 'approver', 'couponctl demo --console')`, demoOperator); err != nil {
		return fmt.Errorf("console: make %s an approver: %w", demoOperator, err)
	}
	h, err := console.New(console.Config{Pool: pool, Identity: console.Operator(demoOperator), Plaintext: true,
		Log: slog.New(slog.NewTextHandler(stderr, nil))})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", defaultConsoleListen)
	if err != nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "\nconsole: http://%s/ as %s, on the demo's data (Ctrl-C stops it and ends the demo)\n", ln.Addr(), demoOperator)
	return serveUntilDone(ctx, ln, h, stderr)
}
