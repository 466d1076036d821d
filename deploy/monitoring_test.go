package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"cloud.google.com/go/monitoring/apiv3/v2/monitoringpb"
	"cloud.google.com/go/monitoring/dashboard/apiv1/dashboardpb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/mops/coupon-api/shared/telemetry"
)

// loadMessage reads a Cloud Monitoring file into m, the API message it is sent as: a field
// the API does not define is an error (protojson, unknown fields refused).
func loadMessage(t *testing.T, path string, m proto.Message) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(b, m); err != nil {
		t.Fatalf("%s is not a %s: %v", path, m.ProtoReflect().Descriptor().FullName(), err)
	}
}

func loadDashboard(t *testing.T) *dashboardpb.Dashboard {
	t.Helper()
	d := &dashboardpb.Dashboard{}
	loadMessage(t, "monitoring/dashboard.json", d)
	return d
}

// loadAlerts returns every alert policy file by its path.
func loadAlerts(t *testing.T) map[string]*monitoringpb.AlertPolicy {
	t.Helper()
	paths, err := filepath.Glob("monitoring/alerts/*.json")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no alert policies under monitoring/alerts (%v)", err)
	}
	alerts := map[string]*monitoringpb.AlertPolicy{}
	for _, path := range paths {
		p := &monitoringpb.AlertPolicy{}
		loadMessage(t, path, p)
		alerts[path] = p
	}
	return alerts
}

// promQueries returns every PromQL query in m: a dashboard's TimeSeriesQuery.prometheus_query
// fields and an alert policy's PrometheusQueryLanguageCondition.query fields, wherever nested.
func promQueries(m proto.Message) []string {
	var out []string
	var walk func(protoreflect.Message)
	walk = func(m protoreflect.Message) {
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.Name() == "prometheus_query" && fd.Kind() == protoreflect.StringKind,
				fd.Name() == "query" && fd.ContainingMessage().Name() == "PrometheusQueryLanguageCondition":
				out = append(out, v.String())
			case fd.IsList() && fd.Kind() == protoreflect.MessageKind:
				for i := range v.List().Len() {
					walk(v.List().Get(i).Message())
				}
			case fd.IsMap():
			case fd.Kind() == protoreflect.MessageKind:
				walk(v.Message())
			}
			return true
		})
	}
	walk(m.ProtoReflect())
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
		if base != name && slices.Contains([]string{telemetry.MetricIssuanceDuration, telemetry.MetricIssuanceAttempts, telemetry.MetricBatchSize}, base) {
			return base, true
		}
	}
	return "", false
}

