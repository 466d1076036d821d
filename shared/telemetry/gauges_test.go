package telemetry_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mops/coupon-api/shared/telemetry"
)

// TestGaugesBoundAndNameTheirCallback: each collection's callback runs under a deadline of at
// most GaugeQueryTimeout, and its error names the gauges it read.
func TestGaugesBoundAndNameTheirCallback(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	gs := telemetry.NewGauges(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	g := gs.Int64("test.gauge", "{row}", "a test gauge")
	var bounded bool
	fail := errors.New("the table is gone")
	if _, err := gs.Register("test gauges", func(ctx context.Context, o metric.Observer) error {
		deadline, ok := ctx.Deadline()
		bounded = ok && !deadline.IsZero()
		o.ObserveInt64(g, 1)
		return fail
	}, g); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	err := reader.Collect(context.Background(), &rm)
	if !errors.Is(err, fail) || !strings.Contains(err.Error(), "test gauges") {
		t.Errorf("Collect: %v, want the callback's error naming the gauges", err)
	}
	if !bounded {
		t.Error("the callback ran without a deadline")
	}
}
