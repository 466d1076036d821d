package telemetry_test

import (
	"context"
	"math"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mops/coupon-api/internal/campaign"
	"github.com/mops/coupon-api/internal/gcpfake"
	"github.com/mops/coupon-api/internal/pgtest"
	"github.com/mops/coupon-api/shared/telemetry"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestDatabaseGauges: the budget and outbox gauges read the tables at collection: budget used
// per campaign, open rows and the oldest one's age, parked rows, skipped rows.
func TestDatabaseGauges(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, 2)
	for _, c := range []campaign.Campaign{{ID: "HALF", DiscountYen: 1000, BudgetYen: 4000}, {ID: "NONE", DiscountYen: 1000, BudgetYen: 1000}} {
		if err := campaign.Create(ctx, pool, c); err != nil {
			t.Fatal(err)
		}
	}
	_, err := pool.Exec(ctx, `
UPDATE campaign_budgets SET issued_yen = 2000 WHERE campaign_id = 'HALF';
WITH c AS (
  INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
  SELECT 'HALF', 'm' || g, '2026-11', 1000 FROM generate_series(1, 5) g
  RETURNING coupon_id, member_id
)
INSERT INTO notification_outbox (coupon_id, member_id, created_at, sent_at, parked_at, skipped_at)
SELECT coupon_id, member_id,
       CASE member_id WHEN 'm1' THEN now() - interval '10 minutes' ELSE now() END,
       CASE member_id WHEN 'm3' THEN now() END,
       CASE member_id WHEN 'm4' THEN now() END,
       CASE member_id WHEN 'm5' THEN now() END
  FROM c`)
	if err != nil {
		t.Fatal(err)
	}

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	if _, err := telemetry.RegisterBudgetGauge(mp, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := telemetry.RegisterOutboxGauges(mp, pool); err != nil {
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
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					got[m.Name] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value(telemetry.AttrCampaign)
					got[m.Name+"/"+v.AsString()] = p.Value
				}
			}
		}
	}
	want := map[string]float64{
		telemetry.MetricBudgetUtilization + "/HALF": 0.5,
		telemetry.MetricBudgetUtilization + "/NONE": 0,
		telemetry.MetricOutboxUnsent:                2, // m1, m2
		telemetry.MetricOutboxParked:                1, // m4
		telemetry.MetricOutboxSkipped:               1, // m5
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if age := got[telemetry.MetricOutboxOldestAge+"/"]; math.Abs(age-600) > 60 {
		t.Errorf("%s = %v s, want about 600 (the 10-minute-old row)", telemetry.MetricOutboxOldestAge, age)
	}
}
