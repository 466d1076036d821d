package relay

import (
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/mops/coupon-api/shared/telemetry"
)

// instrument wraps h with the run's server span, which continues Cloud Scheduler's or the
// operator's trace (see [telemetry.Propagator]); each push is a child span of it.
func instrument(h http.Handler) http.Handler {
	return otelhttp.NewHandler(h, "RelayOutbox", otelhttp.WithPropagators(telemetry.Propagator()))
}
