package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/shared/ids"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox"
)

func couponCmd() *cobra.Command {
	return groupCmd("coupon", "Void an issued coupon, or show one", couponVoidCmd(), couponShowCmd())
}

func couponVoidCmd() *cobra.Command {
	var (
		reason, file    string
		reissue, dryRun bool
	)
	c := &cobra.Command{
		Use:   "void COUPON_ID --reason TEXT [--allow-reissue] [--dry-run] | void --file F --reason TEXT [--allow-reissue] [--dry-run]",
		Short: "Void coupons: their yen go back to the campaign's budget and the member's month, exactly once",
		Long: `Void a live coupon, or each coupon of --file (one coupon id a line; blank lines and lines
starting with "# " are skipped; a coupon listed twice is voided once), each in one transaction
run as a user in coupon_admin (docs/roles.md):

  - the coupon is marked voided, with the time, the database login and --reason;
  - its yen go back to its campaign's budget (a budget stripe holding that much) and to its
    member's month, in IssueCoupon's lock order, so a void never deadlocks with an issuance;
  - two voids of one coupon at once give its yen back once: the second is refused;
  - a push not sent yet is never sent (RelayOutbox skips voided coupons); one already sent, or
    in flight at that moment, is said so;
  - IssueCoupon answers the member's pair COUPON_VOIDED from then on; with --allow-reissue the
    member may be issued the campaign again, under R1-R3.

A coupon voided without --allow-reissue can be corrected: void it again with --allow-reissue
and a --reason; that releases the member's pair (IssueCoupon and grant may issue the campaign
again), records who, when and why in the coupon's history, and changes no counter (its yen went
back at the first void).

A coupon already voided with the same --reason (an earlier run of the same command) counts as
done. One voided for another reason, or a redeemed legacy coupon (tied to an order), is refused
and left as it is. --dry-run says what each void would do and changes nothing. Voids go to
stdout; refusals and failures to stderr. Exits 1 if any coupon was refused or failed, after
trying every one.`,
		Example: `  couponctl coupon void 0b8f6b1e-3c52-4a0c-9d0e-6a7f2f1d9c41 --reason "issued to the wrong account (CS-2231)"
  couponctl coupon void --file ring.txt --reason "fake accounts (FRAUD-77)" --dry-run
  couponctl coupon void 0b8f6b1e-3c52-4a0c-9d0e-6a7f2f1d9c41 --allow-reissue --reason "CS-2231: the member may have it again"`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case file == "" && len(args) != 1:
				return fmt.Errorf("%s needs one coupon id, or --file F", cmd.CommandPath())
			case file != "" && len(args) > 0:
				return fmt.Errorf("give a coupon id or --file, not both")
			case len(args) == 1:
				return coupon.CheckID(args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return usageError{fmt.Errorf("%s needs --reason TEXT: why, for the coupon's record", cmd.CommandPath())}
			}
			list := args
			if file != "" {
				var err error
				if list, err = readIDs(file, coupon.CheckID, cmd.ErrOrStderr()); err != nil {
					return fileError{fmt.Errorf("%s: --file: %w; nothing was voided", cmd.CommandPath(), err)}
				}
				list = dedupeIDs(cmd.ErrOrStderr(), "coupons listed more than once, voided once each", list)
			}
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			v := voider{out: cmd.OutOrStdout(), errs: cmd.ErrOrStderr(), db: pool, reason: reason, reissue: reissue}
			if dryRun {
				return v.dryRun(cmd.Context(), list)
			}
			return v.all(cmd.Context(), list)
		},
	}
	c.Flags().StringVar(&reason, "reason", "", "why, for the coupon's record (required)")
	c.Flags().StringVar(&file, "file", "", "a file of coupon ids, one a line")
	c.Flags().BoolVar(&reissue, "allow-reissue", false, "let the member be issued the campaign again (also on a coupon voided without it)")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "say what each void would do; change nothing")
	return c
}

