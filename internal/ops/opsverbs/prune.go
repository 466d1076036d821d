package opsverbs

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/envconf"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox"
)

// PruneFloor is the shortest retention "outbox prune" takes without --force: a pruned row can
// no longer be requeued, and "outbox requeue" acts on rows pushed within LINE's 24-hour retry-key
// window ([outbox.RetryKeyWindow] and its margin), so a day of closed rows is always kept.
const PruneFloor = 24 * time.Hour

// PrunePause is "outbox prune"'s default wait between two statements, which leaves the issuance
// beside the prune most of the server (measured in docs/performance.md, "Outbox prune").
const PrunePause = 100 * time.Millisecond

// pruneProgressEvery is how often a long prune says how far it got, on stderr.
const pruneProgressEvery = 10 * time.Second

// maxPruneBatch bounds --batch, in rows: a statement's row locks and WAL stay short.
const maxPruneBatch = 10_000

// sqlPrunable counts the rows [outbox.Prune] would delete with retention $1, and the oldest
// one's close time (--dry-run).
const sqlPrunable = `
SELECT count(*), min(COALESCE(sent_at, skipped_at)) FROM notification_outbox
 WHERE (sent_at IS NOT NULL OR skipped_at IS NOT NULL) AND COALESCE(sent_at, skipped_at) < now() - $1::interval`

// OutboxPrune is "outbox prune": it deletes sent and skipped outbox rows older than the
// retention, in batches.
func OutboxPrune() *cobra.Command {
	var (
		olderThan, pause time.Duration
		batch            int
		force, dryRun    bool
	)
	c := &cobra.Command{
		Use:   "prune [--older-than 720h] [--force] [--dry-run] [--batch 1000] [--pause 100ms]",
		Short: "Delete sent and skipped outbox rows older than the retention, in batches",
		Long: fmt.Sprintf(`Delete sent and skipped outbox rows closed longer ago than --older-than, oldest first, --batch
rows per statement (default %d), waiting --pause between statements, until none is left; every
10 s a progress line on stderr says how many and how fast. What each row's push came to (sent,
or skipped and why) is kept in outbox_pruned for coupon show, the console and reconcile. Open
and parked rows are never deleted. Nothing else deletes outbox rows: run this verb daily as an
operator job, as a user in coupon_admin (docs/roles.md). Without --older-than it keeps
RELAY_RETENTION (default %s), the window couponctl reconcile checks.

A pruned row cannot be requeued (outbox requeue says so), so a retention below %s is refused
(exit 2) unless --force is given. --dry-run counts the rows the prune would delete and deletes
nothing.`, outbox.PruneBatch, outbox.DefaultRetention, PruneFloor),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			setting := "--older-than " // what set the retention, as the refusals name it
			if !cmd.Flags().Changed("older-than") {
				var err error
				if olderThan, err = envconf.Duration("RELAY_RETENTION", outbox.DefaultRetention); err != nil {
					return err
				}
				setting = "RELAY_RETENTION="
			}
			switch {
			case olderThan <= 0:
				return flagError("%s%s: must be positive", setting, olderThan)
			case olderThan < PruneFloor && !force:
				return flagError("%s%s: below the %s floor: a pruned row can no longer be requeued; "+
					"give --force to prune it anyway", setting, olderThan, PruneFloor)
			case batch < 1 || batch > maxPruneBatch:
				return flagError("--batch %d: give 1 to %d rows per statement", batch, maxPruneBatch)
			case pause < 0:
				return flagError("--pause %s: must not be negative", pause)
			}
			pool, closePool, err := OpenMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			if dryRun {
				return prunePreview(cmd, pool, olderThan)
			}
			total, err := PrunePaced(cmd.Context(), pool, olderThan, batch, pause, time.Time{}, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("after deleting %d rows: %w", total, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %d sent and skipped rows closed more than %s ago\n", total, olderThan)
			return nil
		},
	}
	c.Flags().DurationVar(&olderThan, "older-than", outbox.DefaultRetention, "retention: keep rows closed more recently than this (unset: RELAY_RETENTION if set)")
	c.Flags().BoolVar(&force, "force", false, fmt.Sprintf("allow a retention below %s", PruneFloor))
	c.Flags().BoolVar(&dryRun, "dry-run", false, "count the rows the prune would delete; delete nothing")
	c.Flags().IntVar(&batch, "batch", outbox.PruneBatch, fmt.Sprintf("rows per statement (1 to %d)", maxPruneBatch))
	c.Flags().DurationVar(&pause, "pause", PrunePause, "wait between statements, so that the issuance beside the prune keeps its pace (0: none)")
	return c
}

// PrunePaced is "outbox prune"'s loop: it deletes batch rows at a time with [outbox.Prune]
// until a statement deletes fewer, waiting pause between statements, with a progress line to
// progress every 10 s. With until not zero it also stops, between two statements, once until has
// passed (bench's prune turns: no statement is cut off, so every row it counts was deleted). It
// returns the rows deleted, also when it stops on an error or a cancelled context.
func PrunePaced(ctx context.Context, q db.Querier, olderThan time.Duration, batch int, pause time.Duration, until time.Time,
	progress io.Writer) (int64, error) {
	var total int64
	start := time.Now()
	next := start.Add(pruneProgressEvery)
	for {
		n, err := outbox.Prune(ctx, q, olderThan, batch)
		total += n
		if err != nil || n < int64(batch) {
			return total, err
		}
		if now := time.Now(); now.After(next) {
			fmt.Fprintf(progress, "outbox prune: deleted %d rows so far, %.0f rows/s\n", total, float64(total)/now.Sub(start).Seconds())
			next = now.Add(pruneProgressEvery)
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(pause):
		}
		if !until.IsZero() && !time.Now().Before(until) {
			return total, nil
		}
	}
}

// prunePreview says how many rows a prune with retention olderThan would delete, and since when.
func prunePreview(cmd *cobra.Command, q db.Querier, olderThan time.Duration) error {
	var n int64
	var oldest *time.Time
	if err := q.QueryRow(cmd.Context(), sqlPrunable, olderThan).Scan(&n, &oldest); err != nil {
		return fmt.Errorf("outbox prune --dry-run: %w", err)
	}
	since := ""
	if oldest != nil {
		since = ", the oldest closed at " + oldest.In(issuance.Tokyo).Format(time.RFC3339)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "dry run: would delete %d sent and skipped rows closed more than %s ago%s; nothing deleted\n",
		n, olderThan, since)
	return nil
}
