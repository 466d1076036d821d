package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/shared/ids"
	"github.com/mops/coupon-api/shared/issuance"
)

// changeHelp is what every change verb says of how it works.
const changeHelp = `

The change is one transaction: it locks the campaign's budget stripes (IssueCoupon's calls queue
for the few milliseconds it holds them), judges the change on them and writes it to the
campaign's history with --reason and the database login that made it (couponctl campaign history
ID). It waits at most 1 s for each stripe (or the session's own lock_timeout, e.g.
PGOPTIONS="-c lock_timeout=10s"): a stripe held longer by another transaction refuses the change
(exit 1, nothing changed; pg_stat_activity shows the holder). Run it as a user in coupon_admin
(docs/roles.md).`

// oneCampaign is the Args of a verb that takes one campaign id.
func oneCampaign(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("%s needs one campaign id, e.g. %s SW-A", cmd.CommandPath(), cmd.CommandPath())
	}
	return ids.Campaign(args[0])
}

func campaignUpdateCmd() *cobra.Command {
	var (
		budget, add  int64
		stripes      int
		starts, ends string
		validDays    int
		expires      string
		releases     []string
		reason, name string
	)
	c := &cobra.Command{
		Use:   "update ID [--budget-yen N | --add-budget-yen D] [--stripes K] [--starts T] [--ends T] [--coupon-valid-days D | --coupons-expire T] [--release AT=N]... --reason TEXT",
		Short: "Change a live campaign's budget, budget stripes, period, coupon validity or releases",
		Long: `Change a live campaign while IssueCoupon runs.

--budget-yen N sets the budget; --add-budget-yen D adds D yen to the budget the change finds
(negative cuts), so two operators adding at once both take effect. A budget below the yen already
issued is refused, naming that figure, and nothing changes. A raise on a sold-out campaign lets
out exactly (N - old) / discount more coupons.

--stripes K lays the budget out over K budget stripes (1-64, at most one per coupon of budget):
the budget and the issued yen stay exactly what they were.

--starts T and --ends T move the period (RFC 3339; "open" removes the bound). An end moved to
the past ends the campaign as "campaign end" does: once the command returns, no coupon of it
commits.

--coupon-valid-days D (until the end of the D-th Asia/Tokyo day from issue; 0 removes the
validity) or --coupons-expire T (until the instant T) set the validity of the coupons issued from
then on; coupons issued before keep theirs.

--release AT=N (repeatable; AT in RFC 3339) adds a release of N more coupons at AT, after the
budget change when there is one. AT must be in the future by the database's clock, before the
end, and not the instant of another release; the releases may give no more coupons in all than
the budget holds (raise it in the same command). A release added is in the history; it cannot be
taken back, only the campaign paused or ended.` + changeHelp,
		Example: `  couponctl campaign update BF --add-budget-yen 500000 --reason "marketing approved 500 more (JIRA-812)"
  couponctl campaign update BF --stripes 16 --reason "hot: 8,000 requests/s"
  couponctl campaign update SALE --ends 2026-12-25T00:00:00+09:00 --reason "extended by a day"
  couponctl campaign update DAILY --add-budget-yen 50000 --release 2026-12-12T10:00:00+09:00=100 --reason "an eighth day (PROMO-77)"`,
		Args: oneCampaign,
		RunE: func(cmd *cobra.Command, args []string) error {
			ch := campaign.Changes{Reason: reason}
			f := cmd.Flags()
			if err := budgetChange(f, &ch, budget, add); err != nil {
				return err
			}
			if err := changeRanges(f, stripes, validDays); err != nil {
				return err
			}
			if f.Changed("stripes") {
				ch.Stripes = &stripes
			}
			var err error
			if ch.SetStarts = f.Changed("starts"); ch.SetStarts {
				if ch.StartsAt, err = parseBound("--starts", starts); err != nil {
					return usageError{err}
				}
			}
			if ch.SetEnds = f.Changed("ends"); ch.SetEnds {
				if ch.EndsAt, err = parseBound("--ends", ends); err != nil {
					return usageError{err}
				}
			}
			if err := validityChange(f, &ch, validDays, expires); err != nil {
				return err
			}
			if ch.Releases, err = parseReleases(releases); err != nil {
				return err
			}
			if err := nameChange(f, &ch, name); err != nil {
				return err
			}
			if ch.Empty() {
				return usageError{fmt.Errorf("nothing to change: give --budget-yen, --add-budget-yen, --stripes, --starts, --ends, --coupon-valid-days, --coupons-expire, --release or --name")}
			}
			return runChange(cmd, args[0], func(ctx context.Context, db campaign.Querier) ([]campaign.Change, error) {
				return update(ctx, db, cmd.ErrOrStderr(), args[0], ch)
			})
		},
	}
	f := c.Flags()
	f.StringVar(&name, "name", "", "the campaign's new display name, shown beside its id (1-100 characters)")
	f.Int64Var(&budget, "budget-yen", 0, "the new budget in yen")
	f.Int64Var(&add, "add-budget-yen", 0, "yen to add to the budget (negative cuts)")
	f.IntVar(&stripes, "stripes", 0, fmt.Sprintf("budget stripes to lay the budget out over, 1-%d", campaign.MaxStripes))
	f.StringVar(&starts, "starts", "", `new first instant coupons are issued, RFC 3339, or "open"`)
	f.StringVar(&ends, "ends", "", `new instant issuing stops, RFC 3339, exclusive, or "open"`)
	f.IntVar(&validDays, "coupon-valid-days", 0, "coupons issued from now valid until the end of the D-th Asia/Tokyo day from issue; 0 removes the validity")
	f.StringVar(&expires, "coupons-expire", "", "coupons issued from now valid until this instant, RFC 3339")
	f.StringArrayVar(&releases, "release", nil, "add a release of N more coupons at AT, as AT=N, AT in RFC 3339 (repeatable)")
	reasonFlag(c, &reason)
	return c
}