// voider voids coupons for one command line: voids to out, refusals and failures to errs.
type voider struct {
	out, errs io.Writer
	db        coupon.Querier
	reason    string
	reissue   bool
}

// voidOutageStreak is how many voids in a row may fail (not a refusal: an error) before a void
// file stops: the relay's breaker threshold, as grant's. A variable, so that a test can take the
// stop away (its broken variant).
var voidOutageStreak = outbox.DefaultBreakerFailures

// all voids each of ids and prints what each void did; it returns errViolations if any was
// refused or failed. After voidOutageStreak failures in a row it stops, saying how many were done
// and not sent.
func (v voider) all(ctx context.Context, ids []string) error {
	var voided, earlier, refused, streak int
	var mu sync.Mutex // guards the counts and v.errs, which the progress shares
	if len(ids) > 1 {
		stop := v.progress(func() {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(v.errs, "coupon void: %d/%d done, %d refused or failed\n", voided+earlier, len(ids), refused)
		})
		defer stop()
	}
	for i, id := range ids {
		done, err := coupon.Void(ctx, v.db, id, v.reason, v.reissue)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var before *coupon.Coupon
		if err != nil {
			before = voidDoneBefore(v, ctx, id, err)
		}
		mu.Lock()
		switch {
		case before != nil:
			earlier++
			streak = 0
			fmt.Fprintf(v.out, "%s: voided already by an earlier run, at %s by %s, for the same reason: done\n",
				id, tokyoTime(before.VoidedAt), orLegacy(before.VoidedBy))
		case errors.Is(err, coupon.ErrRefused), errors.Is(err, coupon.ErrNotFound):
			refused++
			streak = 0
			voidRefused(v, id, err)
		case err != nil:
			refused++
			streak++
			fmt.Fprintf(v.errs, "couponctl: %s: failed: %s\n", id, refusalTimes(err.Error()))
		default:
			voided++
			streak = 0
			v.printVoid(id, done)
		}
		mu.Unlock()
		if streak >= voidOutageStreak {
			fmt.Fprintf(v.errs, "couponctl: coupon void: stopped: database unreachable: %d voids in a row failed: %d done, %d not sent; "+
				"run the same command again (the coupons already voided count as done)\n", streak, voided+earlier, len(ids)-i-1)
			return errViolations
		}
	}
	if len(ids) > 1 {
		fmt.Fprintf(v.out, "voided %d of %d coupons; %d voided by an earlier run; %d refused or failed\n", voided, len(ids), earlier, refused)
	}
	if refused > 0 {
		return errViolations
	}
	return nil
}

// printVoid says what the void of coupon id did.
func (v voider) printVoid(id string, done coupon.Voided) {
	if done.Released {
		fmt.Fprintf(v.out, "%s: voided at %s by %s; reissue now allowed (change at %s by %s): %s may be issued %s again; no counter changed\n",
			id, tokyoTime(done.VoidedAt), orLegacy(done.VoidedBy), tokyoTime(done.At), done.By, done.MemberID, done.CampaignID)
		return
	}
	fmt.Fprintf(v.out, "%s: voided at %s by %s: %d yen back to %s's budget and to %s's %s; push %s\n",
		id, tokyoTime(done.At), done.By, done.AmountYen, done.CampaignID, done.MemberID, done.Month, pushNote(done))
}

// progress calls report every progressEvery (progressTicks), failing or not, until the returned
// stop is called.
func (v voider) progress(report func()) (stop func()) {
	ticks, stopTicks := progressTicks()
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-quit:
				return
			case <-ticks:
				report()
			}
		}
	}()
	return func() { stopTicks(); close(quit); <-finished }
}

