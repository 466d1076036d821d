package opsverbs

import (
	"fmt"
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

// sqlPrunable counts the rows [outbox.Prune] would delete with retention $1, and the oldest
// one's close time (--dry-run).
const sqlPrunable = `
SELECT count(*), min(COALESCE(sent_at, skipped_at)) FROM notification_outbox
 WHERE (sent_at IS NOT NULL OR skipped_at IS NOT NULL) AND COALESCE(sent_at, skipped_at) < now() - $1::interval`

// OutboxPrune is "outbox prune": it deletes sent and skipped outbox rows older than the
// retention, in batches.
func OutboxPrune() *cobra.Command {
	var (
		olderThan     time.Duration
		force, dryRun bool
	)
	c := &cobra.Command{
		Use:   "prune [--older-than 720h] [--force] [--dry-run]",
		Short: "Delete sent and skipped outbox rows older than the retention, in batches",
		Long: fmt.Sprintf(`Delete sent and skipped outbox rows closed longer ago than --older-than, oldest first, %d
rows per statement, until none is left. Open and parked rows are never deleted. Nothing else
deletes outbox rows: run this verb daily as an operator job, as a user in coupon_admin
(docs/roles.md). Without --older-than it keeps RELAY_RETENTION
(default %s), the window couponctl reconcile checks.

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
			}
			pool, closePool, err := OpenMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			if dryRun {
				return prunePreview(cmd, pool, olderThan)
			}
			var total int64
			for {
				n, err := outbox.Prune(cmd.Context(), pool, olderThan, outbox.PruneBatch)
				total += n
				if err != nil {
					return fmt.Errorf("after deleting %d rows: %w", total, err)
				}
				if n < outbox.PruneBatch {
					break
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %d sent and skipped rows closed more than %s ago\n", total, olderThan)
			return nil
		},
	}
	c.Flags().DurationVar(&olderThan, "older-than", outbox.DefaultRetention, "retention: keep rows closed more recently than this (unset: RELAY_RETENTION if set)")
	c.Flags().BoolVar(&force, "force", false, fmt.Sprintf("allow a retention below %s", PruneFloor))
	c.Flags().BoolVar(&dryRun, "dry-run", false, "count the rows the prune would delete; delete nothing")
	return c
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