// TestMonitoringReferencesEmittedMetrics: every metric the dashboard and the alert policies
// query is one shared/telemetry emits (its exported name constants), every query reads at
// least one, and the dashboard shows every emitted metric.
func TestMonitoringReferencesEmittedMetrics(t *testing.T) {
	files := map[string]proto.Message{"monitoring/dashboard.json": loadDashboard(t)}
	for path, p := range loadAlerts(t) {
		files[path] = p
	}
	shown := map[string]bool{}
	for path, m := range files {
		queries := promQueries(m)
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

// TestAlertPoliciesAreComplete: each alert policy has a name, a severity, a combiner,
// PromQL conditions with a duration and documentation that tells the operator what to do; each
// condition can be created before its metric exists (the metric appears with the first
// export after traffic, and the API refuses a condition on a metric it does not know unless it
// sets disableMetricValidation); and the file leaves what an operator sets in the project
// (notification channels, enabled) to the project, which monitoring.sh keeps.
func TestAlertPoliciesAreComplete(t *testing.T) {
	for path, p := range loadAlerts(t) {
		if p.GetDisplayName() == "" || p.GetSeverity() == monitoringpb.AlertPolicy_SEVERITY_UNSPECIFIED ||
			p.GetCombiner() == monitoringpb.AlertPolicy_COMBINE_UNSPECIFIED || len(p.GetConditions()) == 0 ||
			len(p.GetDocumentation().GetContent()) < 40 {
			t.Errorf("%s: want displayName, severity, combiner, conditions and documentation", path)
		}
		for _, c := range p.GetConditions() {
			q := c.GetConditionPrometheusQueryLanguage()
			if q.GetQuery() == "" || q.GetDuration() == nil {
				t.Errorf("%s: condition %q needs a PromQL query and a duration", path, c.GetDisplayName())
			}
			if !q.GetDisableMetricValidation() {
				t.Errorf("%s: condition %q does not set disableMetricValidation: the API refuses to create it "+
					"until its metric has been written", path, c.GetDisplayName())
			}
		}
		if p.GetName() != "" || len(p.GetNotificationChannels()) > 0 || p.GetEnabled() != nil {
			t.Errorf("%s: sets name, notificationChannels or enabled, which belong to the project", path)
		}
	}
}

// TestMonitoringScriptIsIdempotent runs deploy/monitoring.sh against a stand-in gcloud that
// already holds the dashboard and one policy, which an operator has disabled and given a
// channel of their own. Each lookup filters on the file's own top-level displayName; the
// dashboard is updated in place with the etag of the one there (the file plus that etag, still
// valid JSON); the policy in place is replaced by its file, still disabled, with its channel
// and the new one; the other policies are created with the new channel. (That the real gcloud
// takes these command lines is TestScriptsWithRealGcloud's.)
func TestMonitoringScriptIsIdempotent(t *testing.T) {
	bin := t.TempDir()
	calls, sent := filepath.Join(bin, "calls"), filepath.Join(bin, "dashboard-sent.json")
	fake := `#!/bin/sh
echo "$*" >> ` + calls + `
case "$*" in
  *" list "*'coupon-api: issuance, contention'*) echo "projects/p/dashboards/d1" ;;
  *" list "*'coupon-api: outbox rows parked'*) echo "projects/p/alertPolicies/a1" ;;
  *"dashboards describe projects/p/dashboards/d1 "*) echo "etag-7" ;;
  *"policies describe projects/p/alertPolicies/a1 "*) printf 'False\tprojects/p/notificationChannels/9\n' ;;
  *"dashboards update "*) for a; do case "$a" in --config-from-file=*) cat "${a#--config-from-file=}" > ` + sent + ` ;; esac; done ;;
esac
exit 0
`
	if err := os.WriteFile(filepath.Join(bin, "gcloud"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	const channel = "projects/coupon-test-123/notificationChannels/42"
	cmd := exec.Command("bash", "monitoring.sh", "--project", "coupon-test-123", "--notification-channel", channel)
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("monitoring.sh: %v\n%s", err, out)
	}
	b, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	alerts, _ := filepath.Glob("monitoring/alerts/*.json")
	for _, f := range append(alerts, "monitoring/dashboard.json") {
		var doc map[string]any
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &doc); err != nil || doc["displayName"] == nil {
			t.Fatalf("%s: no displayName (%v)", f, err)
		}
		if !strings.Contains(got, fmt.Sprintf(`--filter=displayName="%s"`, doc["displayName"])) {
			t.Errorf("no lookup of %s by its displayName %q:\n%s", f, doc["displayName"], got)
		}
		if f == "monitoring/dashboard.json" {
			continue
		}
		want := "alpha monitoring policies create --project=coupon-test-123 --policy-from-file=./" + f +
			" --notification-channels=" + channel + " "
		if filepath.Base(f) == "outbox-parked.json" {
			want = "alpha monitoring policies update projects/p/alertPolicies/a1 --project=coupon-test-123 --policy-from-file=./" + f +
				" --no-enabled --set-notification-channels=projects/p/notificationChannels/9," + channel + " "
		}
		if !strings.Contains(got, want) {
			t.Errorf("%s: want %q:\n%s", f, want, got)
		}
	}
	if n := strings.Count(got, channel); n != len(alerts) {
		t.Errorf("the channel was named %d times, want once per policy (%d):\n%s", n, len(alerts), got)
	}
	if !strings.Contains(got, "monitoring dashboards update projects/p/dashboards/d1 ") || strings.Contains(got, "dashboards create") {
		t.Errorf("the dashboard in place was not updated, or another was created:\n%s", got)
	}
	var dash, file map[string]any
	sentRaw, err := os.ReadFile(sent)
	if err != nil {
		t.Fatalf("no dashboard config sent: %v", err)
	}
	fileRaw, _ := os.ReadFile("monitoring/dashboard.json")
	if err := json.Unmarshal(sentRaw, &dash); err != nil || json.Unmarshal(fileRaw, &file) != nil {
		t.Fatalf("the dashboard sent is not JSON: %v\n%s", err, sentRaw)
	}
	if dash["etag"] != "etag-7" {
		t.Errorf("dashboard update with etag %v, want the one in place, etag-7", dash["etag"])
	}
	delete(dash, "etag")
	if fmt.Sprint(dash) != fmt.Sprint(file) {
		t.Error("the dashboard sent differs from deploy/monitoring/dashboard.json beyond the etag")
	}
}

// TestMonitoringScriptStopsOnAFailedLookup: when gcloud cannot list (no permission, no
// network), monitoring.sh fails instead of taking "nothing listed" for "nothing there" and
// creating duplicates; a channel that is not a channel's name is refused before any call.
func TestMonitoringScriptStopsOnAFailedLookup(t *testing.T) {
	bin := t.TempDir()
	calls := filepath.Join(bin, "calls")
	fake := "#!/bin/sh\necho \"$*\" >> " + calls + "\ncase \"$*\" in *\" list \"*) echo PERMISSION_DENIED >&2; exit 1 ;; esac\nexit 0\n"
	if err := os.WriteFile(filepath.Join(bin, "gcloud"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--project", "coupon-test-123"},
		{"--project", "coupon-test-123", "--notification-channel", "projects/x/channels/1", "--dry-run"},
	} {
		_ = os.Remove(calls)
		cmd := exec.Command("bash", append([]string{"monitoring.sh"}, args...)...)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("monitoring.sh %v: exit 0, want a failure\n%s", args, out)
		}
		if b, _ := os.ReadFile(calls); strings.Contains(string(b), " create ") || strings.Contains(string(b), " update ") {
			t.Errorf("monitoring.sh %v wrote after a failure:\n%s", args, b)
		}
	}
}
