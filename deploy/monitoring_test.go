package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mops/coupon-api/shared/telemetry"
)

// promQueries returns every PromQL query in a Cloud Monitoring dashboard or alert policy:
// the values of "prometheusQuery" (dashboards) and of "query" inside
// "conditionPrometheusQueryLanguage" (alert policies).
func promQueries(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	var walk func(v any, parent string)
	walk = func(v any, parent string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "prometheusQuery" || (k == "query" && parent == "conditionPrometheusQueryLanguage")) {
					out = append(out, s)
				}
				walk(x, k)
			}
		case []any:
			for _, x := range v {
				walk(x, parent)
			}
		}
	}
	walk(doc, "")
	return out
}

// selectorName is the metric name of a UTF-8 PromQL selector: {"name", labels...}. The
// Telemetry API keeps OTLP's dotted names; a histogram is read through name_bucket, _sum, _count.
var selectorName = regexp.MustCompile(`\{"([^"]+)"`)

// emittedName returns the metric a queried name reads, if the code emits it.
func emittedName(name string) (string, bool) {
	emitted := telemetry.MetricNames()
	if slices.Contains(emitted, name) {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base := strings.TrimSuffix(name, suffix)
		if base != name && slices.Contains([]string{telemetry.MetricIssuanceDuration, telemetry.MetricIssuanceAttempts}, base) {
			return base, true
		}
	}
	return "", false
}

// TestMonitoringReferencesEmittedMetrics: every metric the dashboard and the alert policies
// query is one shared/telemetry emits (its exported name constants), every query reads at
// least one, and the dashboard shows every emitted metric.
func TestMonitoringReferencesEmittedMetrics(t *testing.T) {
	alerts, err := filepath.Glob("monitoring/alerts/*.json")
	if err != nil || len(alerts) == 0 {
		t.Fatalf("no alert policies under monitoring/alerts (%v)", err)
	}
	shown := map[string]bool{}
	for _, path := range append([]string{"monitoring/dashboard.json"}, alerts...) {
		queries := promQueries(t, path)
		if len(queries) == 0 {
			t.Errorf("%s: no PromQL query", path)
		}
		for _, q := range queries {
			names := selectorName.FindAllStringSubmatch(q, -1)
			if len(names) == 0 {
				t.Errorf("%s: query %q reads no metric", path, q)
			}
			for _, m := range names {
				base, ok := emittedName(m[1])
				if !ok {
					t.Errorf("%s: query %q reads %q, which the code does not emit (shared/telemetry.MetricNames)", path, q, m[1])
				}
				if path == "monitoring/dashboard.json" {
					shown[base] = true
				}
			}
		}
	}
	for _, name := range telemetry.MetricNames() {
		if !shown[name] {
			t.Errorf("dashboard does not show %s", name)
		}
	}
}

// TestAlertPoliciesAreComplete: each alert policy has a name, a condition with a duration, and
// documentation that tells the operator what to do.
func TestAlertPoliciesAreComplete(t *testing.T) {
	alerts, _ := filepath.Glob("monitoring/alerts/*.json")
	for _, path := range alerts {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			DisplayName string `json:"displayName"`
			Combiner    string `json:"combiner"`
			Conditions  []struct {
				DisplayName string `json:"displayName"`
				PromQL      *struct {
					Query    string `json:"query"`
					Duration string `json:"duration"`
				} `json:"conditionPrometheusQueryLanguage"`
			} `json:"conditions"`
			Documentation struct {
				Content string `json:"content"`
			} `json:"documentation"`
		}
		if err := json.Unmarshal(b, &p); err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if p.DisplayName == "" || p.Combiner == "" || len(p.Conditions) == 0 || len(p.Documentation.Content) < 40 {
			t.Errorf("%s: want displayName, combiner, conditions and documentation", path)
		}
		for _, c := range p.Conditions {
			if c.PromQL == nil || c.PromQL.Query == "" || !strings.HasSuffix(c.PromQL.Duration, "s") {
				t.Errorf("%s: condition %q needs a PromQL query and a duration in seconds", path, c.DisplayName)
			}
		}
	}
}
