package main

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/testkit/gcpfake"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/shared/telemetry"
)

// TestReconcileJobExportsDrift runs `couponops reconcile` as the daily Cloud Run job of
// deploy/daily.sh runs it, with that job's OTEL_* settings, on a Cloud Run job task's
// surroundings (internal/testkit/gcpfake), against a database whose campaign counter drifted: it exits 1,
// and the drift metrics, which the reconcile-drift alert reads, reach the Telemetry API
// stand-in with nothing refused.
func TestReconcileJobExportsDrift(t *testing.T) {
	dbURL := pgtest.URL(t)
	drift(t, dbURL)

	run := gcpfake.StartCloudRun(t, 0)
	env := append(run.JobEnv(t, "coupon-reconcile"), "DATABASE_URL="+dbURL)
	vars, args := job(t, "coupon-reconcile")
	for k, v := range vars {
		if strings.HasPrefix(k, "OTEL_") || k == "GOOGLE_CLOUD_PROJECT" {
			env = append(env, k+"="+v)
		}
	}
	if !slices.Equal(args, []string{"reconcile"}) {
		t.Errorf("the job runs couponops %q, want reconcile", args)
	}
	cmd := exec.Command(proctest.Build(t, "."), args...)
	cmd.Env = proctest.Env(env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("reconcile on a drifted counter: %v, want exit 1\n%s", err, out)
	}
	run.API.CheckAllTaken(t, string(out))
	metrics := run.API.MetricNames()
	for _, want := range []string{telemetry.MetricDriftYen, telemetry.MetricDriftRows} {
		if !slices.Contains(metrics, want) {
			t.Errorf("metrics %q: no %s\n%s", metrics, want, out)
		}
	}
}

// job returns the --set-env-vars and the --args of the Cloud Run job named name, as
// deploy/daily.sh deploys it (its dry run's command, split as the shell would).
func job(t *testing.T, name string) (map[string]string, []string) {
	t.Helper()
	dry, err := exec.Command("bash", "../../deploy/daily.sh", "--project", "coupon-test-123", "--dry-run").CombinedOutput()
	if err != nil {
		t.Fatalf("daily.sh --dry-run: %v\n%s", err, dry)
	}
	for _, line := range strings.Split(string(dry), "\n") {
		cmdline, ok := strings.CutPrefix(line, "+ gcloud run jobs deploy "+name+" ")
		if !ok {
			continue
		}
		args, err := exec.Command("bash", "-c", `eval "set -- $1"; printf '%s\n' "$@"`, "_", cmdline).Output()
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		var jobArgs []string
		for _, a := range strings.Split(string(args), "\n") {
			if vars, ok := strings.CutPrefix(a, "--set-env-vars="); ok {
				for _, kv := range strings.Split(vars, ",") {
					k, v, _ := strings.Cut(kv, "=")
					env[k] = v
				}
			}
			if list, ok := strings.CutPrefix(a, "--args="); ok {
				jobArgs = strings.Split(list, ",")
			}
		}
		return env, jobArgs
	}
	t.Fatalf("daily.sh --dry-run deploys no job %s:\n%s", name, dry)
	return nil, nil
}

// TestJobsRunVerbs: each daily job's --args is a couponops verb (its --help answers as that
// verb), so an execution runs the verb and not the root's help.
func TestJobsRunVerbs(t *testing.T) {
	for name, verb := range map[string]string{"coupon-reconcile": "reconcile", "coupon-prune": "outbox prune"} {
		_, args := job(t, name)
		code, out := couponops(append(args, "--help")...)
		if code != 0 || !strings.Contains(out, "Usage:\n  couponops "+verb) {
			t.Errorf("job %s runs couponops %q: exit %d, want the verb %q\n%s", name, args, code, verb, out)
		}
	}
}
