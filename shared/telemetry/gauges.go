package telemetry

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/mops/coupon-api/shared/db"
)

// GaugeQueryTimeout bounds each gauge callback's query, so a slow database delays one export
// by at most this much and never blocks a request.
const GaugeQueryTimeout = 2 * time.Second

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
	m := mp.Meter(ScopeName)
	g, err := m.Float64ObservableGauge(MetricBudgetUtilization, metric.WithUnit("1"),
		metric.WithDescription("Campaign budget used: issued_yen / budget_yen"))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, GaugeQueryTimeout)
		defer cancel()
		rows, err := q.Query(ctx, sqlBudgetUtilization)
		if err != nil {
			return fmt.Errorf("telemetry: budget gauge: %w", err)
		}
		var campaign string
		var ratio *float64
		_, err = pgx.ForEachRow(rows, []any{&campaign, &ratio}, func() error {
			if ratio != nil {
				o.ObserveFloat64(g, *ratio, metric.WithAttributes(AttrCampaign.String(campaign)))
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("telemetry: budget gauge: %w", err)
		}
		return nil
	}, g)
}

// sqlOutboxGauges reads the outbox through its partial indexes, never the whole sent history:
// open rows (neither sent, parked nor skipped; the relay's due index) and the oldest one's age in
// seconds (0 when none), parked rows (the parked index), and rows skipped in the last 24 hours
// because their member has no LINE account (the closed-rows index).
const sqlOutboxGauges = `
SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8,
       (SELECT count(*) FROM notification_outbox WHERE parked_at IS NOT NULL),
       (SELECT count(*) FROM notification_outbox
         WHERE (sent_at IS NOT NULL OR skipped_at IS NOT NULL)
           AND COALESCE(sent_at, skipped_at) > now() - interval '1 day' AND skipped_at IS NOT NULL)
  FROM notification_outbox
 WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL`

// RegisterOutboxGauges registers [MetricOutboxUnsent], [MetricOutboxOldestAge],
// [MetricOutboxParked] and [MetricOutboxSkipped] on mp, read through q in one query once per collection. Unregister the
// returned registration when q closes.
func RegisterOutboxGauges(mp metric.MeterProvider, q db.Querier) (metric.Registration, error) {
	m := mp.Meter(ScopeName)
	unsent, err := m.Int64ObservableGauge(MetricOutboxUnsent, metric.WithUnit("{row}"),
		metric.WithDescription("Open outbox rows: neither sent, parked nor skipped"))
	if err != nil {
		return nil, err
	}
	age, err := m.Float64ObservableGauge(MetricOutboxOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unsent outbox row"))
	if err != nil {
		return nil, err
	}
	parked, err := m.Int64ObservableGauge(MetricOutboxParked, metric.WithUnit("{row}"),
		metric.WithDescription("Dead-lettered outbox rows"))
	if err != nil {
		return nil, err
	}
	skipped, err := m.Int64ObservableGauge(MetricOutboxSkipped, metric.WithUnit("{row}"),
		metric.WithDescription("Outbox rows skipped in the last 24 hours: the member has no LINE account"))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, GaugeQueryTimeout)
		defer cancel()
		var nUnsent, nParked, nSkipped int64
		var ageSeconds float64
		if err := q.QueryRow(ctx, sqlOutboxGauges).Scan(&nUnsent, &ageSeconds, &nParked, &nSkipped); err != nil {
			return fmt.Errorf("telemetry: outbox gauges: %w", err)
		}
		o.ObserveInt64(unsent, nUnsent)
		o.ObserveFloat64(age, ageSeconds)
		o.ObserveInt64(parked, nParked)
		o.ObserveInt64(skipped, nSkipped)
		return nil
	}, unsent, age, parked, skipped)
}
