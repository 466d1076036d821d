package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/campaign"
	"github.com/mops/coupon-api/shared/envconf"
	"github.com/mops/coupon-api/shared/ids"
	"github.com/mops/coupon-api/shared/issuance"
)

func campaignCmd() *cobra.Command {
	return groupCmd("campaign", "Create, show and list campaigns", campaignCreateCmd(), campaignShowCmd(), campaignListCmd())
}

func campaignCreateCmd() *cobra.Command {
	var (
		def          campaign.Campaign
		starts, ends string
		expectedRPS  int
	)
	c := &cobra.Command{
		Use:   "create --id ID --discount-yen N --budget-yen N [--starts T --ends T] [--stripes K | --expected-rps N]",
		Short: "Create a campaign; without --starts/--ends it is always active",
		Long: `Create a campaign: its definition and its budget, split over K budget stripe rows
(whole coupons each, as even as possible). One stripe suits an ordinary campaign; a first-come
campaign expected to take many requests per second gets one stripe per ` + fmt.Sprint(campaign.StripeRateTPS) + ` requests/s
(--expected-rps), at most ` + fmt.Sprint(campaign.MaxStripes) + ` (docs/hot-campaigns.md).`,
		Example: `  couponctl campaign create --id SW-A --discount-yen 1000 --budget-yen 100000
  couponctl campaign create --id WEEK --discount-yen 500 --budget-yen 50000 \
    --starts "$(date --iso-8601=seconds)" --ends "$(date -d '+7 days' --iso-8601=seconds)"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if def.StartsAt, err = parseTime("--starts", starts); err != nil {
				return err
			}
			if def.EndsAt, err = parseTime("--ends", ends); err != nil {
				return err
			}
			switch {
			case expectedRPS < 0:
				return flagError("--expected-rps %d: must not be negative", expectedRPS)
			case expectedRPS > 0 && cmd.Flags().Changed("stripes"):
				return flagError("give --stripes or --expected-rps, not both")
			case expectedRPS > 0:
				def.Stripes = campaign.StripesFor(expectedRPS)
			case cmd.Flags().Changed("stripes") && def.Stripes < 1:
				return flagError("--stripes %d: must be 1-%d", def.Stripes, campaign.MaxStripes)
			}
			if err := def.Validate(); err != nil {
				return usageError{err}
			}
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			if err := campaign.Create(cmd.Context(), pool, def); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created %s: %d yen coupons, budget %d yen in %d budget stripe(s)\n",
				def.ID, def.DiscountYen, def.BudgetYen, max(def.Stripes, 1))
			capYen, err := envconf.Int("MONTHLY_CAP_YEN", issuance.DefaultMonthlyCapYen)
			if err != nil {
				return err
			}
			for _, w := range def.Warnings(capYen, time.Now()) {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&def.ID, "id", "", "campaign id, 1-64 of [A-Za-z0-9_-] (required)")
	f.IntVar(&def.DiscountYen, "discount-yen", 0, "face value of one coupon in yen (required)")
	f.IntVar(&def.BudgetYen, "budget-yen", 0, "campaign budget approval in yen: R1's ceiling (required)")
	f.StringVar(&starts, "starts", "", "first instant coupons are issued, RFC 3339 (2026-09-19T00:00:00+09:00)")
	f.StringVar(&ends, "ends", "", "instant issuing stops, RFC 3339, exclusive")
	f.IntVar(&def.Stripes, "stripes", 1, fmt.Sprintf("budget stripe rows the budget is split over, 1-%d", campaign.MaxStripes))
	f.IntVar(&expectedRPS, "expected-rps", 0, fmt.Sprintf("peak requests/s expected: sets --stripes to one per %d/s", campaign.StripeRateTPS))
	for _, name := range []string{"id", "discount-yen", "budget-yen"} {
		_ = c.MarkFlagRequired(name)
	}
	return c
}

func parseTime(flag, v string) (*time.Time, error) {
	if v == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return nil, flagError("%s %q: want RFC 3339 such as 2026-09-19T00:00:00+09:00", flag, v)
	}
	return &t, nil
}

func campaignShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show a campaign's budget, issued and remaining yen",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return flagError("%s needs one campaign id, e.g. %s SW-A", cmd.CommandPath(), cmd.CommandPath())
			}
			return ids.Campaign(args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			s, err := campaign.Show(cmd.Context(), pool, args[0])
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "campaign   %s\ndiscount   %d yen\nbudget     %d yen\nissued     %d yen\nremaining  %d yen\nstripes    %d\n",
				s.ID, s.DiscountYen, s.BudgetYen, s.IssuedYen, s.RemainingYen(), s.Stripes)
			fmt.Fprintf(w, "period     %s .. %s\n", fmtTime(s.StartsAt), fmtTime(s.EndsAt))
			return nil
		},
	}
}

func campaignListCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every campaign: budget, issued, remaining (yen), period (Asia/Tokyo) and whether it is active now",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			list, err := campaign.List(cmd.Context(), pool)
			if err != nil {
				return err
			}
			writeCampaignList(cmd.OutOrStdout(), list, time.Now())
			return nil
		},
	}
}

// writeCampaignList writes list as a table, amounts in yen, periods in Asia/Tokyo time, and
// whether each campaign issues coupons at now (else why not: not started, or ended).
func writeCampaignList(w io.Writer, list []campaign.Status, now time.Time) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no campaigns (couponctl campaign create adds one)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "campaign\tdiscount_yen\tbudget_yen\tissued_yen\tremaining_yen\tstarts\tends\tactive now")
	for _, s := range list {
		active := "yes"
		switch {
		case s.StartsAt != nil && now.Before(*s.StartsAt):
			active = "no (not started)"
		case s.EndsAt != nil && !now.Before(*s.EndsAt):
			active = "no (ended)"
		case s.RemainingYen() < s.DiscountYen:
			active = "yes (budget spent)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", s.ID, s.DiscountYen, s.BudgetYen, s.IssuedYen,
			s.RemainingYen(), fmtTime(s.StartsAt), fmtTime(s.EndsAt), active)
	}
	_ = tw.Flush()
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "(open)"
	}
	return t.In(issuance.Tokyo).Format(time.RFC3339)
}
