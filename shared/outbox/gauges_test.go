package outbox_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mops/coupon-api/internal/testkit/gcpfake"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/outbox"
	"github.com/mops/coupon-api/shared/telemetry"
)

// TestGauges: the outbox gauges read notification_outbox at collection: the open rows and the
// oldest one's age, the parked rows, the rows skipped in the last day, in a shape Google's
// Telemetry API takes.
func TestGauges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, 2)
	if _, err := pool.Exec(ctx, `
WITH k AS (INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('T', 1000, 1000000)),
c AS (
  INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
  SELECT 'T', 'm' || g, '2026-11', 1000 FROM generate_series(1, 5) g
  RETURNING coupon_id, member_id
)
INSERT INTO notification_outbox (coupon_id, member_id, created_at, sent_at, parked_at, skipped_at)
SELECT coupon_id, member_id,
       CASE member_id WHEN 'm1' THEN now() - interval '10 minutes' ELSE now() END,
       CASE member_id WHEN 'm3' THEN now() END,
       CASE member_id WHEN 'm4' THEN now() END,
       CASE member_id WHEN 'm5' THEN now() END
  FROM c`); err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	if _, err := outbox.RegisterGauges(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), pool); err != nil {
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
					got[m.Name] = p.Value
				}
			}
		}
	}
	for name, want := range map[string]float64{
		telemetry.MetricOutboxUnsent:  2, // m1, m2
		telemetry.MetricOutboxParked:  1, // m4
		telemetry.MetricOutboxSkipped: 1, // m5
	} {
		if g, ok := got[name]; !ok || g != want {
			t.Errorf("%s = %v (present %v), want %v", name, g, ok, want)
		}
	}
	// The oldest open row's age, by the database's clock: m1 was created 10 minutes before the
	// others, so the gauge reads at least that, whenever it is collected.
	if age := got[telemetry.MetricOutboxOldestAge]; age < 600 {
		t.Errorf("%s = %v s, want at least 600 (the 10-minute-old row m1, not the newest)", telemetry.MetricOutboxOldestAge, age)
	}
}
