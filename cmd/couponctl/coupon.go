package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/coupon"
	"github.com/mops/coupon-api/shared/issuance"
)

func couponCmd() *cobra.Command {
	return groupCmd("coupon", "Void an issued coupon, or show one", couponVoidCmd(), couponShowCmd())
}

func couponVoidCmd() *cobra.Command {
	var (
		reason, file string
		reissue      bool
	)
	c := &cobra.Command{
		Use:   "void COUPON_ID --reason TEXT [--allow-reissue] | void --file F --reason TEXT [--allow-reissue]",
		Short: "Void coupons: their yen go back to the campaign's budget and the member's month, exactly once",
		Long: `Void a live coupon, or each coupon of --file (one coupon id a line; blank lines and lines
starting with # are skipped), each in one transaction run as a user in coupon_admin (docs/roles.md):

  - the coupon is marked voided, with the time, the database login and --reason;
  - its yen go back to its campaign's budget (a budget stripe holding that much) and to its
    member's month, in IssueCoupon's lock order, so a void never deadlocks with an issuance;
  - two voids of one coupon at once give its yen back once: the second is refused;
  - a push not sent yet is never sent (RelayOutbox skips voided coupons); one already sent, or
    in flight at that moment, is said so;
  - IssueCoupon answers the member's pair COUPON_VOIDED from then on; with --allow-reissue the
    member may be issued the campaign again, under R1-R3.

A coupon already voided, or a redeemed legacy coupon (tied to an order), is refused and left as it
is. Exits 1 if any coupon was refused or failed, after trying every one.`,
		Example: `  couponctl coupon void 0b8f6b1e-3c52-4a0c-9d0e-6a7f2f1d9c41 --reason "issued to the wrong account (CS-2231)"
  couponctl coupon void --file ring.txt --reason "fake accounts (FRAUD-77)"`,
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
			ids := args
			if file != "" {
				var err error
				if ids, err = readIDs(file, coupon.CheckID); err != nil {
					return err
				}
			}
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			return voidAll(cmd.Context(), cmd.OutOrStdout(), pool, ids, reason, reissue)
		},
	}
	c.Flags().StringVar(&reason, "reason", "", "why, for the coupon's record (required)")
	c.Flags().StringVar(&file, "file", "", "a file of coupon ids, one a line")
	c.Flags().BoolVar(&reissue, "allow-reissue", false, "let the member be issued the campaign again")
	return c
}

// voidAll voids each of ids and prints what each void did; it returns errViolations if any was
// refused or failed.
func voidAll(ctx context.Context, w io.Writer, db coupon.Querier, ids []string, reason string, reissue bool) error {
	var voided, refused int
	for _, id := range ids {
		v, err := coupon.Void(ctx, db, id, reason, reissue)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, coupon.ErrRefused), errors.Is(err, coupon.ErrNotFound):
			refused++
			fmt.Fprintf(w, "%s: refused: %v\n", id, err)
			continue
		case err != nil:
			refused++
			fmt.Fprintf(w, "%s: failed: %v\n", id, err)
			continue
		}
		voided++
		fmt.Fprintf(w, "%s: voided at %s by %s: %d yen back to %s's budget and to %s's %s; push %s\n",
			id, v.At.In(issuance.Tokyo).Format(time.RFC3339), v.By, v.AmountYen, v.CampaignID, v.MemberID, v.Month, pushNote(v))
	}
	if len(ids) > 1 {
		fmt.Fprintf(w, "voided %d of %d coupons; %d refused or failed\n", voided, len(ids), refused)
	}
	if refused > 0 {
		return errViolations
	}
	return nil
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

// readIDs reads one id a line from path, skipping blank lines and # comments, and checks each
// with check; it names the first bad line.
func readIDs(path string, check func(string) error) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ids []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := check(line); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		ids = append(ids, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%s: no ids in it", path)
	}
	return ids, nil
}

func couponShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show COUPON_ID",
		Short: "Show a coupon: campaign, amount, month, issued at, expires at, its push, its void",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("%s needs one coupon id", cmd.CommandPath())
			}
			return coupon.CheckID(args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			c, err := coupon.Show(cmd.Context(), pool, args[0])
			if err != nil {
				return err
			}
			writeCoupon(cmd.OutOrStdout(), c)
			return nil
		},
	}
}

func writeCoupon(w io.Writer, c coupon.Coupon) {
	at := func(t *time.Time) string {
		if t == nil {
			return "(none)"
		}
		return t.In(issuance.Tokyo).Format(time.RFC3339)
	}
	state := "live"
	switch {
	case c.VoidedAt != nil:
		state = "voided"
	case c.RedeemedAt != nil:
		state = "redeemed"
	}
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
}
