package relay

import (
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"

	"github.com/mops/coupon-api/shared/telemetry"
)

// Instrument wraps h with the run's server span, which continues Cloud Scheduler's or the
// operator's trace (see [telemetry.Propagator]); each push is a child span of it.
func Instrument(h http.Handler) http.Handler {
	return otelhttp.NewHandler(h, "RelayOutbox", otelhttp.WithPropagators(telemetry.Propagator()))
}

// registerGauges registers the outbox gauges ([telemetry.RegisterOutboxGauges]) on the global
// meter provider, read through pool once per metric export, for the instance's life.
func registerGauges(pool *pgxpool.Pool) error {
	_, err := telemetry.RegisterOutboxGauges(otel.GetMeterProvider(), pool)
	return err
}