// budgetChange sets ch's budget from --budget-yen budget or --add-budget-yen add, whichever f
// says was given; both, or a figure out of its range, is a usage error.
func budgetChange(f *pflag.FlagSet, ch *campaign.Changes, budget, add int64) error {
	if f.Changed("budget-yen") && f.Changed("add-budget-yen") {
		return usageError{fmt.Errorf("give --budget-yen or --add-budget-yen, not both")}
	}
	if f.Changed("budget-yen") {
		if budget < 1 || budget > math.MaxInt32 {
			return flagError("--budget-yen %d: want 1 to %d yen", budget, math.MaxInt32)
		}
		ch.BudgetYen = &budget
	}
	if f.Changed("add-budget-yen") {
		if add < -math.MaxInt32 || add > math.MaxInt32 {
			return flagError("--add-budget-yen %d: want -%d to %d yen", add, math.MaxInt32, math.MaxInt32)
		}
		ch.AddBudgetYen = &add
	}
	return nil
}

// validityChange sets ch's validity from --coupon-valid-days validDays or --coupons-expire
// expires, whichever f says was given; both, or an expiry that is not RFC 3339, is a usage error.
func validityChange(f *pflag.FlagSet, ch *campaign.Changes, validDays int, expires string) error {
	days, expiry := f.Changed("coupon-valid-days"), f.Changed("coupons-expire")
	ch.SetValidity = days || expiry
	switch {
	case days && expiry:
		return usageError{fmt.Errorf("give --coupon-valid-days or --coupons-expire, not both")}
	case days:
		ch.ValidDays = validDays
	case expiry:
		var err error
		if ch.ExpireAt, err = parseTime("--coupons-expire", expires); err != nil || ch.ExpireAt == nil {
			return usageError{fmt.Errorf("--coupons-expire: give an RFC 3339 time such as 2026-12-31T23:59:59+09:00")}
		}
	}
	return nil
}

