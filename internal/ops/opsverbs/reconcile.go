package opsverbs

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/reconcile"
)

// Reconcile is "reconcile": it counts the tables against the counters and the outbox against
// the coupons, exports what drifted, and returns [ErrViolations] on any drift.
func Reconcile() *cobra.Command {
	var (
		repair, full bool
		format       string
		horizonWait  time.Duration
	)
	c := &cobra.Command{
		Use:   "reconcile [--repair] [--full] [--format text|json]",
		Short: "Compare counters with rows and the outbox with coupons; exit 1 on any drift",
		Long: `Count the tables and report every broken rule and drifted counter: R1 (campaign counters,
summed over budget stripes, against live coupons), R2, R3 (member x month usage against live
coupons), and one outbox row per coupon (unless outbox prune deleted it after delivery). Drift is a
fault: exit 1. What the Before code left and the migration recorded (campaigns already over
budget, member-months already over the cap, redeemed duplicates kept live) is reported as a
legacy fact and does not fail the run.

A clean run is recorded (reconcile_runs). The next run checks only what changed since it: every
campaign counter against its coupons (from the clean run's baseline), and R2, R3, the outbox and
the redemptions of the coupons issued or voided since. --full checks every row, as the first run
does. A counter or an outbox row edited by hand, with no coupon issued or voided beside it, is
found by --full only: run it weekly (docs/operations.md, "Reconcile"). Before its snapshot a run
waits, at most --horizon-wait, for the transactions in progress as it begins.

--repair rebuilds drifted counters from the live coupons in one transaction that locks each row
it fixes (docs/migration.md), then checks again; it exits 1 only if faults remain.
Run daily in production (deploy/daily.sh, as couponops reconcile). The faults found (after any repair) are also exported as the
metrics coupon.reconcile.drift.amount and coupon.reconcile.drift.rows when the OTEL_* environment
names an exporter (OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT); docs/operations.md has
the alert on them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "text" && format != "json" {
				return flagError("--format %q: want text or json", format)
			}
			if horizonWait <= 0 {
				return flagError("--horizon-wait %s: want a positive duration", horizonWait)
			}
			pool, closePool, err := OpenMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			opts := reconcile.Options{Full: full, HorizonWait: horizonWait}
			if format == "text" {
				opts.Progress = func(f string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), f+"\n", a...) }
			}
			out, err := checkRepairing(cmd, pool, repair, format, opts)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if format == "json" {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				if err := enc.Encode(out); err != nil {
					return err
				}
			} else {
				out.Report.WritePass(w)
			}
			if err := recordDrift(cmd, out.Report.Report); err != nil {
				return err
			}
			if len(out.Violations) > 0 {
				return ErrViolations
			}
			return nil
		},
	}
	c.Flags().BoolVar(&repair, "repair", false, "rebuild drifted counters from the live coupons, then check again")
	c.Flags().StringVar(&format, "format", "text", "text or json")
	c.Flags().BoolVar(&full, "full", false, "check every row, not only what changed since the last clean run")
	c.Flags().DurationVar(&horizonWait, "horizon-wait", time.Minute, "how long to wait for the transactions in progress as the run begins")
	return c
}

// reconcileOutput is what reconcile found, as --format json writes it.
type reconcileOutput struct {
	Before     *reconcile.Report   `json:"before_repair,omitempty"`
	Repaired   *reconcile.Repaired `json:"repaired,omitempty"`
	Report     reconcile.Pass      `json:"report"`
	Violations []string            `json:"violations"`
	Facts      []string            `json:"facts"`
}

// checkRepairing checks pool and, with repair and a violation found, repairs it and checks
// again, in full; in --format text it writes the report before the repair and what the repair did.
func checkRepairing(cmd *cobra.Command, pool *pgxpool.Pool, repair bool, format string, opts reconcile.Options) (reconcileOutput, error) {
	var out reconcileOutput
	p, err := reconcile.Run(cmd.Context(), pool, opts)
	if err != nil {
		return out, err
	}
	if repair && len(p.Violations()) > 0 {
		before := p.Report
		fixed, err := reconcile.Repair(cmd.Context(), pool)
		if err != nil {
			return out, err
		}
		opts.Full = true
		if p, err = reconcile.Run(cmd.Context(), pool, opts); err != nil {
			return out, err
		}
		out.Before, out.Repaired = &before, &fixed
		if format == "text" {
			w := cmd.OutOrStdout()
			before.Write(w)
			writeRepaired(cmd, fixed)
			fmt.Fprintln(w, "\nafter the repair:")
		}
	}
	out.Report, out.Violations, out.Facts = p, append([]string{}, p.Violations()...), append([]string{}, p.Facts()...)
	return out, nil
}

func writeRepaired(cmd *cobra.Command, r reconcile.Repaired) {
	w := cmd.OutOrStdout()
	fmt.Fprintln(w, "\nrepaired:")
	for _, f := range r.Campaigns {
		fmt.Fprintf(w, "  campaign %s: counter %d -> %d yen\n", f.Key, f.BeforeYen, f.AfterYen)
	}
	for _, f := range r.Usage {
		fmt.Fprintf(w, "  usage %s: %d -> %d yen\n", f.Key, f.BeforeYen, f.AfterYen)
	}
	for _, s := range r.Refused {
		fmt.Fprintf(w, "  NOT repaired, %s (fix by hand; see docs/migration.md)\n", s)
	}
	if len(r.Campaigns)+len(r.Usage)+len(r.Refused) == 0 {
		fmt.Fprintln(w, "  nothing: no counter drifted")
	}
}
