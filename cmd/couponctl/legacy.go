package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/legacy"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/issuance"
)

func legacyCmd() *cobra.Command {
	return groupCmd("legacy", "Report on the Before code's tables before migrating; roll the counters back",
		legacyReportCmd(), legacyRollbackCmd())
}

func legacyReportCmd() *cobra.Command {
	var format string
	c := &cobra.Command{
		Use:   "report [--format text|json]",
		Short: "Before migrating: duplicates, over-budget campaigns, counter drift, client months, members over the cap",
		Long: `Read the Before code's tables (campaigns, issued_coupons) and report what the migration
will do with them (docs/migration.md): duplicate coupons per (campaign, member), redeemed or not;
campaigns over budget once the unredeemed duplicates are voided, with the overshoot in yen (the
figure finance and promotion need); counter drift (campaigns.issued_yen against the coupons);
coupons whose client-chosen month is not the Asia/Tokyo month of issue; member-months over the
monthly cap (2,000 yen, the cap migration 00021 sets; "couponctl rules set" changes it once
migrated). It only reads.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "text" && format != "json" {
				return flagError("--format %q: want text or json", format)
			}
			pool, closePool, err := db.OpenFromEnv(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			rep, err := legacy.Read(cmd.Context(), pool, issuance.DefaultMonthlyCapYen)
			if err != nil {
				return err
			}
			if format == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			rep.Write(cmd.OutOrStdout())
			return nil
		},
	}
	c.Flags().StringVar(&format, "format", "text", "text or json")
	return c
}

func legacyRollbackCmd() *cobra.Command {
	var yes bool
	c := &cobra.Command{
		Use:   "rollback --yes",
		Short: "Write the rebuilt counters back to campaigns.issued_yen, where the Before code reads them",
		Long: `Roll back to the Before code (docs/migration.md, "Roll back"): with the new functions
stopped, write each campaign's issued yen (summed over its budget stripes) into
campaigns.issued_yen, in one transaction. The old code can then start on the same tables: the
unique index and the NOT VALID budget CHECK stay, and are harmless to it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !yes {
				return flagError("legacy rollback writes campaigns.issued_yen for every campaign: stop the new functions first, then run it with --yes")
			}
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			n, err := legacy.Rollback(cmd.Context(), pool)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote campaigns.issued_yen of %d campaigns from campaign_budgets\n", n)
			return nil
		},
	}
	c.Flags().BoolVar(&yes, "yes", false, "confirm: the new functions are stopped")
	return c
}
