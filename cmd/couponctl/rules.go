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
	return groupCmd("rules", "The rule settings the database holds: R3's monthly cap, the console's approval line, and their history",
		rulesShowCmd(), rulesSetCmd())
}

func rulesShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show",
		Short: "The rule settings in force and every change of them, oldest first",
		Long: `Show the rule settings in force: R3's monthly cap per member and Asia/Tokyo month, in yen,
which every issuance (IssueCoupon, grant) and reconcile read from the database, and the
console's approval line (a budget raise through the console of more than that many yen waits
for a second approver); then their history: when, who (the database login), before, after,
why. The first rows are the migrations that brought each setting into the database, at its
default (2,000 yen; 100,000 yen).`,
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
	fmt.Fprintf(w, "monthly_cap_yen %d\napproval_above_yen %d\n(set %s by %s)\n\n", set.MonthlyCapYen, set.ApprovalAboveYen,
		inTokyo(set.ChangedAt), set.ChangedBy)
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
	for _, k := range []string{"monthly_cap_yen", "approval_above_yen"} {
		if v, ok := m[k]; ok {
			s = append(s, fmt.Sprintf("%s=%v", k, v))
		}
	}
	return strings.Join(s, " ")
}

func rulesSetCmd() *cobra.Command {
	var (
		capYen      int
		approvalYen int64
		reason      string
	)
	c := &cobra.Command{
		Use:   "set [--monthly-cap-yen N] [--approval-above-yen N] --reason TEXT",
		Short: "Change R3's monthly cap or the console's approval line, with its history",
		Long: fmt.Sprintf(`Set the rule settings given, in one transaction that writes one history row with --reason and
the database login (couponctl rules show):

--monthly-cap-yen N     R3's monthly cap, the yen one member may be issued per Asia/Tokyo
                        calendar month across campaigns (1 to %d). It applies to the coupons
                        issued after it commits, by every instance of IssueCoupon and every grant
                        at once; the coupons already issued stay, even above a lowered cap, and
                        reconcile judges each coupon at the cap in force when it was issued.
                        While it runs, new issuances wait for it, and it waits for the
                        issuances in flight.
--approval-above-yen N  the console's four-eyes line (0 to %d): a budget raise through the
                        console of more than N yen over the budget in force becomes a request
                        that a second approver decides (docs/roles.md, "The console"); 0 sends
                        every raise. Requests already made keep waiting. Issuances never wait
                        for it.

Runs as a user in coupon_admin (docs/roles.md). It gives up after 1 s of waiting for a lock
(SQLSTATE 55P03, nothing changed): run it again. Settings equal to those in force change
nothing and write no history. Exit 2 for a setting out of range, neither setting, or a missing
reason, before the database is touched.`, issuance.MaxMonthlyCapYen, rules.MaxApprovalAboveYen),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			capArg, lineArg, err := rulesSetFlags(cmd, capYen, approvalYen, reason)
			if err != nil {
				return err
			}
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			ch, changed, err := rules.Set(cmd.Context(), pool, capArg, lineArg, reason)
			if err != nil {
				return err
			}
			writeRulesSet(cmd.OutOrStdout(), ch, changed, capArg, lineArg)
			return nil
		},
	}
	c.Flags().IntVar(&capYen, "monthly-cap-yen", 0, "R3's cap in yen per member and Asia/Tokyo month")
	c.Flags().Int64Var(&approvalYen, "approval-above-yen", 0, "the console's four-eyes line in yen (0: every raise waits for approval)")
	c.Flags().StringVar(&reason, "reason", "", "why, for the rules' history (required)")
	_ = c.MarkFlagRequired("reason")
	return c
}

// rulesSetFlags returns the settings `rules set` was given (nil: not given), or a usage error
// naming the flag for a value out of range, no setting, or no reason.
func rulesSetFlags(cmd *cobra.Command, capYen int, approvalYen int64, reason string) (*int, *int64, error) {
	var capArg *int
	var lineArg *int64
	if cmd.Flags().Changed("monthly-cap-yen") {
		capArg = &capYen
	}
	if cmd.Flags().Changed("approval-above-yen") {
		lineArg = &approvalYen
	}
	switch {
	case capArg == nil && lineArg == nil:
		return nil, nil, flagError("%s needs --monthly-cap-yen N, --approval-above-yen N or both", cmd.CommandPath())
	case capArg != nil && rules.Check(capArg, nil) != nil:
		return nil, nil, flagError("--monthly-cap-yen %d: want 1 to %d yen", capYen, issuance.MaxMonthlyCapYen)
	case lineArg != nil && rules.Check(nil, lineArg) != nil:
		return nil, nil, flagError("--approval-above-yen %d: want 0 to %d yen", approvalYen, rules.MaxApprovalAboveYen)
	case strings.TrimSpace(reason) == "":
		return nil, nil, flagError("%s needs --reason TEXT: why, for the rules' history", cmd.CommandPath())
	}
	return capArg, lineArg, nil
}

// writeRulesSet reports what `rules set` changed, given the settings asked for (nil: not given).
func writeRulesSet(w io.Writer, ch rules.Change, changed bool, capYen *int, approvalYen *int64) {
	if !changed {
		var asked []string
		if capYen != nil {
			asked = append(asked, fmt.Sprintf("monthly_cap_yen is already %d", *capYen))
		}
		if approvalYen != nil {
			asked = append(asked, fmt.Sprintf("approval_above_yen is already %d", *approvalYen))
		}
		fmt.Fprintf(w, "%s: nothing changed\n", strings.Join(asked, ", "))
		return
	}
	var keys []string
	for _, k := range []string{"monthly_cap_yen", "approval_above_yen"} {
		if _, ok := ch.After[k]; ok {
			keys = append(keys, k)
		}
	}
	fmt.Fprintf(w, "%s changed (change %d at %s by %s)\n  before  %s\n  after   %s\n", strings.Join(keys, " and "),
		ch.ID, ch.At.In(issuance.Tokyo).Format("2006-01-02T15:04:05.000Z07:00"), ch.By, settings(ch.Before), settings(ch.After))
	if v, ok := ch.After["monthly_cap_yen"]; ok {
		fmt.Fprintf(w, "coupons issued from now on are capped at %v yen per member and month; those issued before stay\n", v)
	}
	if v, ok := ch.After["approval_above_yen"]; ok {
		fmt.Fprintf(w, "budget raises through the console of more than %v yen now wait for a second approver\n", v)
	}
}