// votedBefore returns coupon id as it is when err refused it because the state this command
// asks for holds already, else nil: voided with this --reason (and reissue allowed, if asked),
// or, with --allow-reissue, a void corrected to allow reissue with this --reason (its history
// row): an earlier run of the same command, whose work is done.
func (v voider) votedBefore(ctx context.Context, id string, err error) *coupon.Coupon {
	if !errors.Is(err, coupon.ErrRefused) {
		return nil
	}
	c, err := coupon.Show(ctx, v.db, id)
	if err != nil || !v.doneAlready(ctx, c) {
		return nil
	}
	return &c
}

// doneAlready reports whether coupon c is as this run would leave it, by an earlier run of the
// same void (its reason) or of the same correction (a coupon_changes row with its reason).
func (v voider) doneAlready(ctx context.Context, c coupon.Coupon) bool {
	switch {
	case c.VoidedAt == nil:
		return false
	case c.VoidReason == v.reason && (c.ReissueAllowed || !v.reissue):
		return true
	case v.reissue && c.ReissueAllowed:
		corrected, err := coupon.CorrectedFor(ctx, v.db, c.ID, v.reason)
		return err == nil && corrected
	}
	return false
}

// voidRefused prints the refusal err of coupon id's void: on stderr, once, as couponctl prints
// every error. A variable, so that a test can swap in its broken variant (void_test.go).
var voidRefused = func(v voider, id string, err error) {
	fmt.Fprintf(v.errs, "couponctl: %s: %s\n", id, refusalTimes(err.Error()))
}

// voidDoneBefore is [voider.votedBefore] as a void file calls it: a variable, so that a test can
// swap in its broken variant (void_test.go).
var voidDoneBefore = voider.votedBefore

// dryRun says what voiding each of ids would do, from the coupon as it is now; it changes
// nothing.
func (v voider) dryRun(ctx context.Context, ids []string) error {
	var would, release, refused int
	for _, id := range ids {
		c, err := coupon.Show(ctx, v.db, id)
		switch {
		case err != nil:
			refused++
			fmt.Fprintf(v.errs, "couponctl: %s: would be refused: %s\n", id, refusalTimes(err.Error()))
		case v.doneAlready(ctx, c):
			fmt.Fprintf(v.out, "%s: voided already by an earlier run (%s): done\n", id, tokyoTime(c.VoidedAt))
		case c.VoidedAt != nil && v.reissue && !c.ReissueAllowed:
			release++
			fmt.Fprintf(v.out, "%s: voided already, at %s by %s: would release its pair for reissue: %s may be issued %s again; no counter changes\n",
				id, tokyoTime(c.VoidedAt), orLegacy(c.VoidedBy), c.MemberID, c.CampaignID)
		case c.VoidedAt != nil:
			refused++
			fmt.Fprintf(v.errs, "couponctl: %s: would be refused: voided already, at %s by %s\n", id, tokyoTime(c.VoidedAt), c.VoidedBy)
		case c.RedeemedAt != nil:
			refused++
			fmt.Fprintf(v.errs, "couponctl: %s: would be refused: redeemed, tied to an order (coupon show has its history)\n", id)
		default:
			would++
			fmt.Fprintf(v.out, "%s: would void: %d yen back to %s's budget and to %s's %s; push now %s\n",
				id, c.AmountYen, c.CampaignID, c.MemberID, c.Month, c.Push)
		}
	}
	v.dryRunSummary(len(ids), would, release, refused)
	return nil
}

// dryRunSummary is the dry run's last line: of total coupons, how many would be voided, would
// have their pair released (a correction, with --allow-reissue) and would be refused.
func (v voider) dryRunSummary(total, would, release, refused int) {
	released := ""
	if v.reissue {
		released = fmt.Sprintf(", %d would have its pair released for reissue", release)
	}
	fmt.Fprintf(v.out, "dry run: %d of %d coupons would be voided%s, %d refused; nothing changed\n", would, total, released, refused)
}

