package issue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/telemetry"
)

// BenchmarkIssueCouponTelemetry measures one ISSUED request through the handler, one at a
// time: off (no telemetry: the bare handler, a pool without a tracer) against otlp (as
// deployed: otelhttp, otelpgx, every span sampled and exported as http/protobuf to a local
// OTLP receiver that only counts bytes, metrics every second) and otlp-10pct (the same with
// one request in ten sampled, OTEL_TRACES_SAMPLER=parentbased_traceidratio, 0.1). The
// difference is telemetry's cost per request: ns/op in time (the database round trips
// included), cpu-µs/op in this process's CPU (user + system, the database server excluded),
// which other load on the machine disturbs less.
func BenchmarkIssueCouponTelemetry(b *testing.B) {
	for _, mode := range []string{"off", "otlp", "otlp-10pct"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			var received atomic.Int64
			traced := mode != "off"
			if mode == "otlp-10pct" {
				b.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
				b.Setenv("OTEL_TRACES_SAMPLER_ARG", "0.1")
			}
			if traced {
				sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n, _ := io.Copy(io.Discard, r.Body)
					received.Add(n)
				}))
				defer sink.Close()
				b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.URL)
				b.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
				b.Setenv("OTEL_TRACES_EXPORTER", "otlp")
				b.Setenv("OTEL_METRICS_EXPORTER", "otlp")
				b.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "1000")
				shutdown, err := telemetry.Setup(ctx, telemetry.WithLogWriter(io.Discard))
				if err != nil {
					b.Fatal(err)
				}
				defer func() {
					_ = shutdown(ctx)
					otel.SetTracerProvider(tracenoop.NewTracerProvider())
					otel.SetMeterProvider(metricnoop.NewMeterProvider())
				}()
			}
			pcfg, err := pgxpool.ParseConfig(pgtest.URL(b))
			if err != nil {
				b.Fatal(err)
			}
			if traced {
				pcfg.ConnConfig.Tracer = otelpgx.NewTracer() // as shared/db does
			}
			pool, err := pgxpool.NewWithConfig(ctx, pcfg)
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "BENCH", DiscountYen: 1, BudgetYen: 1 << 30}); err != nil {
				b.Fatal(err)
			}
			pgtest.SetClock(b, pool, now)
			h, err := newHandler(pool, issuance.Config{})
			if err != nil {
				b.Fatal(err)
			}
			h.log = telemetry.NewLogger(io.Discard, "")
			var served http.Handler = h
			if traced {
				served = instrument(h)
			}
			cpu0 := processCPU(b)
			b.ResetTimer()
			for i := range b.N {
				req := httptest.NewRequest(http.MethodPost, "/IssueCoupon", strings.NewReader(ask(fmt.Sprintf("b%d", i), "BENCH")))
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				served.ServeHTTP(rec, req)
				if rec.Code != http.StatusCreated {
					b.Fatalf("request %d: %d %s", i, rec.Code, rec.Body.String())
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			if traced {
				b.ReportMetric(float64(received.Load())/float64(b.N), "otlp-bytes/op")
			}
		})
	}
}

// processCPU is the CPU time this process has used so far, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