// update applies ch to campaign id ([campaign.Update]) unless it would leave the campaign's
// coupons expiring at or before its start ([checkExpiryMove]), and warns on w when they expire
// before its end.
func update(ctx context.Context, db campaign.Querier, w io.Writer, id string, ch campaign.Changes) ([]campaign.Change, error) {
	if err := checkExpiryMove(ctx, db, id, ch); err != nil {
		return nil, err
	}
	done, err := campaign.Update(ctx, db, id, ch)
	if err != nil {
		return done, err
	}
	if s, err := campaign.Show(ctx, db, id); err == nil {
		if warning, _ := expiryCheck(s.StartsAt, s.EndsAt, s.CouponsExpireAt); warning != "" {
			fmt.Fprintln(w, "warning:", warning)
		}
		if never := neverOpen(s); never > 0 {
			fmt.Fprintf(w, "warning: %d of campaign %s's releases to come are at or after its end or its coupons' expiry: they will never open\n", never, id)
		}
	}
	return done, nil
}

// neverOpen counts s's releases still to come that its period or its coupons' fixed expiry now
// shuts out: IssueCoupon never opens them nor names them as next_release_at (release_next,
// 00027_next_release.sql).
func neverOpen(s campaign.Status) int {
	n := 0
	for _, r := range s.Schedule {
		shut := (s.EndsAt != nil && !r.At.Before(*s.EndsAt)) || (s.CouponsExpireAt != nil && !r.At.Before(*s.CouponsExpireAt))
		if !r.Open && shut {
			n++
		}
	}
	return n
}

// expiryCheck is [campaign.CheckExpiry] as create and update call it: a variable, so that a test
// can swap in its broken variant (newuser_test.go).
var expiryCheck = campaign.CheckExpiry

// checkExpiryMove refuses (a usage error: exit 2) a change of campaign id after which its
// coupons would expire at or before its start ([campaign.CheckExpiry]), judged on the campaign
// as read just before the change.
func checkExpiryMove(ctx context.Context, db campaign.Querier, id string, ch campaign.Changes) error {
	if !ch.SetStarts && !ch.SetValidity {
		return nil
	}
	s, err := campaign.Show(ctx, db, id)
	if err != nil {
		return err
	}
	starts, expire := s.StartsAt, s.CouponsExpireAt
	if ch.SetStarts {
		starts = ch.StartsAt
	}
	if ch.SetValidity {
		expire = ch.ExpireAt
	}
	if _, err := expiryCheck(starts, nil, expire); err != nil {
		return usageError{fmt.Errorf("campaign %s: %w; nothing changed", id, err)}
	}
	return nil
}

// stateCmd is pause, resume or end: one change of the campaign's state.
func stateCmd(use, short, long string, change func(context.Context, campaign.Querier, string, string) (*campaign.Change, error)) *cobra.Command {
	var reason string
	c := &cobra.Command{
		Use:   use + " ID --reason TEXT",
		Short: short,
		Long:  long + changeHelp,
		Args:  oneCampaign,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runChange(cmd, args[0], func(ctx context.Context, db campaign.Querier) ([]campaign.Change, error) {
				ch, err := change(ctx, db, args[0], reason)
				if ch == nil {
					return nil, err
				}
				return []campaign.Change{*ch}, err
			})
		},
	}
	reasonFlag(c, &reason)
	return c
}

func campaignPauseCmd() *cobra.Command {
	return stateCmd("pause", "Pause a campaign: no coupon of it commits once this returns, until resume",
		`Pause a campaign now. Once the command has returned, no coupon of the campaign commits until
"campaign resume" has returned: IssueCoupon answers CAMPAIGN_NOT_ACTIVE with reason PAUSED, and
a member who holds the coupon still gets ALREADY_ISSUED with its id. This is how to stop a
runaway campaign in one command.`, campaign.Pause)
}

