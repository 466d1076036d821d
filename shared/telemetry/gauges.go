package telemetry

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/outbox/outboxdb"
)

// GaugeQueryTimeout bounds each gauge callback's query, so a slow database delays one export
// by at most this much and never blocks a request.
const GaugeQueryTimeout = 2 * time.Second

// sqlBudgetUtilization stays here rather than beside issuance: the budget counters are written
// by the database's issuing function (schema/migrations), not by Go SQL in shared/issuance,
// and shared/issuance imports this package for its spans and metrics, so moving the query there
// would mean turning the gauge into a callback that IssueCoupon's start-up passes in; for one
// read-only aggregate that the IssueCoupon function alone reports, that buys nothing.
//
// sqlBudgetUtilization reads each campaign's issued and budget yen, summed over its rows (one
// per budget stripe, docs/api.md "Tables"), for campaigns not ended more than a day ago: the
// gauge's series stay few. One index-free scan of campaign_budgets, a table of a few rows per
// campaign.
const sqlBudgetUtilization = `
SELECT campaign_id, SUM(issued_yen)::float8 / NULLIF(SUM(budget_yen), 0)
  FROM campaign_budgets
 WHERE ends_at IS NULL OR ends_at > now() - interval '1 day'
 GROUP BY campaign_id`

// RegisterBudgetGauge registers [MetricBudgetUtilization] on mp, read through q once per
// collection (the metric export interval, OTEL_METRIC_EXPORT_INTERVAL). Unregister the
// returned registration when q closes.
func RegisterBudgetGauge(mp metric.MeterProvider, q db.Querier) (metric.Registration, error) {
	b := gauges{m: mp.Meter(ScopeName)}
	g := b.float64(MetricBudgetUtilization, "1", "Campaign budget used: issued_yen / budget_yen")
	return b.register("budget gauge", func(ctx context.Context, o metric.Observer) error {
		rows, err := q.Query(ctx, sqlBudgetUtilization)
		if err != nil {
			return err
		}
		var campaign string
		var ratio *float64
		_, err = pgx.ForEachRow(rows, []any{&campaign, &ratio}, func() error {
			if ratio != nil {
				o.ObserveFloat64(g, *ratio, metric.WithAttributes(AttrCampaign.String(campaign)))
			}
			return nil
		})
		return err
	}, g)
}

// RegisterOutboxGauges registers [MetricOutboxUnsent], [MetricOutboxOldestAge],
// [MetricOutboxParked] and [MetricOutboxSkipped] on mp, read through q with
// [outboxdb.ReadGauges] once per collection. Unregister the returned registration when q closes.
func RegisterOutboxGauges(mp metric.MeterProvider, q db.Querier) (metric.Registration, error) {
	b := gauges{m: mp.Meter(ScopeName)}
	unsent := b.int64(MetricOutboxUnsent, "{row}", "Open outbox rows: neither sent, parked nor skipped")
	age := b.float64(MetricOutboxOldestAge, "s", "Age of the oldest unsent outbox row")
	parked := b.int64(MetricOutboxParked, "{row}", "Dead-lettered outbox rows")
	skipped := b.int64(MetricOutboxSkipped, "{row}", "Outbox rows skipped in the last 24 hours: the member has no LINE account")
	return b.register("outbox gauges", func(ctx context.Context, o metric.Observer) error {
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

// gauges makes observable gauges on m and registers their callback, keeping the first error.
type gauges struct {
	m   metric.Meter
	err error
}

func (b *gauges) int64(name, unit, description string) metric.Int64ObservableGauge {
	g, err := b.m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(description))
	b.err = cmp.Or(b.err, err)
	return g
}

func (b *gauges) float64(name, unit, description string) metric.Float64ObservableGauge {
	g, err := b.m.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(description))
	b.err = cmp.Or(b.err, err)
	return g
}

// register registers read for instruments, each call bounded by [GaugeQueryTimeout] and its
// error prefixed with what; it returns the first error of making the gauges instead, if any.
func (b *gauges) register(what string, read func(context.Context, metric.Observer) error,
	instruments ...metric.Observable) (metric.Registration, error) {
	if b.err != nil {
		return nil, b.err
	}
	return b.m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, GaugeQueryTimeout)
		defer cancel()
		if err := read(ctx, o); err != nil {
			return fmt.Errorf("telemetry: %s: %w", what, err)
		}
		return nil
	}, instruments...)
}
