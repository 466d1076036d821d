package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/rules"
	"github.com/mops/coupon-api/shared/issuance"
)

func campaignCmd() *cobra.Command {
	return groupCmd("campaign", "Create, show, list and change campaigns, and read their history",
		campaignCreateCmd(), campaignShowCmd(), campaignListCmd(), campaignUpdateCmd(),
		campaignPauseCmd(), campaignResumeCmd(), campaignEndCmd(), campaignHistoryCmd(), campaignAudienceCmd())
}

func campaignCreateCmd() *cobra.Command {
	var (
		def          campaign.Campaign
		starts, ends string
		expires      string
		expectedRPS  int
		counts       countFlags
	)
	c := &cobra.Command{
		Use: "create --id ID [--name TEXT] --discount-yen N (--budget-yen N | --coupons N) [--starts T --ends T] [--release AT=N]... " +
			"[--daily-release HH:MM=N --days K] [--audience-only] [--stripes K | --expected-rps N] [--coupon-valid-days D | --coupons-expire T]",
		Short: "Create a campaign; without --starts/--ends it is always active",
		Long: `Create a campaign: its definition and its budget, split over K budget stripe rows
(whole coupons each, as even as possible). One stripe suits an ordinary campaign; a first-come
campaign expected to take many requests per second gets one stripe per ` + fmt.Sprint(campaign.StripeRateTPS) + ` requests/s
(--expected-rps), at most ` + fmt.Sprint(campaign.MaxStripes) + ` (docs/hot-campaigns.md).

The budget is --budget-yen N yen, or --coupons N coupons of --discount-yen D yen (N x D yen; with
both, they must be equal): a first-N campaign (先着N名様) is --coupons N.

Releases open the budget's coupons over time: --release AT=N (repeatable; AT in RFC 3339)
releases N more coupons at AT; --daily-release HH:MM=N --days K releases N more every day at
HH:MM Asia/Tokyo, K times, the first on --starts' Asia/Tokyo date, or on the next day when HH:MM
that day comes before --starts (no release is before the start). Coupons not taken roll over to
the next release. Before the first release IssueCoupon answers CAMPAIGN_NOT_ACTIVE (NOT_STARTED);
once the released coupons are taken, BUDGET_EXCEEDED with next_release_at when a release is to
come. The database judges each release at the instant it writes the coupon: none commits
before AT. Without --budget-yen or --coupons the budget is the releases' coupons; with one, the
releases may give fewer (campaign update --release adds more later), never more.

--audience-only gives the coupon only to the members of the campaign's audience (campaign
audience add); any other member is answered 403 NOT_ELIGIBLE, nothing written.

A form couponctl cannot take (a malformed value, --coupons and --budget-yen that differ, releases
above the budget, a release at or after --ends, two at one instant) exits 2 naming the flag;
a refusal by the database exits 1; either way nothing is created.`,
		Example: `  couponctl campaign create --id SW-A --discount-yen 1000 --budget-yen 100000
  couponctl campaign create --id WEEK --discount-yen 500 --budget-yen 50000 \
    --starts "$(date --iso-8601=seconds)" --ends "$(date -d '+7 days' --iso-8601=seconds)"
  couponctl campaign create --id FIRST1000 --discount-yen 300 --coupons 1000 --expected-rps 8000
  couponctl campaign create --id DAILY --discount-yen 500 --starts "$(date -d tomorrow +%FT00:00:00+09:00)" \
    --daily-release 10:00=100 --days 7
  couponctl campaign create --id GOLD --discount-yen 1000 --coupons 5000 --audience-only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := parseCreateTimes(&def, starts, ends, expires); err != nil {
				return err
			}
			if cmd.Flags().Changed("coupon-valid-days") && def.CouponValidDays < 1 {
				return flagError("--coupon-valid-days %d: want 1-%d", def.CouponValidDays, campaign.MaxValidDays)
			}
			if err := createStripes(cmd.Flags(), &def, expectedRPS); err != nil {
				return err
			}
			if err := counts.complete(cmd.Flags(), &def); err != nil {
				return err
			}
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			if err := campaign.Create(cmd.Context(), pool, def); err != nil {
				return err
			}
			writeCreated(cmd.OutOrStdout(), def)
			set, _, err := rules.Show(cmd.Context(), pool)
			if err != nil {
				return err
			}
			s, err := campaign.Show(cmd.Context(), pool, def.ID)
			if err != nil {
				return err
			}
			for _, w := range def.Warnings(set.MonthlyCapYen, s.State) {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&def.ID, "id", "", "campaign id, 1-64 of [A-Za-z0-9_-] (required)")
	f.StringVar(&def.Name, "name", "", "a display name shown beside the id, 1-100 characters (年末感謝祭 500円クーポン)")
	f.IntVar(&def.DiscountYen, "discount-yen", 0, "face value of one coupon in yen (required)")
	f.IntVar(&def.BudgetYen, "budget-yen", 0, "campaign budget approval in yen: R1's ceiling (or --coupons)")
	f.StringVar(&starts, "starts", "", "first instant coupons are issued, RFC 3339 (2026-09-19T00:00:00+09:00)")
	f.StringVar(&ends, "ends", "", "instant issuing stops, RFC 3339, exclusive")
	f.IntVar(&def.Stripes, "stripes", 1, fmt.Sprintf("budget stripe rows the budget is split over, 1-%d", campaign.MaxStripes))
	f.IntVar(&def.CouponValidDays, "coupon-valid-days", 0, fmt.Sprintf("each coupon valid until the end of the D-th Asia/Tokyo day from its issue (the issue day is the first), 1-%d", campaign.MaxValidDays))
	f.StringVar(&expires, "coupons-expire", "", "each coupon valid until this instant, RFC 3339 (instead of --coupon-valid-days)")
	f.IntVar(&expectedRPS, "expected-rps", 0, fmt.Sprintf("peak requests/s expected: sets --stripes to one per %d/s", campaign.StripeRateTPS))
	counts.register(f)
	f.BoolVar(&def.AudienceOnly, "audience-only", false, "only the members of its audience get its coupon (campaign audience add); others: NOT_ELIGIBLE")
	for _, name := range []string{"id", "discount-yen"} {
		_ = c.MarkFlagRequired(name)
	}
	return c
}

// parseCreateTimes sets the period and the fixed expiry of def, a campaign to create, from
// --starts starts, --ends ends and --coupons-expire expires ("" for none): a malformed one, or an
// expiry [checkExpiryFlag] refuses, is a usage error (exit 2).
func parseCreateTimes(def *campaign.Campaign, starts, ends, expires string) error {
	var err error
	if def.StartsAt, err = parseTime("--starts", starts); err != nil {
		return usageError{err}
	}
	if def.EndsAt, err = parseTime("--ends", ends); err != nil {
		return usageError{err}
	}
	if def.CouponsExpireAt, err = parseTime("--coupons-expire", expires); err != nil {
		return usageError{err}
	}
	return checkExpiryFlag(*def, expires)
}

// createStripes sets the budget stripes of def, a campaign to create, from --expected-rps
// expectedRPS when given, else keeps --stripes; a negative rate, both flags, or --stripes below 1
// is a usage error (exit 2).
func createStripes(f *pflag.FlagSet, def *campaign.Campaign, expectedRPS int) error {
	switch {
	case expectedRPS < 0:
		return flagError("--expected-rps %d: must not be negative", expectedRPS)
	case expectedRPS > 0 && f.Changed("stripes"):
		return flagError("give --stripes or --expected-rps, not both")
	case expectedRPS > 0:
		def.Stripes = campaign.StripesFor(expectedRPS)
	case f.Changed("stripes") && def.Stripes < 1:
		return flagError("--stripes %d: must be 1-%d", def.Stripes, campaign.MaxStripes)
	}
	return nil
}

// checkExpiryFlag refuses (a usage error: exit 2) the --coupons-expire expires of a campaign
// to create, def, at or before its start ([campaign.CheckExpiry]). One that has passed the
// database refuses, judged by its clock (campaign_create).
func checkExpiryFlag(def campaign.Campaign, expires string) error {
	if _, err := expiryCheck(def.StartsAt, def.EndsAt, def.CouponsExpireAt); err != nil {
		return flagError("campaign %s: %w", def.ID, err)
	}
	return nil
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
		Short: "Show a campaign's budget, issued and remaining yen, period and state",
		Args:  oneCampaign,
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
			writeCampaign(cmd.OutOrStdout(), s)
			return nil
		},
	}
}

// writeCampaign writes one campaign as campaign show does.
func writeCampaign(w io.Writer, s campaign.Status) {
	fmt.Fprintf(w, "campaign   %s\n", s.ID)
	if s.Name != "" {
		fmt.Fprintf(w, "name       %s\n", s.Name)
	}
	fmt.Fprintf(w, "state      %s\ndiscount   %d yen\n", state(s), s.DiscountYen)
	writeCounts(w, s)
	fmt.Fprintf(w, "stripes    %d\n", s.Stripes)
	fmt.Fprintf(w, "period     %s .. %s\nvalidity   %s\n", fmtTime(s.StartsAt), fmtTime(s.EndsAt), validity(s.Campaign))
	writeKinds(w, s)
}

// validity says how long c's coupons are valid.
func validity(c campaign.Campaign) string {
	switch {
	case c.CouponValidDays > 0:
		return fmt.Sprintf("%d Asia/Tokyo days from issue (the issue day is the first)", c.CouponValidDays)
	case c.CouponsExpireAt != nil:
		return "until " + fmtTime(c.CouponsExpireAt)
	}
	return "no expiry"
}

// state is s's state as the database judged it (campaign_state, [campaign.Status.State]) in
// campaign show's words: with when it was paused, when its coupons expired if that ended it,
// when its first release comes if it waits for it, and whether an open campaign's budget or
// released coupons are spent.
func state(s campaign.Status) string {
	switch s.State {
	case campaign.StatePaused:
		return "paused since " + fmtTime(s.PausedAt)
	case campaign.StateEnded:
		return "ended"
	case campaign.StateExpired:
		return "ended (its coupons expired " + fmtTime(s.CouponsExpireAt) + ")"
	case campaign.StateNotStarted:
		if s.OpensAt != nil && (s.StartsAt == nil || !s.OpensAt.Equal(*s.StartsAt)) {
			return "not started (first release at " + fmtTime(s.OpensAt) + ")"
		}
		return "not started"
	case campaign.StateWaitingRelease:
		return "active (released coupons taken; next release at " + fmtTime(s.NextReleaseAt) + ")"
	case campaign.StateSoldOut:
		if len(s.Schedule) > 0 && s.RemainingYen() >= s.DiscountYen {
			return "active (released coupons taken; no release to come)"
		}
		return "active (budget spent)"
	}
	return "active"
}

func campaignListCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every campaign: budget, issued, remaining (yen and coupons), period (Asia/Tokyo), releases, audience and state now",
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
			writeCampaignList(cmd.OutOrStdout(), list)
			return nil
		},
	}
}

// writeCampaignList writes list as a table, amounts in yen and in coupons (issued/budget), the
// coupons the database says can still be issued now (by the budget and the releases), periods in
// Asia/Tokyo time, releases and audience, and each campaign's state as the database judged it
// ([state]).
func writeCampaignList(w io.Writer, list []campaign.Status) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no campaigns (couponctl campaign create adds one)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "campaign\tdiscount_yen\tbudget_yen\tissued_yen\tremaining_yen\tcoupons_issued/budget\tremaining_coupons\tstarts\tends\tkind\tstate")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d/%d\t%d\t%s\t%s\t%s\t%s\n", s.ID, s.DiscountYen, s.BudgetYen, s.IssuedYen,
			s.RemainingYen(), s.IssuedYen/s.DiscountYen, s.BudgetYen/s.DiscountYen, s.RemainingCoupons,
			fmtTime(s.StartsAt), fmtTime(s.EndsAt), kinds(s), state(s))
	}
	_ = tw.Flush()
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "(open)"
	}
	return t.In(issuance.Tokyo).Format(time.RFC3339)
}
