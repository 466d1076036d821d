package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/outbox"
)

func outboxCmd() *cobra.Command {
	return groupCmd("outbox", "See the notification outbox and requeue its dead letters (parked rows)",
		outboxStatusCmd(), outboxRequeueCmd())
}

func outboxStatusCmd() *cobra.Command {
	var limit int
	c := &cobra.Command{
		Use:   "status",
		Short: "Count outbox rows by state and list the parked ones with their reasons",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 {
				return fmt.Errorf("--limit %d: list at least 1 parked row", limit)
			}
			pool, closePool, err := db.OpenFromEnv(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			s, err := outbox.Status(cmd.Context(), pool, limit)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "sent       %d\ndue        %d\nwaiting    %d (backing off after a failed push)\n"+
				"in flight  %d (claimed by a run)\nparked     %d\n", s.Sent, s.Due, s.Waiting, s.InFlight, s.Parked)
			if len(s.ParkedRows) == 0 {
				return nil
			}
			fmt.Fprintf(w, "\nparked rows (oldest first, at most %d):\n", limit)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "COUPON_ID\tMEMBER_ID\tATTEMPTS\tPARKED_AT\tLAST_ERROR")
			for _, p := range s.ParkedRows {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", p.CouponID, p.MemberID, p.Attempts,
					p.ParkedAt.Format(time.RFC3339), strings.ReplaceAll(p.LastError, "\n", " "))
			}
			return tw.Flush()
		},
	}
	c.Flags().IntVar(&limit, "limit", 50, "parked rows to list")
	return c
}

func outboxRequeueCmd() *cobra.Command {
	var all bool
	c := &cobra.Command{
		Use:   "requeue [--all | COUPON_ID...]",
		Short: "Put parked rows back for the next relay run, with a fresh attempt count",
		Long: `Put parked (dead-lettered) outbox rows back for the next RelayOutbox run. Their attempt
count starts again; last_error is kept. Requeue after fixing the cause (a member who unblocked
the account, an expired channel token): the push is re-sent with the same retry key, so LINE
cannot deliver a coupon twice.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return errors.New("give either --all or one or more coupon ids")
			}
			for _, id := range args {
				if _, err := uuid.Parse(id); err != nil {
					return fmt.Errorf("coupon id %q: not a UUID", id)
				}
			}
			pool, closePool, err := db.OpenFromEnv(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			ids, err := outbox.Requeue(cmd.Context(), pool, all, args)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "requeued %d parked rows\n", len(ids))
			for _, id := range ids {
				fmt.Fprintln(cmd.OutOrStdout(), "  "+id)
			}
			if skipped := len(args) - len(ids); !all && skipped > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "%d of the given coupons were not parked; left alone\n", skipped)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&all, "all", false, "requeue every parked row")
	return c
}
