package main

import (
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/reconcile"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/envconf"
	"github.com/mops/coupon-api/shared/issuance"
)

func reconcileCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "reconcile",
		Short: "Compare counters with rows and the outbox with coupons; exit 1 on any drift",
		Long: `Compare counters with rows and the outbox with coupons, print the report, and exit 1 on
any drift. The drift (yen and rows, by kind) is also exported as the metrics
coupon.reconcile.drift.amount and coupon.reconcile.drift.rows when the OTEL_* environment names an
exporter (OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT); run it on a schedule and alert on
them (docs/operations.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			capYen, err := envconf.Int("MONTHLY_CAP_YEN", issuance.DefaultMonthlyCapYen)
			if err != nil {
				return err
			}
			pool, closePool, err := db.OpenFromEnv(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			rep, err := reconcile.Check(cmd.Context(), pool, capYen)
			if err != nil {
				return err
			}
			rep.Write(cmd.OutOrStdout())
			if err := recordDrift(cmd, rep); err != nil {
				return err
			}
			if len(rep.Violations()) > 0 {
				return errViolations
			}
			return nil
		},
	}
}
