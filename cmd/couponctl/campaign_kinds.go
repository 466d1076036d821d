package main

import (
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// countFlags are campaign create's flags that give the campaign's size in coupons and when they
// are released: --coupons, --release, --daily-release with --days.
type countFlags struct {
	coupons  int
	releases []string // AT=N each
	daily    string   // HH:MM=N
	days     int
}

func (k *countFlags) register(f *pflag.FlagSet) {
	f.IntVar(&k.coupons, "coupons", 0, "the budget in coupons: N x --discount-yen yen (instead of --budget-yen, or equal to it)")
	f.StringArrayVar(&k.releases, "release", nil, "release N more coupons at AT, as AT=N, AT in RFC 3339 (repeatable)")
	f.StringVar(&k.daily, "daily-release", "", "release N more coupons every day at HH:MM Asia/Tokyo, as HH:MM=N (with --days and --starts)")
	f.IntVar(&k.days, "days", 0, fmt.Sprintf("how many daily releases --daily-release makes, 1-%d", campaign.MaxReleases))
}

// complete sets def's budget and releases from the flags given in f (the budget from
// --budget-yen or --coupons, both equal, or else the coupons the releases give) and checks the
// whole definition ([campaign.Campaign.Validate]). A form couponctl cannot take is a usage error
// (exit 2) naming its flag.
func (k countFlags) complete(f *pflag.FlagSet, def *campaign.Campaign) error {
	if def.DiscountYen <= 0 {
		return flagError("--discount-yen %d: want a positive number of yen", def.DiscountYen)
	}
	releases, err := parseReleases(k.releases)
	if err != nil {
		return err
	}
	daily, err := k.dailyReleases(f, def.StartsAt)
	if err != nil {
		return err
	}
	def.Releases = append(releases, daily...)
	if err := k.budget(f, def); err != nil {
		return err
	}
	if err := def.CheckReleases(); err != nil {
		return flagError("--release/--daily-release: %w", err)
	}
	if err := def.Validate(); err != nil {
		return usageError{err}
	}
	return nil
}

// parseReleases parses the values of --release, each AT=N.
func parseReleases(values []string) ([]campaign.Release, error) {
	var out []campaign.Release
	for _, v := range values {
		r, err := parseRelease(v)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// budget sets def.BudgetYen from --budget-yen, --coupons or the releases.
func (k countFlags) budget(f *pflag.FlagSet, def *campaign.Campaign) error {
	if !f.Changed("coupons") {
		if !f.Changed("budget-yen") && len(def.Releases) == 0 {
			return flagError("give the budget: --budget-yen N (yen) or --coupons N (coupons of --discount-yen)")
		}
		if !f.Changed("budget-yen") {
			return budgetOf(def, int64(def.ReleasedCoupons()), "the releases' coupons")
		}
		return nil
	}
	if k.coupons < 1 {
		return flagError("--coupons %d: want at least 1", k.coupons)
	}
	given := def.BudgetYen
	if err := budgetOf(def, int64(k.coupons), "--coupons "+strconv.Itoa(k.coupons)); err != nil {
		return err
	}
	if f.Changed("budget-yen") && given != def.BudgetYen {
		return flagError("--budget-yen %d is not --coupons %d x --discount-yen %d = %d yen: give one of the two, or both equal",
			given, k.coupons, def.DiscountYen, def.BudgetYen)
	}
	return nil
}

// budgetOf sets def.BudgetYen to coupons (what says where they come from) x its discount,
// refusing a budget above PostgreSQL's integer.
func budgetOf(def *campaign.Campaign, coupons int64, what string) error {
	yen := coupons * int64(def.DiscountYen)
	if yen > math.MaxInt32 {
		return flagError("%s x --discount-yen %d = %d yen: above the %d yen a budget may hold (PostgreSQL integer)",
			what, def.DiscountYen, yen, math.MaxInt32)
	}
	def.BudgetYen = int(yen)
	return nil
}

// parseRelease parses --release AT=N.
func parseRelease(v string) (campaign.Release, error) {
	at, n, ok := strings.Cut(v, "=")
	t, err := time.Parse(time.RFC3339, at)
	if !ok || err != nil {
		return campaign.Release{}, flagError("--release %q: want AT=N, AT in RFC 3339 such as 2026-12-05T10:00:00+09:00=100", v)
	}
	switch {
	case t.Nanosecond() != 0:
		// Every time couponctl prints is to the second (tokyoTime): two releases in one second
		// would print alike.
		return campaign.Release{}, flagError("--release %q: AT must be a whole second", v)
	case t.Year() < 2000:
		return campaign.Release{}, flagError("--release %q: AT before the year 2000 is a mistake", v)
	}
	coupons, err := releaseCoupons("--release", v, n)
	return campaign.Release{At: t, Coupons: coupons}, err
}

// releaseCoupons parses the N of a release flag's value v.
func releaseCoupons(flag, v, n string) (int, error) {
	coupons, err := strconv.Atoi(n)
	if err != nil || coupons < 1 || coupons > math.MaxInt32 {
		return 0, flagError("%s %q: N must be a whole number of coupons, 1 to %d", flag, v, math.MaxInt32)
	}
	return coupons, nil
}

// hhmm is the HH:MM of --daily-release: 00:00 to 23:59.
var hhmm = regexp.MustCompile(`^([01][0-9]|2[0-3]):([0-5][0-9])$`)

// dailyReleases parses --daily-release HH:MM=N with --days K into K releases from starts'
// Asia/Tokyo date ([campaign.DailyReleases]).
func (k countFlags) dailyReleases(f *pflag.FlagSet, starts *time.Time) ([]campaign.Release, error) {
	switch {
	case !f.Changed("daily-release") && f.Changed("days"):
		return nil, flagError("--days %d needs --daily-release HH:MM=N", k.days)
	case !f.Changed("daily-release"):
		return nil, nil
	case !f.Changed("days") || k.days < 1 || k.days > campaign.MaxReleases:
		return nil, flagError("--daily-release needs --days K, 1-%d: how many days it releases", campaign.MaxReleases)
	case starts == nil:
		return nil, flagError("--daily-release needs --starts T: its first release is on T's Asia/Tokyo date")
	}
	at, n, ok := strings.Cut(k.daily, "=")
	m := hhmm.FindStringSubmatch(at)
	if !ok || m == nil {
		return nil, flagError("--daily-release %q: want HH:MM=N, HH:MM Asia/Tokyo from 00:00 to 23:59, such as 10:00=100", k.daily)
	}
	coupons, err := releaseCoupons("--daily-release", k.daily, n)
	if err != nil {
		return nil, err
	}
	hour, _ := strconv.Atoi(m[1])
	minute, _ := strconv.Atoi(m[2])
	return dailyReleases(*starts, hour, minute, coupons, k.days), nil
}

// dailyReleases is [campaign.DailyReleases] as campaign create calls it: a variable, so that a
// test can swap in its broken variant (campaign_kinds_test.go).
var dailyReleases = campaign.DailyReleases

// writeCreated says what campaign create made of def.
func writeCreated(w io.Writer, def campaign.Campaign) {
	fmt.Fprintf(w, "created %s: %d yen coupons, budget %d yen (%d coupons) in %d budget stripe(s)\n",
		def.ID, def.DiscountYen, def.BudgetYen, def.BudgetYen/def.DiscountYen, max(def.Stripes, 1))
	if len(def.Releases) > 0 {
		fmt.Fprintf(w, "released in %d releases, %d coupons in all:\n", len(def.Releases), def.ReleasedCoupons())
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, r := range def.Releases {
			fmt.Fprintf(tw, "  %s\t%d coupons\n", tokyoTime(&r.At), r.Coupons)
		}
		_ = tw.Flush()
	}
	if def.AudienceOnly {
		fmt.Fprintf(w, "audience-only: only its audience's members get its coupon, none yet "+
			"(couponctl campaign audience add %s --members FILE --reason TEXT)\n", def.ID)
	}
}

// writeCounts writes the budget, issued and remaining lines of campaign show: yen and coupons.
func writeCounts(w io.Writer, s campaign.Status) {
	coupons := func(yen int) string { return fmt.Sprintf("%d yen (%d coupons)", yen, yen/s.DiscountYen) }
	fmt.Fprintf(w, "budget     %s\nissued     %s\nremaining  %s\n", coupons(s.BudgetYen), coupons(s.IssuedYen), coupons(s.RemainingYen()))
}

// writeKinds writes campaign show's lines of s's releases and audience, if it has them.
func writeKinds(w io.Writer, s campaign.Status) {
	if len(s.Schedule) > 0 {
		open, released := s.OpenReleases()
		fmt.Fprintf(w, "released   %d of %d coupons, in %d of %d releases", released, s.ReleasedCoupons(), open, len(s.Schedule))
		if s.State == campaign.StateActive || s.State == campaign.StateSoldOut || s.State == campaign.StateWaitingRelease {
			fmt.Fprintf(w, "; %d coupons to take now", s.RemainingCoupons)
		}
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "releases\tat (Asia/Tokyo)\tcoupons\treleased so far\topen")
		for _, r := range s.Schedule {
			fmt.Fprintf(tw, "\t%s\t%d\t%d\t%s\n", tokyoTime(&r.At), r.Coupons, r.Released, yesNo(r.Open))
		}
		_ = tw.Flush()
	}
	if s.AudienceOnly {
		fmt.Fprintf(w, "audience   %d members, audience-only: any other member is answered NOT_ELIGIBLE\n", s.AudienceSize)
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// kinds is campaign list's column for s's releases and audience: "-" for neither.
func kinds(s campaign.Status) string {
	var parts []string
	if len(s.Schedule) > 0 {
		open, _ := s.OpenReleases()
		parts = append(parts, fmt.Sprintf("releases %d/%d open", open, len(s.Schedule)))
		if s.NextReleaseAt != nil {
			parts = append(parts, "next "+tokyoTime(s.NextReleaseAt))
		}
	}
	if s.AudienceOnly {
		parts = append(parts, fmt.Sprintf("audience-only (%d members)", s.AudienceSize))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
