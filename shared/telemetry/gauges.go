package telemetry

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// GaugeQueryTimeout bounds each gauge callback, so that a slow database delays one export by
// at most this much and never blocks a request.
const GaugeQueryTimeout = 2 * time.Second

// Gauges makes observable gauges on the meter of [ScopeName] and registers the one callback
// that reads them, keeping the first error: each package registers the gauges of the tables it
// owns (shared/issuance the budget, shared/outbox the outbox).
type Gauges struct {
	m   metric.Meter
	err error
}

// NewGauges returns a Gauges on mp.
func NewGauges(mp metric.MeterProvider) *Gauges { return &Gauges{m: mp.Meter(ScopeName)} }

// Int64 makes an int64 gauge.
func (g *Gauges) Int64(name, unit, description string) metric.Int64ObservableGauge {
	i, err := g.m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(description))
	g.err = cmp.Or(g.err, err)
	return i
}

// Float64 makes a float64 gauge.
func (g *Gauges) Float64(name, unit, description string) metric.Float64ObservableGauge {
	f, err := g.m.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(description))
	g.err = cmp.Or(g.err, err)
	return f
}

// Register registers read for instruments, once per collection (the metric export interval,
// OTEL_METRIC_EXPORT_INTERVAL), each call bounded by [GaugeQueryTimeout] and its error prefixed
// with what. It returns the first error of making the gauges instead, if any. Unregister the
// registration when what read reads closes.
func (g *Gauges) Register(what string, read func(context.Context, metric.Observer) error,
	instruments ...metric.Observable) (metric.Registration, error) {
	if g.err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", what, g.err)
	}
	return g.m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, GaugeQueryTimeout)
		defer cancel()
		if err := read(ctx, o); err != nil {
			return fmt.Errorf("telemetry: %s: %w", what, err)
		}
		return nil
	}, instruments...)
}
