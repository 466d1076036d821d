package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/opsverbs"
	"github.com/mops/coupon-api/internal/ops/outboxadmin"
	"github.com/mops/coupon-api/shared/outbox"
)

func outboxCmd() *cobra.Command {
	return groupCmd("outbox", "See the notification outbox, requeue its dead letters and skipped rows, prune old rows",
		outboxStatusCmd(), outboxRequeueCmd(), opsverbs.OutboxPrune())
}

func outboxStatusCmd() *cobra.Command {
	var limit int
	c := &cobra.Command{
		Use:   "status",
		Short: "Count outbox rows by state and list the parked ones with their reasons",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 {
				return flagError("--limit %d: list at least 1 parked row", limit)
			}
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			s, err := outboxadmin.ReadStatus(cmd.Context(), pool, limit)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "sent       %d\nskipped    %d (never pushed)\n"+
				"  no LINE account  %d (couponctl line link, then outbox requeue)\n  voided           %d\n  redeemed         %d\n  expired          %d\n"+
				"due        %d\nwaiting    %d (backing off after a failed push)\nin flight  %d (claimed by a run)\nparked     %d\n",
				s.Sent, s.Skipped, s.SkippedNoLINEAccount, s.SkippedVoided, s.SkippedRedeemed, s.SkippedExpired, s.Due, s.Waiting, s.InFlight, s.Parked)
			if len(s.ParkedRows) == 0 {
				return nil
			}
			fmt.Fprintf(w, "\nparked rows (oldest first, at most %d):\n", limit)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "COUPON_ID\tMEMBER_ID\tATTEMPTS\tPARKED_AT\tLAST_ERROR")
			for _, p := range s.ParkedRows {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", p.CouponID, p.MemberID, p.Attempts,
					tokyoTime(&p.ParkedAt), strings.ReplaceAll(p.LastError, "\n", " "))
			}
			return tw.Flush()
		},
	}
	c.Flags().IntVar(&limit, "limit", 50, "parked rows to list")
	return c
}

