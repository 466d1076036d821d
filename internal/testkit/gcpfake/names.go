package gcpfake

import (
	"errors"
	"fmt"
	"regexp"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Names the Telemetry API accepts for metrics ("OTLP metric ingestion overview", "Metric and
// label names in the Telemetry API"): a metric whose name, or a data point whose attribute key,
// does not match is rejected.
var (
	metricNameRule = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_:./]*$`)
	labelKeyRule   = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_.]*$`)
)

// CheckMetricName returns an error if the Telemetry API would reject a metric named name.
func CheckMetricName(name string) error {
	if !metricNameRule.MatchString(name) {
		return fmt.Errorf("metric name %q does not match %s", name, metricNameRule)
	}
	return nil
}

// CheckLabelKey returns an error if the Telemetry API would reject a data point with the
// attribute key.
func CheckLabelKey(key string) error {
	if !labelKeyRule.MatchString(key) {
		return fmt.Errorf("attribute key %q does not match %s", key, labelKeyRule)
	}
	return nil
}

// CheckMetrics applies [CheckMetricName] and [CheckLabelKey] to everything a metric reader
// collected, for tests that read the SDK's data in memory, and joins what fails.
func CheckMetrics(rm metricdata.ResourceMetrics) error {
	var errs []error
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if err := CheckMetricName(m.Name); err != nil {
				errs = append(errs, err)
			}
			for _, set := range pointAttributes(m.Data) {
				for _, kv := range set.ToSlice() {
					if err := CheckLabelKey(string(kv.Key)); err != nil {
						errs = append(errs, fmt.Errorf("metric %s: %w", m.Name, err))
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// pointAttributes returns the attribute set of each data point of data.
func pointAttributes(data metricdata.Aggregation) []attribute.Set {
	var out []attribute.Set
	switch d := data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Sum[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.ExponentialHistogram[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.ExponentialHistogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	}
	return out
}