// checkChangeRanges refuses, as flag values (exit 2, with the usage), a --stripes outside 1 to
// campaign.MaxStripes and a --coupon-valid-days outside 0 to campaign.MaxValidDays, among the
// flags given in f.
func checkChangeRanges(f *pflag.FlagSet, stripes, validDays int) error {
	if f.Changed("stripes") && (stripes < 1 || stripes > campaign.MaxStripes) {
		return flagError("--stripes %d: want 1-%d", stripes, campaign.MaxStripes)
	}
	if f.Changed("coupon-valid-days") && (validDays < 0 || validDays > campaign.MaxValidDays) {
		return flagError("--coupon-valid-days %d: want 0-%d (0 removes the validity)", validDays, campaign.MaxValidDays)
	}
	return nil
}

// changeRanges is checkChangeRanges as the verbs call it: a variable, so that a test can swap in
// its broken variant (campaign_refusals_test.go).
var changeRanges = checkChangeRanges

func campaignResumeCmd() *cobra.Command {
	return stateCmd("resume", "Resume a paused campaign",
		`Resume a paused campaign: it issues again within its period and budget. An ended campaign
is refused (exit 1, nothing changed): resuming does not move its end; "campaign update --ends T"
does. The database judges it, under the campaign's lock.`, campaign.Resume)
}

func campaignEndCmd() *cobra.Command {
	return stateCmd("end", "End a campaign now: its end becomes this moment",
		`End a campaign now: its ends_at becomes the change's time, and once the command has
returned no coupon of it commits (CAMPAIGN_NOT_ACTIVE, reason ENDED). A campaign that has not
started is refused: pause it, or move its period with "campaign update --starts --ends".`, campaign.End)
}

// reasonFlag adds --reason, which every change needs: a missing one is a command line error
// (exit 2), checked before the database is touched.
func reasonFlag(c *cobra.Command, reason *string) {
	c.Flags().StringVar(reason, "reason", "", "why, for the campaign's history (required)")
	runE := c.RunE
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if strings.TrimSpace(*reason) == "" {
			return usageError{fmt.Errorf("%s needs --reason TEXT: why, for the campaign's history", cmd.CommandPath())}
		}
		return runE(cmd, args)
	}
}

// runChange opens the database, runs change on campaign id and prints what it changed, then the
// campaign as it now is.
func runChange(cmd *cobra.Command, id string, change func(context.Context, campaign.Querier) ([]campaign.Change, error)) error {
	ctx := cmd.Context()
	pool, closePool, err := openMigrated(ctx)
	if err != nil {
		return err
	}
	defer closePool()
	done, err := change(ctx, pool)
	if errors.Is(err, campaign.ErrNotFound) {
		return fmt.Errorf("%w (couponctl campaign list shows the campaigns)", err)
	}
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	if len(done) == 0 {
		fmt.Fprintf(w, "%s: nothing to change, it already is so\n", id)
	}
	for _, ch := range done {
		before, after := describe(ch)
		fmt.Fprintf(w, "%s: %s changed (change %d at %s by %s)\n  before  %s\n  after   %s\n",
			id, ch.What, ch.ID, ch.At.In(issuance.Tokyo).Format("2006-01-02T15:04:05.000Z07:00"), ch.By, before, after)
	}
	s, err := campaign.Show(ctx, pool, id)
	if err != nil {
		return err
	}
	writeCampaign(w, s)
	return nil
}

func campaignHistoryCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "history ID",
		Short: "Every change of a campaign, oldest first: when, who, what, before, after, why",
		Long: `Every change of a campaign, oldest first: when (Asia/Tokyo), who, what, the figures before
and after, why. Who is the database login; for a change made through the console, the person's
email first, then the login (the console's). A change that applied a console request names it
after its reason: its requester and both reasons are in campaign_change_requests
(docs/roles.md, "The console").`,
		Args: oneCampaign,
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			list, err := campaign.History(cmd.Context(), pool, args[0])
			if err != nil {
				return err
			}
			writeHistory(cmd.OutOrStdout(), args[0], list)
			return nil
		},
	}
}

