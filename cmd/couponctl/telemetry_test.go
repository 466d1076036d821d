package main

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/gcpfake"
	"github.com/mops/coupon-api/internal/pgtest"
	"github.com/mops/coupon-api/internal/proctest"
	"github.com/mops/coupon-api/shared/telemetry"
)

// TestReconcileJobExportsDrift runs `couponctl reconcile` as the daily Cloud Run job of
// deploy/daily.sh runs it, with that job's OTEL_* settings, on a Cloud Run job task's
// surroundings (internal/gcpfake), against a database whose campaign counter drifted: it exits 1,
// and the drift metrics, which the reconcile-drift alert reads, reach the Telemetry API
// stand-in with nothing refused.
func TestReconcileJobExportsDrift(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	t.Setenv("DATABASE_URL", dbURL)
	if out, err := couponctl("campaign", "create", "--id", "DRIFT", "--discount-yen", "1000", "--budget-yen", "10000"); err != nil {
		t.Fatalf("campaign create: %v\n%s", err, out)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = 3000 WHERE campaign_id = 'DRIFT'`); err != nil {
		t.Fatal(err)
	}

	run := gcpfake.StartCloudRun(t, 0)
	env := append(run.JobEnv(t, "coupon-reconcile"), "DATABASE_URL="+dbURL)
	for k, v := range jobEnv(t, "coupon-reconcile") {
		if strings.HasPrefix(k, "OTEL_") || k == "GOOGLE_CLOUD_PROJECT" {
			env = append(env, k+"="+v)
		}
	}
	cmd := exec.Command(proctest.Build(t, "."), "reconcile")
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

// jobEnv returns the --set-env-vars of the Cloud Run job named job, as deploy/daily.sh deploys
// it (its dry run's command, split as the shell would).
func jobEnv(t *testing.T, job string) map[string]string {
	t.Helper()
	dry, err := exec.Command("bash", "../../deploy/daily.sh", "--project", "coupon-test-123", "--dry-run").CombinedOutput()
	if err != nil {
		t.Fatalf("daily.sh --dry-run: %v\n%s", err, dry)
	}
	for _, line := range strings.Split(string(dry), "\n") {
		cmdline, ok := strings.CutPrefix(line, "+ gcloud run jobs deploy "+job+" ")
		if !ok {
			continue
		}
		args, err := exec.Command("bash", "-c", `eval "set -- $1"; printf '%s\n' "$@"`, "_", cmdline).Output()
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		for _, a := range strings.Split(string(args), "\n") {
			if vars, ok := strings.CutPrefix(a, "--set-env-vars="); ok {
				for _, kv := range strings.Split(vars, ",") {
					k, v, _ := strings.Cut(kv, "=")
					env[k] = v
				}
			}
		}
		return env
	}
	t.Fatalf("daily.sh --dry-run deploys no job %s:\n%s", job, dry)
	return nil
}
