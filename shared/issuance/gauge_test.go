package issuance_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/gcpfake"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/telemetry"
)

// TestBudgetGauge: the budget gauge reads campaign_budgets at collection: per campaign its
// issued over its budget yen, summed over its stripes, in a shape Google's Telemetry API takes.
func TestBudgetGauge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, 2)
	for _, c := range []campaign.Campaign{
		{ID: "HALF", DiscountYen: 1000, BudgetYen: 4000, Stripes: 2},
		{ID: "NONE", DiscountYen: 1000, BudgetYen: 1000},
	} {
		if err := campaign.Create(ctx, pool, c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = 1000 WHERE campaign_id = 'HALF'`); err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	if _, err := issuance.RegisterBudgetGauge(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), pool); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	if err := gcpfake.CheckMetrics(rm); err != nil {
		t.Errorf("Google's Telemetry API would reject: %v", err)
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			g, ok := m.Data.(metricdata.Gauge[float64])
			if !ok || m.Name != telemetry.MetricBudgetUtilization {
				t.Errorf("metric %s of type %T, want only the float64 gauge %s", m.Name, m.Data, telemetry.MetricBudgetUtilization)
				continue
			}
			for _, p := range g.DataPoints {
				v, _ := p.Attributes.Value(telemetry.AttrCampaign)
				got[v.AsString()] = p.Value
			}
		}
	}
	if len(got) != 2 || got["HALF"] != 0.5 || got["NONE"] != 0 {
		t.Errorf("budget used %v, want HALF 0.5 (2,000 of 4,000 yen over two stripes), NONE 0", got)
	}
}
