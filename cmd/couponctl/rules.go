package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/rules"
	"github.com/mops/coupon-api/shared/issuance"
)

func rulesCmd() *cobra.Command {
	return groupCmd("rules", "The rule settings the database holds: R3's monthly cap, and their history",
		rulesShowCmd(), rulesSetCmd())
}

func rulesShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show",
		Short: "The rule settings in force and every change of them, oldest first",
		Long: `Show the rule settings in force (R3's monthly cap per member and Asia/Tokyo month, in yen),
which every issuance (IssueCoupon, grant) and reconcile read from the database, then their
history: when, who (the database login), before, after, why. The first row is the migration
that brought the cap into the database, at the default of 2,000 yen.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			set, list, err := rules.Show(cmd.Context(), pool)
			if err != nil {
				return err
			}
			writeRules(cmd.OutOrStdout(), set, list)
			return nil
		},
	}
}

func writeRules(w io.Writer, set rules.Settings, list []rules.Change) {
	fmt.Fprintf(w, "monthly_cap_yen %d (set %s by %s)\n\n", set.MonthlyCapYen, inTokyo(set.ChangedAt), set.ChangedBy)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "change\twhen (Asia/Tokyo)\twho\tbefore\tafter\treason")
	for _, c := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", c.ID, inTokyo(c.At), c.By, settings(c.Before), settings(c.After), c.Reason)
	}
	_ = tw.Flush()
}

func inTokyo(t time.Time) string { return t.In(issuance.Tokyo).Format("2006-01-02 15:04:05.000") }

// settings writes a history row's settings as key=value, "-" for none.
func settings(m map[string]any) string {
	if len(m) == 0 {
		return "-"
	}
	var s []string
	if v, ok := m["monthly_cap_yen"]; ok {
		s = append(s, fmt.Sprintf("monthly_cap_yen=%v", v))
	}
	return strings.Join(s, " ")
}

func rulesSetCmd() *cobra.Command {
	var (
		capYen int
		reason string
	)
	c := &cobra.Command{
		Use:   "set --monthly-cap-yen N --reason TEXT",
		Short: "Change R3's monthly cap for the coupons issued from now on, with its history",
		Long: fmt.Sprintf(`Set R3's monthly cap, the yen one member may be issued per Asia/Tokyo calendar month
across campaigns, to N (1 to %d), in one transaction that writes its history row
with --reason and the database login (couponctl rules show). It applies to the coupons issued
after it commits, by every instance of IssueCoupon and every grant at once; the coupons already
issued stay, even above a lowered cap, and reconcile judges each coupon at the cap in force when
it was issued. Runs as a user in coupon_admin (docs/roles.md).

While it runs, new issuances wait for it, and it waits for the issuances in flight; it gives up
after 1 s (SQLSTATE 55P03, nothing changed) rather than hold them longer: run it again. A cap
equal to the one in force changes nothing and writes no history. Exit 2 for a cap out of range
or a missing reason, before the database is touched.`, issuance.MaxMonthlyCapYen),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if capYen < 1 || capYen > issuance.MaxMonthlyCapYen {
				return flagError("--monthly-cap-yen %d: want 1 to %d yen", capYen, issuance.MaxMonthlyCapYen)
			}
			if strings.TrimSpace(reason) == "" {
				return flagError("%s needs --reason TEXT: why, for the rules' history", cmd.CommandPath())
			}
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			ch, changed, err := rules.SetMonthlyCap(cmd.Context(), pool, capYen, reason)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if !changed {
				fmt.Fprintf(w, "monthly_cap_yen is already %d: nothing changed\n", capYen)
				return nil
			}
			fmt.Fprintf(w, "monthly_cap_yen changed (change %d at %s by %s)\n  before  %s\n  after   %s\n"+
				"coupons issued from now on are capped at %d yen per member and month; those issued before stay\n",
				ch.ID, ch.At.In(issuance.Tokyo).Format("2006-01-02T15:04:05.000Z07:00"), ch.By, settings(ch.Before), settings(ch.After), capYen)
			return nil
		},
	}
	c.Flags().IntVar(&capYen, "monthly-cap-yen", 0, "R3's cap in yen per member and Asia/Tokyo month (required)")
	c.Flags().StringVar(&reason, "reason", "", "why, for the rules' history (required)")
	_ = c.MarkFlagRequired("monthly-cap-yen")
	_ = c.MarkFlagRequired("reason")
	return c
}
