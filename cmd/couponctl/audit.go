package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/lab/answerlog"
	"github.com/mops/coupon-api/internal/lab/audit"
)

func auditCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "audit FILE",
		Short: "Check an answer log (load --record, drill --record) against the tables: what IssueCoupon answered must agree with what it wrote",
		Long: `Read FILE, an answer log written by "couponctl load --record" or "couponctl drill", and check
every answer against the tables of the database the service used (DATABASE_URL, or Cloud SQL
through the connector, as every verb). Run it after the traffic has stopped.

A violation is:
  - an answer outside the contract of docs/api.md for a well-formed request;
  - an answer later than 3 s (the app gateway's timeout), a transport error after it included;
  - an ISSUED or ALREADY_ISSUED whose coupon_id is not in issued_coupons, is voided, or belongs
    to another (campaign, member); two ISSUED answers naming the same coupon;
  - a refusal the final tables prove wrong whenever it was answered: UNKNOWN_CAMPAIGN for a
    campaign created before the request; BUDGET_EXCEEDED while a budget stripe still has room;
    MONTHLY_CAP while the member's month still has room for the coupon; CAMPAIGN_NOT_ACTIVE
    inside the campaign's period (counters only grow, so a refusal they contradict now was
    wrong then; one they do not contradict may still have been wrong, which no table can say);
  - a live coupon of one of the log's (campaign, member) pairs that no answer said ISSUED for,
    while every answer of the pair was determinate, unless it predates the log: issued_at (the
    database's clock) more than 1 s (the clock skew allowed) before the log's first request, or
    within that second of it and named by an ALREADY_ISSUED answer of its pair (a load re-run
    with an earlier run's seed). The log must hold every request for its pairs while it ran, as
    load's and drill's do: their member ids are their run's own;
  - a broken rule: R1 budget, R2 one per member, R3 monthly cap, counters, one outbox row per
    coupon (as couponctl reconcile).

Indeterminate answers (a transport error, a 5xx other than 503 RETRY_EXHAUSTED) are not
judged: the table counts them by whether their pair holds a coupon now.

R3's refusals are judged at the database's cap (coupon_rules, "couponctl rules show"). A log
without a single answer is refused: nothing to audit, exit 1. Prints the answers by code with latency, the
indeterminate ones, each check, the invariant report and the lines of every failure (at most
100 per check); exits 1 on any violation.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			answers, err := answerlog.ReadFile(args[0])
			if err != nil {
				return err
			}
			if len(answers) == 0 {
				return fmt.Errorf("%s holds no answers: nothing to audit (did the load or drill that wrote it send any request?)", args[0])
			}
			ctx := cmd.Context()
			pool, closePool, err := openMigrated(ctx)
			if err != nil {
				return err
			}
			defer closePool()
			rep, err := audit.Run(ctx, pool, answers, audit.Config{})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "Audit of %s\n", args[0])
			rep.Write(out)
			if v := rep.Violations(); len(v) > 0 {
				fmt.Fprintf(out, "\nFAILED:\n  %s\n", strings.Join(v, "\n  "))
				return errViolations
			}
			fmt.Fprintln(out, "\nOK: every answer agrees with the tables, and every rule held.")
			return nil
		},
	}
}