// pushNote says what a void means for the coupon's LINE push.
func pushNote(v coupon.Voided) string {
	switch v.Push {
	case "sent":
		return "already sent at " + v.PushedAt.In(issuance.Tokyo).Format(time.RFC3339) + " (the member has the message)"
	case "in flight":
		return "in flight: a relay run holds it and may be pushing it now"
	case "not sent":
		return "not sent yet: it never will be"
	}
	return v.Push
}

// dedupeIDs drops the repeats of list, keeping the first of each, and notes on w how many it
// dropped, saying what.
func dedupeIDs(w io.Writer, what string, list []string) []string {
	seen := make(map[string]bool, len(list))
	out := list[:0:0]
	for _, id := range list {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	if n := len(list) - len(out); n > 0 {
		fmt.Fprintf(w, "%s: %d\n", what, n)
	}
	return out
}

func couponShowCmd() *cobra.Command {
	var member, campaignID string
	c := &cobra.Command{
		Use:   "show COUPON_ID | show --member M [--campaign C]",
		Short: "Show a coupon (campaign, amount, month, issued at, expires at, its push, its void), or a member's coupons",
		Long: `Show one coupon by its id, or, with --member, every coupon of member M (of campaign C with
--campaign), voided and redeemed ones included, oldest first: its id, campaign, state (live,
voided, voided with reissue allowed, redeemed), amount, month, issue time and push. A member
without coupons is not an error: it says so. A --campaign that does not exist is (exit 1).`,
		Example: `  couponctl coupon show 0b8f6b1e-3c52-4a0c-9d0e-6a7f2f1d9c41
  couponctl coupon show --member m0000101 --campaign XMAS-2026`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case member != "" && len(args) > 0:
				return fmt.Errorf("give a coupon id or --member, not both")
			case member != "":
				if err := ids.Member(member); err != nil {
					return fmt.Errorf("--member: %w", err)
				}
				if campaignID != "" {
					if err := ids.Campaign(campaignID); err != nil {
						return fmt.Errorf("--campaign: %w", err)
					}
				}
				return nil
			case campaignID != "":
				return fmt.Errorf("--campaign lists a member's coupons: give --member M too")
			case len(args) != 1:
				return fmt.Errorf("%s needs one coupon id, or --member M", cmd.CommandPath())
			}
			return coupon.CheckID(args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			if member != "" {
				return showMember(cmd, pool, member, campaignID)
			}
			return showCoupon(cmd, pool, args[0])
		},
	}
	c.Flags().StringVar(&member, "member", "", "list this member's coupons")
	c.Flags().StringVar(&campaignID, "campaign", "", "with --member: only this campaign's")
	return c
}

// showCoupon prints coupon id and its redemption history.
func showCoupon(cmd *cobra.Command, pool *pgxpool.Pool, id string) error {
	c, err := coupon.Show(cmd.Context(), pool, id)
	if err != nil {
		return err
	}
	history, err := coupon.Redemptions(cmd.Context(), pool, c.ID)
	if err != nil {
		return err
	}
	writeCoupon(cmd.OutOrStdout(), c, history)
	return nil
}

// memberCoupons is [coupon.ForMember] as coupon show --member calls it: a variable, so that a
// test can swap in its broken variants (coupon_show_test.go).
var memberCoupons = coupon.ForMember

// showMember prints member's coupons of campaignID (of every campaign when it is ""). A member
// without coupons is not an error; a campaign that does not exist is.
func showMember(cmd *cobra.Command, pool *pgxpool.Pool, member, campaignID string) error {
	if campaignID != "" {
		_, err := campaign.Show(cmd.Context(), pool, campaignID)
		if errors.Is(err, campaign.ErrNotFound) {
			return fmt.Errorf("campaign %s does not exist (couponctl campaign list shows the campaigns)", campaignID)
		}
		if err != nil {
			return err
		}
	}
	list, err := memberCoupons(cmd.Context(), pool, member, campaignID)
	if err != nil {
		return err
	}
	writeMemberCoupons(cmd.OutOrStdout(), member, campaignID, list)
	return nil
}

