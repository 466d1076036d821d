package deploy_test

import (
	"encoding/json"
	"os"
	"os/exec"
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

// TestMonitoringScriptIsIdempotent runs deploy/monitoring.sh against a stand-in gcloud that
// already holds the dashboard and one policy: those two are updated in place (by the name the
// list returned), the other policies created, and each lookup filters on the file's own
// top-level displayName.
func TestMonitoringScriptIsIdempotent(t *testing.T) {
	bin := t.TempDir()
	calls := filepath.Join(bin, "calls")
	// The stand-in answers `list` with a resource name when the filter names an existing one.
	fake := `#!/bin/sh
echo "$*" >> ` + calls + `
case "$*" in
  *" list "*'coupon-api: issuance, contention'*) echo "projects/p/dashboards/d1" ;;
  *" list "*'coupon-api: outbox rows parked'*) echo "projects/p/alertPolicies/a1" ;;
esac
exit 0
`
	if err := os.WriteFile(filepath.Join(bin, "gcloud"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "monitoring.sh", "--project", "coupon-test-123")
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("monitoring.sh: %v\n%s", err, out)
	}
	b, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	files, _ := filepath.Glob("monitoring/alerts/*.json")
	files = append(files, "monitoring/dashboard.json")
	for _, f := range files {
		var doc struct{ DisplayName string }
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &doc); err != nil || doc.DisplayName == "" {
			t.Fatalf("%s: no displayName (%v)", f, err)
		}
		if !strings.Contains(got, `--filter=displayName="`+doc.DisplayName+`"`) {
			t.Errorf("no lookup of %s by its displayName %q:\n%s", f, doc.DisplayName, got)
		}
		verb := "create"
		switch filepath.Base(f) {
		case "dashboard.json":
			verb = "update projects/p/dashboards/d1"
		case "outbox-parked.json":
			verb = "update projects/p/alertPolicies/a1"
		}
		if !regexp.MustCompile(regexp.QuoteMeta(verb) + ` .*-from-file=(\./)?monitoring/` + regexp.QuoteMeta(strings.TrimPrefix(f, "monitoring/")) + `\b`).MatchString(got) {
			t.Errorf("%s: want %q:\n%s", f, verb, got)
		}
	}
	if n := strings.Count(got, " create ") + strings.Count(got, " update "); n != len(files) {
		t.Errorf("%d creates and updates for %d files:\n%s", n, len(files), got)
	}
}
