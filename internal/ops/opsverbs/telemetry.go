package opsverbs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/shared/telemetry"
)

// telemetryFlushTimeout bounds the flush of queued spans and metrics when a verb ends.
const telemetryFlushTimeout = 5 * time.Second

// FlushTelemetry runs shutdown (from [telemetry.Setup]) within telemetryFlushTimeout and says
// on stderr if it could not flush everything.
func FlushTelemetry(cmd *cobra.Command, shutdown func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), telemetryFlushTimeout)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			endpoint := cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"), "the exporter's default endpoint")
			err = fmt.Errorf("%w: %s took no data within %s; what was still queued is lost", err, endpoint, telemetryFlushTimeout)
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "telemetry: flush: %v\n", err)
	}
}

// recordDrift exports the faults the report found as the drift metrics, by kind (legacy facts
// are not drift), logs them at ERROR in Cloud Logging's shape (the daily job's alert reads it),
// and flushes.
func recordDrift(cmd *cobra.Command, rep reconcile.Report) error {
	shutdown, err := telemetry.Setup(cmd.Context())
	if err != nil {
		return err
	}
	defer FlushTelemetry(cmd, shutdown)
	ctx := cmd.Context()
	m := telemetry.Global()
	var counterYen, counterRows int64
	for _, c := range rep.Campaigns {
		if d := c.DriftYen(); d != 0 {
			counterYen += max(d, -d)
			counterRows++
		}
	}
	m.RecordDrift(ctx, "budget_counter", counterYen, counterRows)
	m.RecordDrift(ctx, "usage_counter", 0, rep.UsageDrift)
	m.RecordDrift(ctx, "duplicate_pairs", 0, rep.DuplicatePairs)
	m.RecordDrift(ctx, "members_over_cap", 0, rep.MembersOverCap)
	m.RecordDrift(ctx, "coupons_without_outbox", 0, rep.CouponsWithoutOutbox)
	m.RecordDrift(ctx, "outbox_without_coupon", 0, rep.OutboxWithoutCoupon)
	if v := rep.Violations(); len(v) > 0 {
		slog.ErrorContext(ctx, "reconcile: drift or a broken rule; stop and investigate (docs/migration.md, step 7)",
			"violations", v)
	}
	return nil
}