// couponState is a coupon's state at now as show prints it: voided, redeemed, expired (at or
// after its expires_at: it is no longer valid, and the relay never pushes it), else live.
func couponState(c coupon.Coupon) string {
	switch {
	case c.VoidedAt != nil && c.ReissueAllowed:
		return "voided (reissue allowed)"
	case c.VoidedAt != nil:
		return "voided"
	case c.RedeemedAt != nil:
		return "redeemed"
	case c.Expired:
		return "expired"
	}
	return "live"
}

// writeMemberCoupons prints member's coupons, one a line.
func writeMemberCoupons(w io.Writer, member, campaignID string, list []coupon.Coupon) {
	if len(list) == 0 {
		of := ""
		if campaignID != "" {
			of = " of campaign " + campaignID
		}
		fmt.Fprintf(w, "member %s has no coupons%s\n", member, of)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "COUPON_ID\tCAMPAIGN\tSTATE\tYEN\tMONTH\tISSUED_AT\tPUSH")
	for _, c := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", c.ID, c.CampaignID, couponState(c), c.AmountYen, c.Month,
			tokyoTime(&c.IssuedAt), c.Push)
	}
	_ = tw.Flush()
}

// writeCoupon prints coupon c, and under it its redemption history, oldest first.
func writeCoupon(w io.Writer, c coupon.Coupon, history []coupon.Redemption) {
	at := func(t *time.Time) string {
		if t == nil {
			return "(none)"
		}
		return t.In(issuance.Tokyo).Format(time.RFC3339)
	}
	state := couponState(c)
	fmt.Fprintf(w, "coupon      %s\nstate       %s\ncampaign    %s\nmember      %s\namount      %d yen\nmonth       %s\n",
		c.ID, state, c.CampaignID, c.MemberID, c.AmountYen, c.Month)
	fmt.Fprintf(w, "issued at   %s\nexpires at  %s\n", c.IssuedAt.In(issuance.Tokyo).Format(time.RFC3339), at(c.ExpiresAt))
	if c.GrantedBy != "" {
		fmt.Fprintf(w, "granted by  %s\n", c.GrantedBy)
	}
	push := c.Push
	if c.PushAt != nil {
		push += " at " + at(c.PushAt)
	}
	switch {
	case c.PushNote != "" && c.Push != "sent":
		push += " (" + c.PushNote + ")"
	case c.VoidedAt != nil && c.Push == "open":
		push += " (voided first: the relay skips it, it is never pushed)"
	}
	fmt.Fprintf(w, "push        %s\n", push)
	if c.VoidedAt != nil {
		by := c.VoidedBy
		if by == "" {
			by = "the legacy migration (a duplicate)"
		}
		fmt.Fprintf(w, "voided      %s by %s: %s\nreissue     %v\n", at(c.VoidedAt), by, c.VoidReason, c.ReissueAllowed)
	}
	writeRedemptions(w, history)
}

// writeRedemptions prints a coupon's redemption history under its other lines, oldest first, one
// line a redeem or rollback: when, the order, who, and a rollback's reason.
func writeRedemptions(w io.Writer, history []coupon.Redemption) {
	for i, h := range history {
		label := ""
		if i == 0 {
			label = "redemptions"
		}
		order := "order " + h.OrderID
		if h.OrderID == "" {
			order = "before the migration (order unknown)"
		}
		line := fmt.Sprintf("%-11s %s %-8s %s by %s", label, h.At.In(issuance.Tokyo).Format(time.RFC3339), h.Action, order, h.By)
		if h.Reason != "" {
			line += ": " + h.Reason
		}
		fmt.Fprintln(w, line)
	}
}

// orLegacy names the voider of a coupon voided by no login: the legacy migration.
func orLegacy(by string) string {
	if by == "" {
		return "the legacy migration (a duplicate)"
	}
	return by
}
