package opsverbs

import (
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/reconcile"
)

// Reconcile is "reconcile": it counts the tables against the counters and the outbox against
// the coupons, exports what drifted, and returns [ErrViolations] on any drift.
func Reconcile() *cobra.Command {
	var (
		repair bool
		format string
	)
	c := &cobra.Command{
		Use:   "reconcile [--repair] [--format text|json]",
		Short: "Compare counters with rows and the outbox with coupons; exit 1 on any drift",
		Long: `Count the tables and report every broken rule and drifted counter: R1 (campaign counters,
summed over budget stripes, against live coupons), R2, R3 (member x month usage against live
coupons), and one outbox row per coupon (unless outbox prune deleted it after delivery). Drift is a
fault: exit 1. What the Before code left and the migration recorded (campaigns already over
budget, member-months already over the cap, redeemed duplicates kept live) is reported as a
legacy fact and does not fail the run.

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
			pool, closePool, err := OpenMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			out, err := checkRepairing(cmd, pool, repair, format)
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
				out.Report.Write(w)
			}
			if err := recordDrift(cmd, out.Report); err != nil {
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
	return c
}

// reconcileOutput is what reconcile found, as --format json writes it.
type reconcileOutput struct {
	Before     *reconcile.Report   `json:"before_repair,omitempty"`
	Repaired   *reconcile.Repaired `json:"repaired,omitempty"`
	Report     reconcile.Report    `json:"report"`
	Violations []string            `json:"violations"`
	Facts      []string            `json:"facts"`
}

// checkRepairing checks pool and, with repair and a violation found, repairs it and checks again;
// in --format text it writes the report before the repair and what the repair did.
func checkRepairing(cmd *cobra.Command, pool *pgxpool.Pool, repair bool, format string) (reconcileOutput, error) {
	var out reconcileOutput
	rep, err := reconcile.Check(cmd.Context(), pool)
	if err != nil {
		return out, err
	}
	if repair && len(rep.Violations()) > 0 {
		before := rep
		fixed, err := reconcile.Repair(cmd.Context(), pool)
		if err != nil {
			return out, err
		}
		if rep, err = reconcile.Check(cmd.Context(), pool); err != nil {
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
	out.Report, out.Violations, out.Facts = rep, append([]string{}, rep.Violations()...), append([]string{}, rep.Facts()...)
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
