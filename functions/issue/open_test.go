package issue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// refusingMeter makes no gauge: the fault of [TestOpenClosesThePoolWhenTheGaugeFails].
type refusingMeter struct{ metric.Meter }

func (refusingMeter) Float64ObservableGauge(string, ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	return nil, errors.New("injected: no gauge")
}

type refusingMeterProvider struct{ metric.MeterProvider }

func (refusingMeterProvider) Meter(string, ...metric.MeterOption) metric.Meter {
	return refusingMeter{metricnoop.Meter{}}
}

// TestOpenClosesThePoolWhenTheGaugeFails: the budget gauge cannot be registered after Open has
// opened and checked the pool. Open returns that error, and no session of the pool is left on
// the server.
func TestOpenClosesThePoolWhenTheGaugeFails(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	t.Setenv("DATABASE_URL", dbURL)
	otel.SetMeterProvider(refusingMeterProvider{metricnoop.NewMeterProvider()})
	t.Cleanup(func() { otel.SetMeterProvider(metricnoop.NewMeterProvider()) })

	if _, err := issue.Open(ctx); err == nil || !strings.Contains(err.Error(), "injected: no gauge") {
		t.Fatalf("Open with the gauge refused: %v, want its error", err)
	}
	observer, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close(ctx)
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		var sessions int
		if err := observer.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&sessions); err != nil {
			return err
		}
		if sessions != 0 {
			return fmt.Errorf("%d sessions of the pool Open opened are still on the server", sessions)
		}
		return nil
	})
}