func outboxRequeueCmd() *cobra.Command {
	var all, force bool
	c := &cobra.Command{
		Use:   "requeue [--force] [--all | COUPON_ID...]",
		Short: "Put parked and skipped rows back for the next relay run, with a fresh attempt count",
		Long: `Put parked (dead-lettered) and skipped outbox rows back for the next RelayOutbox run. Their
attempt count starts again; last_error is kept. Requeue after fixing the cause: a member who
unblocked the account, a LINE outage that outlasted the attempts, or (for a skipped row) a
member who has since linked a LINE account (couponctl line link); a skipped row whose member is
still unlinked is left as it is. A coupon that does not exist, or whose row outbox prune
deleted, is named on stderr and makes the verb exit 1. (A refused channel token parks nothing:
the relay gives the rows back and stops until the token is renewed.)

The push is re-sent with the same X-Line-Retry-Key, and LINE answers 409 instead of delivering
again, but only for 24 hours after the key's first use (LINE Messaging API, "Retry failed API
requests"). A row first pushed more than 23 hours ago is therefore refused: LINE may have
delivered it already, and a re-send could reach the member twice. --force requeues it anyway,
as a new push.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requeueArgs(all, args); err != nil {
				return err
			}
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			res, err := outboxadmin.Requeue(cmd.Context(), pool, outboxadmin.RequeueRequest{All: all, CouponIDs: args, Force: force})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			writeRequeued(w, res)
			missing := 0
			if n := len(args) - len(res.Requeued) - len(res.Unlinked) - len(res.KeyExpired); !all && n > 0 {
				if missing, err = nameMissing(cmd, pool, args); err != nil {
					return err
				}
				if n -= missing; n > 0 {
					fmt.Fprintf(w, "%d of the given coupons were neither parked nor skipped; left alone\n", n)
				}
			}
			if len(res.KeyExpired) > 0 {
				return refuseKeyExpired(w, res.KeyExpired)
			}
			if missing > 0 {
				return errViolations // each named above
			}
			return nil
		},
	}
	c.Flags().BoolVar(&all, "all", false, "requeue every parked and skipped row")
	c.Flags().BoolVar(&force, "force", false, "also requeue rows whose retry key has expired (the member may get the message twice)")
	return c
}

// requeueArgs refuses (a usage error: exit 2) requeue's arguments unless they are --all alone
// or one or more coupon ids, each a UUID.
func requeueArgs(all bool, args []string) error {
	if all == (len(args) > 0) {
		return flagError("give either --all or one or more coupon ids")
	}
	for _, id := range args {
		if _, err := uuid.Parse(id); err != nil {
			return flagError("coupon id %q: not a UUID", id)
		}
	}
	return nil
}

// writeRequeued writes on w the rows res requeued and those it left for want of a LINE account.
func writeRequeued(w io.Writer, res outboxadmin.RequeueResult) {
	fmt.Fprintf(w, "requeued %d rows\n", len(res.Requeued))
	for _, id := range res.Requeued {
		fmt.Fprintln(w, "  "+id)
	}
	if len(res.Unlinked) > 0 {
		fmt.Fprintf(w, "left %d rows whose member has no LINE account linked (couponctl line link first):\n", len(res.Unlinked))
		for _, id := range res.Unlinked {
			fmt.Fprintln(w, "  "+id)
		}
	}
}

// refuseKeyExpired names on w the coupons ids whose retry key expired, which requeue refused,
// and returns the error that makes the verb exit 1.
func refuseKeyExpired(w io.Writer, ids []string) error {
	fmt.Fprintf(w, "REFUSED %d rows first pushed more than %s ago: LINE no longer knows their retry key, so "+
		"a re-send may deliver the coupon twice; use --force to send them anyway:\n", len(ids), outbox.RetryKeyWindow)
	for _, id := range ids {
		fmt.Fprintln(w, "  "+id)
	}
	return fmt.Errorf("%d rows refused (retry key expired)", len(ids))
}

// nameMissing names on stderr the coupons of ids that have no outbox row to requeue: those whose
// row outbox prune deleted, and those that do not exist. It returns how many it named.
func nameMissing(cmd *cobra.Command, pool *pgxpool.Pool, ids []string) (int, error) {
	pruned, err := prunedRows(cmd.Context(), pool, ids)
	if err != nil {
		return 0, err
	}
	for _, p := range pruned {
		fmt.Fprintf(cmd.ErrOrStderr(), "couponctl: %s: its outbox row was pruned at %s (outbox prune deletes rows "+
			"sent or skipped before the retention): it cannot be requeued; coupon show %s says how it ended\n",
			p.id, tokyoTime(&p.at), p.id)
	}
	unknown, err := couponsUnknown(cmd.Context(), pool, ids)
	if err != nil {
		return 0, err
	}
	for _, id := range unknown {
		fmt.Fprintf(cmd.ErrOrStderr(), "couponctl: %s: no such coupon (coupon show --member M lists a member's coupons)\n", id)
	}
	return len(pruned) + len(unknown), nil
}

// prunedRow is a coupon whose outbox row "outbox prune" deleted, and when.
type prunedRow struct {
	id string
	at time.Time
}

// prunedRows is prunedOf as requeue calls it: a variable, so that a test can swap in its broken
// variant (prune_test.go).
var prunedRows = prunedOf

// prunedOf returns the coupons of ids whose outbox row was pruned, in ids' order.
func prunedOf(ctx context.Context, q *pgxpool.Pool, ids []string) ([]prunedRow, error) {
	rows, err := q.Query(ctx, `
SELECT c.coupon_id::text, coalesce(p.pruned_at, c.outbox_pruned_at) FROM unnest($1::uuid[]) WITH ORDINALITY AS g(id, n)
  JOIN issued_coupons c ON c.coupon_id = g.id
  LEFT JOIN outbox_pruned p ON p.issued_at = c.issued_at AND p.coupon_id = c.coupon_id
 WHERE (p.coupon_id IS NOT NULL OR c.outbox_pruned_at IS NOT NULL)
   AND NOT EXISTS (SELECT FROM notification_outbox o WHERE o.coupon_id = g.id)
 ORDER BY g.n`, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox requeue: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (p prunedRow, err error) {
		return p, r.Scan(&p.id, &p.at)
	})
}

// couponsUnknown is [unknownOf] as requeue calls it: a variable, so that a test can swap in its
// broken variant (newuser_test.go).
var couponsUnknown = unknownOf

// unknownOf returns the coupons of ids that do not exist, in ids' order.
func unknownOf(ctx context.Context, q *pgxpool.Pool, ids []string) ([]string, error) {
	rows, err := q.Query(ctx, `
SELECT g.id::text FROM unnest($1::uuid[]) WITH ORDINALITY AS g(id, n)
 WHERE NOT EXISTS (SELECT FROM issued_coupons c WHERE c.coupon_id = g.id)
 ORDER BY g.n`, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox requeue: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