func writeHistory(w io.Writer, id string, list []campaign.Change) {
	if len(list) == 0 {
		fmt.Fprintf(w, "%s: no changes since it was created\n", id)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "change\twhen (Asia/Tokyo)\twho\twhat\tbefore\tafter\treason")
	for _, c := range list {
		before, after := describe(c)
		who, reason := c.By, c.Reason
		if c.Person != "" {
			who = fmt.Sprintf("%s (%s)", c.Person, c.By)
		}
		if c.RequestID != 0 {
			reason = fmt.Sprintf("%s (request %d)", reason, c.RequestID)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.At.In(issuance.Tokyo).Format("2006-01-02 15:04:05.000"),
			who, c.What, before, after, reason)
	}
	_ = tw.Flush()
}

// describe writes a change's figures before and after it as key=value pairs in key order, times
// in Asia/Tokyo: for a budget or stripes change all of them (the issued yen they kept), otherwise
// those it changed; before, only the figures the change read. A change with nothing before it
// (a create, an audience change) has "-" before.
func describe(c campaign.Change) (before, after string) {
	keys := make([]string, 0, len(c.After))
	for k := range c.After {
		if c.What == "budget" || c.What == "stripes" || fmt.Sprint(c.Before[k]) != fmt.Sprint(c.After[k]) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if len(c.Before) == 0 {
		return "-", pairs(keys, c.After)
	}
	read := slices.DeleteFunc(slices.Clone(keys), func(k string) bool {
		_, ok := c.Before[k]
		return !ok
	})
	return pairs(read, c.Before), pairs(keys, c.After)
}

func pairs(keys []string, m map[string]any) string {
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		v := m[k]
		switch x := v.(type) {
		case nil:
			switch k {
			case "paused_at":
				v = "(not paused)"
			case "coupon_valid_days", "coupons_expire_at":
				v = "(none)"
			default:
				v = "(open)"
			}
		case string:
			if t, err := time.Parse(time.RFC3339Nano, x); err == nil {
				v = t.In(issuance.Tokyo).Format(time.RFC3339)
			}
		case float64:
			v = int64(x)
		case []any:
			v = releasesText(x)
		}
		parts = append(parts, fmt.Sprintf("%s=%v", k, v))
	}
	return strings.Join(parts, " ")
}

// releasesText summarizes the releases of a create's history row ([{"at": T, "coupons": N},
// ...], in time order): how many, their coupons, the first and the last at +09:00 (campaign show
// lists each); "none" for no release.
func releasesText(list []any) string {
	if len(list) == 0 {
		return "none"
	}
	coupons := 0
	at := make([]string, len(list))
	for i, r := range list {
		m, _ := r.(map[string]any)
		n, _ := m["coupons"].(float64)
		coupons += int(n)
		at[i] = fmt.Sprint(m["at"])
		if t, err := time.Parse(time.RFC3339Nano, at[i]); err == nil {
			at[i] = t.In(issuance.Tokyo).Format(time.RFC3339)
		}
	}
	if len(list) == 1 {
		return fmt.Sprintf("1 (%d coupons at %s)", coupons, at[0])
	}
	return fmt.Sprintf("%d (%d coupons, %s .. %s)", len(list), coupons, at[0], at[len(at)-1])
}

// parseBound is a period bound of campaign update: RFC 3339, or "open" for none.
func parseBound(flag, v string) (*time.Time, error) {
	if v == "open" {
		return nil, nil
	}
	if v == "" {
		return nil, fmt.Errorf(`%s: give an RFC 3339 time such as 2026-09-19T00:00:00+09:00, or "open"`, flag)
	}
	return parseTime(flag, v)
}

// nameChange sets ch's name from --name when it was given, refusing one campaign_name_set would
// refuse (exit 2).
func nameChange(f *pflag.FlagSet, ch *campaign.Changes, name string) error {
	if !f.Changed("name") {
		return nil
	}
	if err := campaign.CheckName(name); err != nil {
		return usageError{fmt.Errorf("--name: %w", err)}
	}
	ch.Name = &name
	return nil
}
