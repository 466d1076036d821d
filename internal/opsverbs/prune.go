package opsverbs

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/shared/envconf"
	"github.com/mops/coupon-api/shared/outbox"
)

// OutboxPrune is "outbox prune": it deletes sent and skipped outbox rows older than the
// retention, in batches.
func OutboxPrune() *cobra.Command {
	var olderThan time.Duration
	c := &cobra.Command{
		Use:   "prune [--older-than 720h]",
		Short: "Delete sent and skipped outbox rows older than the retention, in batches",
		Long: fmt.Sprintf(`Delete sent and skipped outbox rows closed longer ago than --older-than, oldest first, %d
rows per statement, until none is left. Open and parked rows are never deleted. Nothing else
deletes outbox rows: run this verb daily as an operator job, as a user in coupon_admin
(docs/roles.md). Without --older-than it keeps RELAY_RETENTION
(default %s), the window couponctl reconcile checks.`, outbox.PruneBatch, outbox.DefaultRetention),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("older-than") {
				var err error
				if olderThan, err = envconf.Duration("RELAY_RETENTION", outbox.DefaultRetention); err != nil {
					return err
				}
			}
			if olderThan <= 0 {
				return flagError("--older-than %s: must be positive", olderThan)
			}
			pool, closePool, err := OpenMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
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
	return c
}
