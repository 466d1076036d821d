package issuance

import (
	"context"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/telemetry"
)

// sqlBudgetUtilization reads each campaign's issued and budget yen, summed over its rows (one
// per budget stripe, docs/api.md "Tables"), for campaigns not ended more than a day ago, so that
// the gauge's series stay few. One scan of campaign_budgets, a table of a few rows per campaign.
const sqlBudgetUtilization = `
SELECT campaign_id, SUM(issued_yen)::float8 / NULLIF(SUM(budget_yen), 0)
  FROM campaign_budgets
 WHERE ends_at IS NULL OR ends_at > now() - interval '1 day'
 GROUP BY campaign_id`

// RegisterBudgetGauge registers [telemetry.MetricBudgetUtilization] on mp, by campaign, read
// through q once per collection. Unregister the returned registration when q closes.
func RegisterBudgetGauge(mp metric.MeterProvider, q db.Querier) (metric.Registration, error) {
	gs := telemetry.NewGauges(mp)
	g := gs.Float64(telemetry.MetricBudgetUtilization, "1", "Campaign budget used: issued_yen / budget_yen")
	return gs.Register("budget gauge", func(ctx context.Context, o metric.Observer) error {
		rows, err := q.Query(ctx, sqlBudgetUtilization)
		if err != nil {
			return err
		}
		var campaign string
		var ratio *float64
		_, err = pgx.ForEachRow(rows, []any{&campaign, &ratio}, func() error {
			if ratio != nil {
				o.ObserveFloat64(g, *ratio, metric.WithAttributes(telemetry.AttrCampaign.String(campaign)))
			}
			return nil
		})
		return err
	}, g)
}
