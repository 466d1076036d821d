package outbox

import (
	"context"

	"go.opentelemetry.io/otel/metric"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/outbox/outboxdb"
	"github.com/mops/coupon-api/shared/telemetry"
)

// RegisterGauges registers [telemetry.MetricOutboxUnsent], [telemetry.MetricOutboxOldestAge],
// [telemetry.MetricOutboxParked] and [telemetry.MetricOutboxSkipped] on mp, read through q with
// [outboxdb.ReadGauges] once per collection. Unregister the returned registration when q closes.
func RegisterGauges(mp metric.MeterProvider, q db.Querier) (metric.Registration, error) {
	gs := telemetry.NewGauges(mp)
	unsent := gs.Int64(telemetry.MetricOutboxUnsent, "{row}", "Open outbox rows: neither sent, parked nor skipped")
	age := gs.Float64(telemetry.MetricOutboxOldestAge, "s", "Age of the oldest unsent outbox row")
	parked := gs.Int64(telemetry.MetricOutboxParked, "{row}", "Dead-lettered outbox rows")
	skipped := gs.Int64(telemetry.MetricOutboxSkipped, "{row}", "Outbox rows skipped in the last 24 hours: no LINE account linked, or the coupon voided or expired")
	return gs.Register("outbox gauges", func(ctx context.Context, o metric.Observer) error {
		g, err := outboxdb.ReadGauges(ctx, q)
		if err != nil {
			return err
		}
		o.ObserveInt64(unsent, g.Open)
		o.ObserveFloat64(age, g.OldestOpenAge.Seconds())
		o.ObserveInt64(parked, g.Parked)
		o.ObserveInt64(skipped, g.SkippedLastDay)
		return nil
	}, unsent, age, parked, skipped)
}
