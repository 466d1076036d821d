package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/consolerole"
	"github.com/mops/coupon-api/shared/issuance"
)

// consoleGrantCmd and consoleRolesCmd are `couponctl console`'s sub-verbs: who may do what in
// the console, kept in the database.
func consoleGrantCmd() *cobra.Command {
	var email, role, reason string
	c := &cobra.Command{
		Use:   "grant --email E --role viewer|operator|approver --reason TEXT",
		Short: "Give a person a console role (viewer, operator, approver), with its history",
		Long: `Give the person with Google account E a console role, in one transaction that writes its
history row with --reason and the database login (couponctl console roles):

  viewer    reads every page (the role of an email never granted one)
  operator  also pauses, resumes and ends campaigns, changes budgets and stripes, asks for
            raises above the approval line and for period moves, and voids coupons
  approver  also approves or rejects another person's request (never their own)

The console takes the person's email from the IAP assertion it verified; the database checks
the role on every change (docs/roles.md, "The console"). The email is kept in lower case; a
malformed one is refused. Granting the role an email has already changes nothing. Runs as a
user in coupon_admin. Exit 2 for an unknown role or a missing reason, before the database is
touched.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := consolerole.ParseRole(role)
			if err != nil {
				return usageError{err}
			}
			if strings.TrimSpace(reason) == "" {
				return flagError("%s needs --reason TEXT: why, for the roles' history", cmd.CommandPath())
			}
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			ch, changed, err := consolerole.Grant(cmd.Context(), pool, email, r, reason)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if !changed {
				fmt.Fprintf(w, "%s is already %s: nothing changed\n", strings.ToLower(strings.TrimSpace(email)), r)
				return nil
			}
			fmt.Fprintf(w, "%s: %s -> %s (change %d at %s by %s)\n", ch.Email, ch.Before, ch.After, ch.ID,
				ch.At.In(issuance.Tokyo).Format("2006-01-02T15:04:05.000Z07:00"), ch.By)
			return nil
		},
	}
	c.Flags().StringVar(&email, "email", "", "the person's Google account, as IAP names it (required)")
	c.Flags().StringVar(&role, "role", "", "viewer, operator or approver (required)")
	c.Flags().StringVar(&reason, "reason", "", "why, for the roles' history (required)")
	for _, f := range []string{"email", "role", "reason"} {
		_ = c.MarkFlagRequired(f)
	}
	return c
}

func consoleRolesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "roles",
		Short: "Who holds which console role, and every change of them, oldest first",
		Long: `List the emails that hold a console role (any other email is a viewer), then the roles'
history: when (Asia/Tokyo), who (the database login), the email, before, after, why.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			holders, changes, err := consolerole.List(cmd.Context(), pool)
			if err != nil {
				return err
			}
			writeConsoleRoles(cmd.OutOrStdout(), holders, changes)
			return nil
		},
	}
}

func writeConsoleRoles(w io.Writer, holders []consolerole.Holder, changes []consolerole.Change) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "email\trole\tsince (Asia/Tokyo)\tgranted by")
	for _, h := range holders {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.Email, h.Role, inTokyo(h.ChangedAt), h.ChangedBy)
	}
	if len(holders) == 0 {
		fmt.Fprintln(tw, "(none: every email is a viewer)\t\t\t")
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "change\twhen (Asia/Tokyo)\twho\temail\tbefore\tafter\treason")
	for _, c := range changes {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, inTokyo(c.At), c.By, c.Email, c.Before, c.After, c.Reason)
	}
	_ = tw.Flush()
}
