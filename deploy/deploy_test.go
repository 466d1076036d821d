package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/cloudbuild/apiv1/v2/cloudbuildpb"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox"
	"github.com/mops/coupon-api/shared/telemetry"
)

// The project the scripts are run for in these tests: its id and number, and the promotion
// team's Google group that IAP admits to the console.
const (
	testProject       = "coupon-test-123"
	testProjectNumber = "123456789012"
	testConsoleGroup  = "promotion-team@coupon-test.jp"
)

// requiredFlags are the flags, beyond --project, without which deploy/NAME refuses to run.
func requiredFlags(t *testing.T, name string) []string {
	t.Helper()
	switch name {
	case "env.sh":
		return []string{"--project-number", testProjectNumber, "--out", t.TempDir()}
	case "access.sh":
		return []string{"--console-group", testConsoleGroup}
	}
	return nil
}

// loadBuild reads a Cloud Build config file as the Build message that gcloud sends to the
// Cloud Build API: YAML to JSON, then protojson with unknown fields refused. Config files use
// the API's JSON field names (waitFor, serviceAccount); protojson takes the proto names too
// (wait_for), which a config file may not, so those are refused here first.
func loadBuild(t *testing.T, path string) *cloudbuildpb.Build {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if key := protoName(doc, ""); key != "" {
		t.Fatalf("%s: %q is a proto field name: a config file takes the JSON name (lowerCamelCase)", path, key)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	build := &cloudbuildpb.Build{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, build); err != nil {
		t.Fatalf("%s is not a Cloud Build Build: %v", path, err)
	}
	return build
}

// protoName returns the first field name in doc written with an underscore, outside the
// user's own keys of substitutions.
func protoName(doc any, parent string) string {
	switch v := doc.(type) {
	case map[string]any:
		for k, x := range v {
			if parent != "substitutions" && strings.Contains(k, "_") {
				return k
			}
			if found := protoName(x, k); found != "" {
				return found
			}
		}
	case []any:
		for _, x := range v {
			if found := protoName(x, parent); found != "" {
				return found
			}
		}
	}
	return ""
}

// builtinSubstitutions are the ones Cloud Build provides itself (Cloud Build docs,
// "Substituting variable values").
var builtinSubstitutions = []string{"PROJECT_ID", "PROJECT_NUMBER", "BUILD_ID", "LOCATION", "TRIGGER_NAME",
	"COMMIT_SHA", "SHORT_SHA", "REVISION_ID", "BRANCH_NAME", "TAG_NAME", "REPO_NAME", "REPO_FULL_NAME", "SERVICE_ACCOUNT_EMAIL"}

func loadCloudBuild(t *testing.T) *cloudbuildpb.Build {
	t.Helper()
	return loadBuild(t, "../cloudbuild.yaml")
}

// TestCloudBuildSteps, for both build configs (cloudbuild.yaml; deploy/couponops.cloudbuild.yaml,
// whose _IMAGE daily.sh passes): ids unique, waitFor names earlier steps (or "-", start at
// once), and every $VAR is a defined user substitution, one the submitting script passes, or a
// built-in (Cloud Build refuses others; a shell variable must be $$VAR).
func TestCloudBuildSteps(t *testing.T) {
	daily, err := script(t, "daily.sh", "--project", testProject, "--dry-run")
	if err != nil {
		t.Fatalf("daily.sh: %v\n%s", err, daily)
	}
	passed := map[string][]string{"../cloudbuild.yaml": nil, "couponops.cloudbuild.yaml": nil}
	for _, m := range regexp.MustCompile(`--config=deploy/couponops.cloudbuild.yaml --substitutions=(\w+)=`).FindAllStringSubmatch(daily, -1) {
		passed["couponops.cloudbuild.yaml"] = append(passed["couponops.cloudbuild.yaml"], m[1])
	}
	for path, given := range passed {
		cb := loadBuild(t, path)
		defined := func(name string) bool {
			_, ok := cb.GetSubstitutions()[name]
			return ok || slices.Contains(given, name) || slices.Contains(builtinSubstitutions, name)
		}
		ref := regexp.MustCompile(`\$\$|\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)
		for _, m := range ref.FindAllStringSubmatch(cb.GetServiceAccount(), -1) {
			if m[0] != "$$" && !slices.Contains(builtinSubstitutions, m[1]) {
				t.Errorf("%s: serviceAccount: $%s is not a built-in substitution", path, m[1])
			}
		}
		seen := map[string]bool{}
		for _, s := range cb.GetSteps() {
			if s.GetId() == "" || s.GetName() == "" || seen[s.GetId()] {
				t.Errorf("%s: step %q: needs a unique id and an image name", path, s.GetId())
			}
			for _, w := range s.GetWaitFor() {
				if w != "-" && !seen[w] {
					t.Errorf("%s: step %s waits for %q, which is not an earlier step", path, s.GetId(), w)
				}
			}
			seen[s.GetId()] = true
			for _, text := range append(append(slices.Clone(s.GetArgs()), s.GetEnv()...), cb.GetImages()...) {
				for _, m := range ref.FindAllStringSubmatch(text, -1) {
					if m[0] != "$$" && !defined(m[1]) {
						t.Errorf("%s: step %s: $%s is no substitution (write $$%s for a shell variable)", path, s.GetId(), m[1], m[1])
					}
				}
			}
		}
		if cb.GetServiceAccount() == "" || cb.GetOptions().GetLogging() != cloudbuildpb.BuildOptions_CLOUD_LOGGING_ONLY {
			t.Errorf("%s: want its own serviceAccount, and logging CLOUD_LOGGING_ONLY (which a build as one requires)", path)
		}
	}
}

// TestDailyJobsImage: daily.sh builds the image of cmd/couponops (a main package) with
// deploy/couponops.cloudbuild.yaml, as coupon-build, and deploys both jobs from that image.
func TestDailyJobsImage(t *testing.T) {
	cb := loadBuild(t, "couponops.cloudbuild.yaml")
	if want := "projects/$PROJECT_ID/serviceAccounts/coupon-build@$PROJECT_ID.iam.gserviceaccount.com"; cb.GetServiceAccount() != want {
		t.Errorf("the image builds as %q, want coupon-build", cb.GetServiceAccount())
	}
	var buildable string
	for _, s := range cb.GetSteps() {
		buildable += argValue(s.GetArgs(), "--env=GOOGLE_BUILDABLE=")
	}
	if pkg, err := build.ImportDir(filepath.Join("..", buildable), 0); err != nil || pkg.Name != "main" || buildable != "./cmd/couponops" {
		t.Errorf("GOOGLE_BUILDABLE %q: want ./cmd/couponops, a main package (%v)", buildable, err)
	}
	out, err := script(t, "daily.sh", "--project", testProject, "--dry-run")
	if err != nil {
		t.Fatalf("daily.sh: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`--config=deploy/couponops.cloudbuild.yaml --substitutions=_IMAGE=(\S+)`).FindStringSubmatch(out)
	if m == nil || !slices.Contains(cb.GetImages(), "${_IMAGE}") {
		t.Fatalf("daily.sh does not build the image with couponops.cloudbuild.yaml and _IMAGE, or the build pushes no _IMAGE:\n%s", out)
	}
	for _, job := range []string{"coupon-reconcile", "coupon-prune"} {
		deploy := regexp.MustCompile(`(?m)^\+ gcloud run jobs deploy ` + job + ` .*$`).FindString(out)
		if !strings.Contains(deploy, " --image="+m[1]+" ") {
			t.Errorf("job %s is not deployed from the image built (%s): %s", job, m[1], deploy)
		}
	}
}

// substitute replaces Cloud Build substitutions in s as a build in testProject would: $NAME
// and ${NAME} by the value, $$ by $.
func substitute(cb *cloudbuildpb.Build, s string) string {
	vals := map[string]string{"PROJECT_ID": testProject, "PROJECT_NUMBER": testProjectNumber}
	for k, v := range cb.GetSubstitutions() {
		vals[k] = v
	}
	return regexp.MustCompile(`\$\$|\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`).ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		return vals[strings.Trim(m, "${}")]
	})
}

// script runs deploy/NAME with args and returns what it printed (stdout and stderr) and its
// error. A gcloud on PATH that fails the test is put first, so that a --dry-run that would run
// a command shows.
func script(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	bin := t.TempDir()
	marker := filepath.Join(bin, "called")
	for _, tool := range []string{"gcloud", "cloud-sql-proxy", "psql", "pg_isready"} {
		fake := fmt.Sprintf("#!/bin/sh\necho \"%s $*\" >> %s\nexit 1\n", tool, marker)
		if err := os.WriteFile(filepath.Join(bin, tool), []byte(fake), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", append([]string{name}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if called, _ := os.ReadFile(marker); len(called) > 0 && slices.Contains(args, "--dry-run") {
		t.Errorf("%s %v ran commands under --dry-run:\n%s", name, args, called)
	}
	return string(out), err
}

// binding is one IAM grant: on which resource, to whom, which role.
type binding struct{ kind, resource, member, role string }

func (b binding) String() string {
	return fmt.Sprintf("%s %s: %s %s", b.kind, b.resource, b.member, b.role)
}

// bindings parses the add-iam-policy-binding commands of a dry run.
func bindings(t *testing.T, out string) []binding {
	t.Helper()
	var bs []binding
	for _, line := range strings.Split(out, "\n") {
		words := strings.Fields(strings.TrimPrefix(line, "+ "))
		i := slices.Index(words, "add-iam-policy-binding")
		if !strings.HasPrefix(line, "+ gcloud ") || i < 0 {
			continue
		}
		b := binding{kind: strings.Join(words[1:i], " "), resource: words[i+1]}
		for _, w := range words[i+1:] {
			if v, ok := strings.CutPrefix(w, "--member="); ok {
				b.member = v
			}
			if v, ok := strings.CutPrefix(w, "--role="); ok {
				b.role = v
			}
			// An IAP resource is named by flags: --resource-type=cloud-run --service=NAME.
			if v, ok := strings.CutPrefix(w, "--service="); ok && strings.HasPrefix(b.resource, "--") {
				b.resource = v
			}
		}
		if b.member == "" || b.role == "" {
			t.Errorf("binding without --member= or --role=: %s", line)
		}
		bs = append(bs, b)
	}
	return bs
}

func sa(name string) string {
	return "serviceAccount:" + name + "@" + testProject + ".iam.gserviceaccount.com"
}

// TestIAMBindings compares every grant the scripts make with the expected set, exactly: a
// grant that opens a function to anyone else (allUsers, another caller) or widens a role fails.
func TestIAMBindings(t *testing.T) {
	const gateway = "serviceAccount:app-gateway@gateway-prod-1.iam.gserviceaccount.com"
	p := testProject
	want := []binding{
		{"projects", p, sa("coupon-issue"), "roles/cloudsql.client"},
		{"projects", p, sa("coupon-issue"), "roles/cloudsql.instanceUser"},
		{"projects", p, sa("coupon-relay"), "roles/cloudsql.client"},
		{"projects", p, sa("coupon-relay"), "roles/cloudsql.instanceUser"},
		// RedeemCoupon: connect and log in, as the other functions (what it may do is coupon_redeem's).
		{"projects", p, sa("coupon-redeem"), "roles/cloudsql.client"},
		{"projects", p, sa("coupon-redeem"), "roles/cloudsql.instanceUser"},
		{"projects", p, sa("coupon-admin"), "roles/cloudsql.client"},
		{"projects", p, sa("coupon-admin"), "roles/cloudsql.instanceUser"},
		{"projects", p, sa("coupon-deploy"), "roles/cloudsql.client"},
		// The console: connect and log in, nothing else (what it may do is coupon_console's).
		{"projects", p, sa("coupon-console"), "roles/cloudsql.client"},
		{"projects", p, sa("coupon-console"), "roles/cloudsql.instanceUser"},
		{"projects", p, sa("coupon-deploy"), "roles/cloudsql.instanceUser"},
		{"secrets", "line-channel-access-token", sa("coupon-relay"), "roles/secretmanager.secretAccessor"},
		{"secrets", "telemetry-member-key", sa("coupon-issue"), "roles/secretmanager.secretAccessor"},
		{"secrets", "telemetry-member-key", sa("coupon-relay"), "roles/secretmanager.secretAccessor"},
		{"secrets", "telemetry-member-key", sa("coupon-redeem"), "roles/secretmanager.secretAccessor"},
		{"secrets", "console-csrf-key", sa("coupon-console"), "roles/secretmanager.secretAccessor"},
		{"projects", p, sa("coupon-deploy"), "roles/run.sourceDeveloper"},
		{"projects", p, sa("coupon-deploy"), "roles/serviceusage.serviceUsageConsumer"},
		{"projects", p, sa("coupon-deploy"), "roles/logging.logWriter"},
		{"storage buckets", "gs://" + p + "_cloudbuild", sa("coupon-deploy"), "roles/storage.objectViewer"},
		{"iam service-accounts", "coupon-issue@" + p + ".iam.gserviceaccount.com", sa("coupon-deploy"), "roles/iam.serviceAccountUser"},
		{"iam service-accounts", "coupon-relay@" + p + ".iam.gserviceaccount.com", sa("coupon-deploy"), "roles/iam.serviceAccountUser"},
		{"iam service-accounts", "coupon-redeem@" + p + ".iam.gserviceaccount.com", sa("coupon-deploy"), "roles/iam.serviceAccountUser"},
		{"iam service-accounts", "coupon-console@" + p + ".iam.gserviceaccount.com", sa("coupon-deploy"), "roles/iam.serviceAccountUser"},
		{"iam service-accounts", "coupon-build@" + p + ".iam.gserviceaccount.com", sa("coupon-deploy"), "roles/iam.serviceAccountUser"},
		{"projects", p, sa("coupon-build"), "roles/run.builder"},
		// Telemetry through Google's Telemetry API (shared/telemetry.GoogleExporter): the functions
		// write spans and metrics, the operators' jobs metrics (reconcile's drift).
		{"projects", p, sa("coupon-issue"), "roles/telemetry.tracesWriter"},
		{"projects", p, sa("coupon-relay"), "roles/telemetry.tracesWriter"},
		{"projects", p, sa("coupon-redeem"), "roles/telemetry.tracesWriter"},
		{"projects", p, sa("coupon-issue"), "roles/telemetry.metricsWriter"},
		{"projects", p, sa("coupon-relay"), "roles/telemetry.metricsWriter"},
		{"projects", p, sa("coupon-redeem"), "roles/telemetry.metricsWriter"},
		{"projects", p, sa("coupon-admin"), "roles/telemetry.metricsWriter"},
		// Who may call the functions: the gateway IssueCoupon and RedeemCoupon (the cart and the
		// POS go through it), the scheduler RelayOutbox; nobody else.
		{"run services", "issue-coupon", gateway, "roles/run.invoker"},
		{"run services", "coupon-redeem", gateway, "roles/run.invoker"},
		{"run services", "relay-outbox", sa("coupon-scheduler"), "roles/run.invoker"},
		// The console: IAP's service agent invokes it (named by gcloud, a stand-in under
		// --dry-run), once IAP has let one of the promotion team's group through.
		{"run services", "coupon-console", `serviceAccount:\$IAP_SERVICE_AGENT`, "roles/run.invoker"},
		{"beta iap web", "coupon-console", "group:" + testConsoleGroup, "roles/iap.httpsResourceAccessor"},
		// The daily operator jobs: started by the scheduler only.
		{"run jobs", "coupon-reconcile", sa("coupon-scheduler"), "roles/run.invoker"},
		{"run jobs", "coupon-prune", sa("coupon-scheduler"), "roles/run.invoker"},
	}
	var got []binding
	for _, name := range []string{"setup.sh", "access.sh", "daily.sh"} {
		args := append([]string{"--project", p, "--dry-run"}, requiredFlags(t, name)...)
		if takesFlag(t, name, "--gateway-sa") {
			args = append(args, "--gateway-sa", strings.TrimPrefix(gateway, "serviceAccount:"))
		}
		out, err := script(t, name, args...)
		if err != nil {
			t.Fatalf("%s --dry-run: %v\n%s", name, err, out)
		}
		got = append(got, bindings(t, out)...)
	}
	for _, b := range got {
		if !slices.Contains(want, b) {
			t.Errorf("unexpected grant: %s", b)
		}
	}
	for _, b := range want {
		if !slices.Contains(got, b) {
			t.Errorf("missing grant: %s", b)
		}
	}
}

// TestNotPublic: no deployable file and no dry run opens a function to unauthenticated
// callers, each deploy step says --no-allow-unauthenticated, and the console's puts IAP in
// front (--iap).
func TestNotPublic(t *testing.T) {
	public := regexp.MustCompile(`allUsers|allAuthenticatedUsers|--allow-unauthenticated|--ingress[= ]all\b.*--allow`)
	for _, f := range deployableFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if m := public.Find(b); m != nil {
			t.Errorf("%s opens a function to the public: %q", f, m)
		}
	}
	for _, name := range []string{"setup.sh", "access.sh", "daily.sh"} {
		out, err := script(t, name, append([]string{"--project", testProject, "--dry-run"}, requiredFlags(t, name)...)...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		if m := public.FindString(out); m != "" {
			t.Errorf("%s --dry-run opens a function to the public: %q", name, m)
		}
	}
	for _, s := range loadCloudBuild(t).Steps {
		if slices.Contains(s.GetArgs(), "deploy") && !slices.Contains(s.GetArgs(), "--no-allow-unauthenticated") {
			t.Errorf("step %s deploys without --no-allow-unauthenticated", s.GetId())
		}
		if slices.Contains(s.GetArgs(), "coupon-console") && !slices.Contains(s.GetArgs(), "--iap") {
			t.Errorf("step %s deploys the console without IAP in front (--iap)", s.GetId())
		}
	}
}

// deployableFiles are the files a deploy reads or runs.
func deployableFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"../cloudbuild.yaml"}
	for _, pattern := range []string{"*.sh", "*.yaml"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	return files
}

// placeholder matches text that stands for a value someone was meant to fill in. In
// cloudbuild.yaml, $PROJECT_ID, $PROJECT_NUMBER and their ${...} forms are Cloud Build's
// substitutions, not placeholders; they are removed before matching.
var placeholder = regexp.MustCompile(`PROJECT_ID|PROJECT_NUMBER|YOUR[_-]|CHANGE[_-]?ME|REPLACE[_-]?ME|<[a-z][a-z _-]*>|example\.(com|org)|TODO|FIXME|XXX`)

// TestNoPlaceholders fails on any placeholder left in a deployable file or in the environment
// files that deploy/env.sh generates.
func TestNoPlaceholders(t *testing.T) {
	files := deployableFiles(t)
	out := t.TempDir()
	if o, err := script(t, "env.sh", "--project", testProject, "--project-number", testProjectNumber, "--out", out); err != nil {
		t.Fatalf("env.sh: %v\n%s", err, o)
	}
	for _, name := range []string{"issue", "relay", "redeem", "console"} {
		files = append(files, filepath.Join(out, name+".env.yaml"))
	}
	substitution := regexp.MustCompile(`\$\{?PROJECT_(ID|NUMBER)\}?`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasSuffix(f, "cloudbuild.yaml") {
				line = substitution.ReplaceAllString(line, "")
			}
			if m := placeholder.FindString(line); m != "" {
				t.Errorf("%s:%d: placeholder %q left in a deployable file", f, i+1, m)
			}
		}
	}
}

// TestDeployedServices: each deploy step (IssueCoupon, RelayOutbox, RedeemCoupon, the console)
// builds a main package that exists and reads an environment file, generated by deploy/env.sh,
// that the function's configuration loaders accept, with the secrets it mounts; the console's names the audience IAP signs for on the
// service it is deployed as, and exports no telemetry (its account may write none).
func TestDeployedServices(t *testing.T) {
	cb := loadCloudBuild(t)
	envDir := generatedEnv(t, cb)
	deployed := 0
	runsAs := map[string]string{} // runtime service account: the step deploying a service as it
	for _, s := range cb.GetSteps() {
		buildable, envFile := argValue(s.GetArgs(), "--set-build-env-vars=GOOGLE_BUILDABLE="), argValue(s.GetArgs(), "--env-vars-file=")
		if buildable == "" {
			continue
		}
		deployed++
		// Each service its own account, so its own database login and its own grants.
		if other, ok := runsAs[argValue(s.GetArgs(), "--service-account=")]; ok {
			t.Errorf("steps %s and %s deploy as the same service account %s", other, s.GetId(), argValue(s.GetArgs(), "--service-account="))
		}
		runsAs[argValue(s.GetArgs(), "--service-account=")] = s.GetId()
		pkg, err := build.ImportDir(filepath.Join("..", buildable), 0)
		if err != nil || pkg.Name != "main" {
			t.Errorf("step %s: GOOGLE_BUILDABLE %s is not a main package: %v", s.GetId(), buildable, err)
		}
		env := loadEnv(t, filepath.Join(envDir, filepath.Base(envFile)))
		// Cloud Run reserves FUNCTION_TARGET for its function deployments; each deployable main
		// names its own function.
		if v, ok := env["FUNCTION_TARGET"]; ok {
			t.Errorf("%s sets FUNCTION_TARGET=%q, which nothing deployed reads and Cloud Run reserves", envFile, v)
		}
		if want := testProject + ":asia-northeast1:coupon-db"; env["INSTANCE_CONNECTION_NAME"] != want {
			t.Errorf("%s: INSTANCE_CONNECTION_NAME %q, want %q", envFile, env["INSTANCE_CONNECTION_NAME"], want)
		}
		// The IAM database user is the runtime service account's, which Cloud SQL names by the
		// account's email without ".gserviceaccount.com".
		if runtime := argValue(s.GetArgs(), "--service-account="); substitute(cb, runtime) != env["DB_USER"]+".gserviceaccount.com" {
			t.Errorf("step %s: DB_USER %q is not the runtime service account %s", s.GetId(), env["DB_USER"], substitute(cb, runtime))
		}
		for k, v := range env {
			t.Setenv(k, v)
		}
		// Secrets are mounted as environment variables by --set-secrets=NAME=secret:version.
		if secrets := argValue(s.GetArgs(), "--set-secrets="); secrets != "" {
			for _, kv := range strings.Split(secrets, ",") {
				name, _, _ := strings.Cut(kv, "=")
				t.Setenv(name, "from-secret-manager")
			}
		}
		if _, err := db.ConfigFromEnv(); err != nil {
			t.Errorf("%s: %v", envFile, err)
		}
		switch buildable {
		case "./functions/issue/cmd":
			_, err = issuance.ConfigFromEnv()
		case "./functions/relay/cmd":
			_, err = outbox.ConfigFromEnv()
		case "./functions/redeem/cmd":
			// RedeemCoupon reads IssueCoupon's budget and timeouts (functions/redeem, Open).
			_, err = issuance.ConfigFromEnv()
		case "./console/cmd":
			err = consoleEnv(cb, s, env)
		default:
			err = fmt.Errorf("step %s builds %s, none of the functions nor the console", s.GetId(), buildable)
		}
		if err != nil {
			t.Errorf("%s: %v", envFile, err)
		}
	}
	if deployed != 4 {
		t.Errorf("deploy steps: %d, want IssueCoupon, RelayOutbox, RedeemCoupon and the console", deployed)
	}
}

// consoleEnv checks the console's environment as deployed by step s: IAP_AUDIENCE is the
// audience IAP on that Cloud Run service signs its assertions for, and nothing is exported to
// the Telemetry API, which the console's account may not write to.
func consoleEnv(cb *cloudbuildpb.Build, s *cloudbuildpb.BuildStep, env map[string]string) error {
	var errs []error
	service := s.GetArgs()[slices.Index(s.GetArgs(), "deploy")+1]
	region := substitute(cb, argValue(s.GetArgs(), "--region="))
	if want := "/projects/" + testProjectNumber + "/locations/" + region + "/services/" + service; env["IAP_AUDIENCE"] != want {
		errs = append(errs, fmt.Errorf("IAP_AUDIENCE %q, want %q", env["IAP_AUDIENCE"], want))
	}
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"} {
		if env[k] != "none" {
			errs = append(errs, fmt.Errorf("%s=%q: want none (coupon-console holds no telemetry writer role)", k, env[k]))
		}
	}
	return errors.Join(errs...)
}

// TestMigrationIdentity: the migrate step logs in as the IAM database user of the account the
// build runs as (cloudbuild.yaml's serviceAccount), and deploy/setup.sh creates that user.
func TestMigrationIdentity(t *testing.T) {
	cb := loadCloudBuild(t)
	i := slices.IndexFunc(cb.GetSteps(), func(s *cloudbuildpb.BuildStep) bool { return s.GetId() == "migrate" })
	if i < 0 {
		t.Fatal("no migrate step")
	}
	var user string
	for _, e := range cb.GetSteps()[i].GetEnv() {
		if v, ok := strings.CutPrefix(e, "DB_USER="); ok {
			user = substitute(cb, v)
		}
	}
	runsAs := substitute(cb, cb.GetServiceAccount())
	if want := "projects/" + testProject + "/serviceAccounts/" + user + ".gserviceaccount.com"; user == "" || runsAs != want {
		t.Errorf("migrate logs in as %q, but the build runs as %q", user, runsAs)
	}
	setup, err := script(t, "setup.sh", "--project", testProject, "--dry-run")
	if err != nil {
		t.Fatalf("setup.sh: %v\n%s", err, setup)
	}
	if !strings.Contains(setup, "gcloud sql users create "+user+" ") {
		t.Errorf("setup.sh does not create the IAM database user %s", user)
	}
}

// TestGrantRoles: the database group roles go to the IAM users of the functions, of the
// console and of the operators, as the migrations' own user; and each service cloudbuild.yaml
// deploys logs in (DB_USER of its generated environment) as a user that setup.sh creates and
// grant-roles.sh makes a member of its own group role alone.
func TestGrantRoles(t *testing.T) {
	out, err := script(t, "grant-roles.sh", "--project", testProject, "--dry-run")
	if err != nil {
		t.Fatalf("grant-roles.sh: %v\n%s", err, out)
	}
	for _, want := range []string{
		`GRANT coupon_issue TO "coupon-issue@` + testProject + `.iam"`,
		`GRANT coupon_relay TO "coupon-relay@` + testProject + `.iam"`,
		`GRANT coupon_redeem TO "coupon-redeem@` + testProject + `.iam"`,
		`GRANT coupon_console TO "coupon-console@` + testProject + `.iam"`,
		`GRANT coupon_admin TO "coupon-admin@` + testProject + `.iam"`,
		"+ cloud-sql-proxy --auto-iam-authn",
		"user=coupon-deploy@" + testProject + ".iam",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("grant-roles.sh --dry-run lacks %q:\n%s", want, out)
		}
	}

	granted := map[string][]string{} // IAM database user: its group roles
	for _, m := range regexp.MustCompile(`GRANT (\w+) TO "([^"]+)"`).FindAllStringSubmatch(out, -1) {
		if !slices.Contains(granted[m[2]], m[1]) {
			granted[m[2]] = append(granted[m[2]], m[1])
		}
	}
	setup, err := script(t, "setup.sh", "--project", testProject, "--dry-run")
	if err != nil {
		t.Fatalf("setup.sh: %v\n%s", err, setup)
	}
	roleOf := map[string]string{"issue-coupon": "coupon_issue", "relay-outbox": "coupon_relay",
		"coupon-redeem": "coupon_redeem", "coupon-console": "coupon_console"}
	cb := loadCloudBuild(t)
	envDir := generatedEnv(t, cb)
	for _, s := range cb.GetSteps() {
		envFile := argValue(s.GetArgs(), "--env-vars-file=")
		i := slices.Index(s.GetArgs(), "deploy")
		if envFile == "" || i < 0 || i+1 >= len(s.GetArgs()) {
			continue
		}
		service := s.GetArgs()[i+1]
		user := loadEnv(t, filepath.Join(envDir, filepath.Base(envFile)))["DB_USER"]
		if want, ok := roleOf[service]; !ok || !slices.Equal(granted[user], []string{want}) {
			t.Errorf("step %s deploys %s logging in as %q, granted %q by grant-roles.sh: want its own role %q alone",
				s.GetId(), service, user, granted[user], want)
		}
		if !strings.Contains(setup, "gcloud sql users create "+user+" ") {
			t.Errorf("step %s deploys %s logging in as %q, which setup.sh does not create", s.GetId(), service, user)
		}
	}
}

// Connection budget (docs/deploy.md, "Connections"): what couponctl's operators may hold at
// once, in connections: two sessions of pgxpool's default pool (max(4, CPUs) on a laptop).
const operatorConns = 2 * 4

// headroom is the share of max_connections the budget may use: the rest is for Cloud SQL's
// reserved superuser connections, its own agents, and a rolling deploy's old revision.
const headroom = 0.75

// TestConnectionBudget: instances x pool of both functions and the console, plus the migration
// and the operators, stays under the Cloud SQL instance's max_connections with headroom.
func TestConnectionBudget(t *testing.T) {
	cb := loadCloudBuild(t)
	envDir := generatedEnv(t, cb)
	total := operatorConns
	for _, s := range cb.GetSteps() {
		switch {
		case argValue(s.GetArgs(), "--env-vars-file=") != "":
			env := loadEnv(t, filepath.Join(envDir, filepath.Base(argValue(s.GetArgs(), "--env-vars-file="))))
			pool := atoi(t, env["DB_POOL_MAX_CONNS"])
			instances := atoi(t, argValue(s.GetArgs(), "--max-instances="))
			t.Logf("%s: %d instances x %d connections", s.GetId(), instances, pool)
			total += instances * pool
		case s.GetId() == "migrate":
			for _, e := range s.GetEnv() {
				if v, ok := strings.CutPrefix(e, "DB_POOL_MAX_CONNS="); ok {
					total += atoi(t, v)
				}
			}
		}
	}
	b, err := os.ReadFile("setup.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`DB_MAX_CONNECTIONS=(\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("setup.sh sets no DB_MAX_CONNECTIONS")
	}
	limit := atoi(t, string(m[1]))
	daily, err := os.ReadFile("daily.sh")
	if err != nil {
		t.Fatal(err)
	}
	jm := regexp.MustCompile(`JOB_POOL=(\d+)`).FindSubmatch(daily)
	if jm == nil {
		t.Fatal("daily.sh sets no JOB_POOL")
	}
	t.Logf("daily jobs: 2 x %s connections", jm[1])
	total += 2 * atoi(t, string(jm[1])) // reconcile and prune, at different hours, counted as if together
	t.Logf("connections: %d of max_connections %d (budget %.0f)", total, limit, headroom*float64(limit))
	if float64(total) > headroom*float64(limit) {
		t.Errorf("instances x pool + migration + operators = %d connections, over %.0f%% of max_connections %d",
			total, 100*headroom, limit)
	}
}

// TestTimeouts: the request timeouts of IssueCoupon and RedeemCoupon, both called by the app
// gateway, are above its 3 s budget; RelayOutbox's run budget < the Scheduler's attempt deadline
// <= its request timeout.
func TestTimeouts(t *testing.T) {
	cb := loadCloudBuild(t)
	envDir := generatedEnv(t, cb)
	timeouts := map[string]time.Duration{}
	for _, s := range cb.GetSteps() {
		if v := argValue(s.GetArgs(), "--timeout="); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatal(err)
			}
			timeouts[filepath.Base(argValue(s.GetArgs(), "--env-vars-file="))] = d
		}
	}
	for env, fn := range map[string]string{"issue.env.yaml": "IssueCoupon", "redeem.env.yaml": "RedeemCoupon"} {
		if d := timeouts[env]; d <= issuance.AppTimeout {
			t.Errorf("%s's request timeout %s: want above the app's %s", fn, d, issuance.AppTimeout)
		}
	}
	budget, err := time.ParseDuration(loadEnv(t, filepath.Join(envDir, "relay.env.yaml"))["RELAY_RUN_BUDGET"])
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("access.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`ATTEMPT_DEADLINE=(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("access.sh sets no ATTEMPT_DEADLINE")
	}
	deadline, err := time.ParseDuration(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	if relay := timeouts["relay.env.yaml"]; !(budget < deadline && deadline <= relay) {
		t.Errorf("relay: run budget %s, attempt deadline %s, request timeout %s: want budget < deadline <= timeout",
			budget, deadline, relay)
	}
}

// TestShellcheck runs shellcheck on the scripts when it is installed (.ci/run installs it).
func TestShellcheck(t *testing.T) {
	if _, err := exec.LookPath("shellcheck"); err != nil {
		t.Skip("shellcheck not installed (apt-get install shellcheck)")
	}
	scripts, _ := filepath.Glob("*.sh")
	out, err := exec.Command("shellcheck", append([]string{"-x"}, scripts...)...).CombinedOutput()
	if err != nil {
		t.Errorf("shellcheck: %v\n%s", err, out)
	}
}

// TestUsage: every script answers --help and refuses a missing project, an unknown flag, a
// flag without its value (in either form) and a value given to --dry-run; env.sh and
// access.sh also refuse their other required flags missing or malformed.
func TestUsage(t *testing.T) {
	scripts, _ := filepath.Glob("*.sh")
	for _, s := range scripts {
		if s == "lib.sh" {
			continue
		}
		if out, err := script(t, s, "--help"); err != nil || !strings.Contains(out, "Usage: deploy/"+s) {
			t.Errorf("%s --help: %v\n%s", s, err, out)
		}
		// Only the required flags: every optional one has its default.
		args := append([]string{"--project", testProject, "--dry-run"}, requiredFlags(t, s)...)
		if out, err := script(t, s, args...); err != nil {
			t.Errorf("%s %v: %v\n%s", s, args, err, out)
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"--dry-run"}, "--project is required"},
			{[]string{"--project", testProject, "--bogus"}, "unknown flag --bogus"},
			{[]string{"--project=" + testProject, "--bogus=1"}, "unknown flag --bogus"},
			{[]string{"--project"}, "--project needs a value"},
			{[]string{"--project", "--dry-run"}, "--project needs a value"},
			{[]string{"--project="}, "--project needs a value"},
			{[]string{"--project", testProject, "--dry-run=yes"}, "--dry-run takes no value"},
			{[]string{"--project", testProject, "--notification-channel", "x", "--issue-revision", "y", "--out", "z", "--gateway-sa", "g"}, "unknown flag"},
		} {
			if out, err := script(t, s, c.args...); err == nil || !strings.Contains(out, c.want) {
				t.Errorf("%s %v: %v, want exit 2 and %q\n%s", s, c.args, err, c.want, out)
			}
		}
	}
	for _, c := range []struct {
		script string
		args   []string
		want   string
	}{
		{"env.sh", []string{"--out", t.TempDir()}, "--project-number is required"},
		{"env.sh", []string{"--out", t.TempDir(), "--project-number", testProject}, "not a project number"},
		{"access.sh", nil, "--console-group is required"},
		{"access.sh", []string{"--console-group", "promotion-team"}, "not a group's email"},
	} {
		args := append([]string{"--project", testProject, "--dry-run"}, c.args...)
		if out, err := script(t, c.script, args...); err == nil || !strings.Contains(out, c.want) {
			t.Errorf("%s %v: %v, want exit 2 and %q\n%s", c.script, args, err, c.want, out)
		}
	}
}

// TestFlagForms: every script takes --flag VALUE and --flag=VALUE alike, as gcloud does: a dry
// run prints the same commands either way.
func TestFlagForms(t *testing.T) {
	extra := map[string][]string{
		"monitoring.sh": {"--notification-channel", testChannel},
		"rollback.sh": {"--issue-revision", "issue-coupon-00007", "--relay-revision", "relay-outbox-00003",
			"--redeem-revision", "coupon-redeem-00004", "--console-revision", "coupon-console-00002"},
	}
	scripts, _ := filepath.Glob("*.sh")
	for _, s := range scripts {
		if s == "lib.sh" {
			continue
		}
		spaced := append(append([]string{"--project", testProject}, requiredFlags(t, s)...), extra[s]...)
		for _, f := range [][2]string{{"--region", "asia-northeast2"}, {"--instance", "db2"}} {
			if takesFlag(t, s, f[0]) {
				spaced = append(spaced, f[0], f[1])
			}
		}
		var joined []string
		for i := 0; i < len(spaced); i += 2 {
			joined = append(joined, spaced[i]+"="+spaced[i+1])
		}
		a, errA := script(t, s, append(spaced, "--dry-run")...)
		b, errB := script(t, s, append(joined, "--dry-run")...)
		if errA != nil || errB != nil || a != b {
			t.Errorf("%s: --flag VALUE and --flag=VALUE differ (%v, %v):\n%s\n---\n%s", s, errA, errB, a, b)
		}
		if !strings.Contains(a, "asia-northeast2") && takesFlag(t, s, "--region") && s != "env.sh" {
			t.Errorf("%s --region asia-northeast2: the region is not in the commands:\n%s", s, a)
		}
	}
}

// takesFlag reports whether deploy/SCRIPT names flag in its usage line, the flags it takes.
func takesFlag(t *testing.T, script, flag string) bool {
	t.Helper()
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`usage="Usage: deploy/` + regexp.QuoteMeta(script) + `(.*)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s has no usage line", script)
	}
	return regexp.MustCompile(`[ \[]` + regexp.QuoteMeta(flag) + `[ \]]`).Match(append(m[1], ' '))
}

// generatedEnv runs deploy/env.sh as the env-files step of cloudbuild.yaml does, for
// testProject, and returns the directory it wrote.
func generatedEnv(t *testing.T, cb *cloudbuildpb.Build) string {
	t.Helper()
	i := slices.IndexFunc(cb.GetSteps(), func(s *cloudbuildpb.BuildStep) bool { return slices.Contains(s.GetArgs(), "deploy/env.sh") })
	if i < 0 {
		t.Fatal("cloudbuild.yaml: no step runs deploy/env.sh")
	}
	dir := t.TempDir()
	var args []string
	for _, a := range cb.GetSteps()[i].GetArgs()[1:] {
		if strings.HasPrefix(a, "--out=") {
			a = "--out=" + dir
		}
		args = append(args, substitute(cb, a))
	}
	if out, err := script(t, "env.sh", args...); err != nil {
		t.Fatalf("env.sh %v: %v\n%s", args, err, out)
	}
	return dir
}

func argValue(args []string, prefix string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, prefix); ok {
			return v
		}
	}
	return ""
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

func loadEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]string // Cloud Run wants every value a string
	if err := yaml.NewDecoder(bytes.NewReader(b)).Decode(&env); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return env
}

// TestTelemetryIsExported: the three deployed functions and the reconcile job export through
// shared/telemetry.GoogleExporter (the dashboard and alerts of deploy/monitoring read what they
// export), with a sampler the SDK accepts (it falls back silently on a misspelt one, so the
// error it reports is caught here), and setup.sh enables the APIs they write to. The grants
// are in TestIAMBindings.
func TestTelemetryIsExported(t *testing.T) {
	cb := loadCloudBuild(t)
	envDir := generatedEnv(t, cb)
	defer otel.SetErrorHandler(otel.GetErrorHandler())
	for _, fn := range []string{"issue", "relay", "redeem"} {
		env := loadEnv(t, filepath.Join(envDir, fn+".env.yaml"))
		for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"} {
			if env[k] != telemetry.GoogleExporter {
				t.Errorf("%s.env.yaml: %s=%q, want %q", fn, k, env[k], telemetry.GoogleExporter)
			}
		}
		if env["GOOGLE_CLOUD_PROJECT"] != testProject {
			t.Errorf("%s.env.yaml: GOOGLE_CLOUD_PROJECT=%q, want %q (the logs' trace field, gcp.project_id)",
				fn, env["GOOGLE_CLOUD_PROJECT"], testProject)
		}
		t.Setenv("OTEL_TRACES_SAMPLER", env["OTEL_TRACES_SAMPLER"])
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", env["OTEL_TRACES_SAMPLER_ARG"])
		var refused []error
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { refused = append(refused, err) }))
		_ = sdktrace.NewTracerProvider().Shutdown(context.Background())
		if len(refused) > 0 {
			t.Errorf("%s.env.yaml: the SDK refuses OTEL_TRACES_SAMPLER=%q ARG=%q: %v",
				fn, env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"], refused)
		}
	}

	out, err := script(t, "daily.sh", "--project", testProject, "--dry-run")
	if err != nil {
		t.Fatalf("daily.sh: %v\n%s", err, out)
	}
	reconcile := regexp.MustCompile(`(?m)^\+ gcloud run jobs deploy coupon-reconcile .*$`).FindString(out)
	if !strings.Contains(reconcile, "OTEL_METRICS_EXPORTER="+telemetry.GoogleExporter) {
		t.Errorf("the reconcile job does not export its drift metrics: %s", reconcile)
	}

	out, err = script(t, "setup.sh", "--project", testProject, "--dry-run")
	if err != nil {
		t.Fatalf("setup.sh: %v\n%s", err, out)
	}
	enable := regexp.MustCompile(`(?m)^\+ gcloud services enable .*$`).FindString(out)
	for _, api := range []string{"telemetry.googleapis.com", "cloudtrace.googleapis.com", "monitoring.googleapis.com"} {
		if !strings.Contains(enable, api) {
			t.Errorf("setup.sh does not enable %s: %s", api, enable)
		}
	}
}

// TestRollbackBeforeTheConsole: in the release that first deployed the console, or
// RedeemCoupon (coupon-redeem), that service has one revision: rollback.sh rolls the other
// services back and leaves it on it, saying so; IssueCoupon or RelayOutbox with one revision
// still stops the script before any traffic moves.
func TestRollbackBeforeTheConsole(t *testing.T) {
	services := []string{"issue-coupon", "relay-outbox", "coupon-redeem", "coupon-console"}
	for _, c := range []struct {
		single  string // the service with one revision
		wantErr bool
	}{{"coupon-console", false}, {"coupon-redeem", false}, {"relay-outbox", true}, {"issue-coupon", true}} {
		bin := t.TempDir()
		log := filepath.Join(bin, "calls")
		// A gcloud that lists two revisions of each service but c.single, and records each call.
		fake := fmt.Sprintf(`#!/bin/sh
echo "gcloud $*" >> %s
case "$*" in
  "run revisions list --service=%s "*) echo %s-00001 ;;
  "run revisions list --service="*) svc=${4#--service=}; printf '%%s-00002\n%%s-00001\n' "$svc" "$svc" ;;
esac
`, log, c.single, c.single)
		if err := os.WriteFile(filepath.Join(bin, "gcloud"), []byte(fake), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("bash", "rollback.sh", "--project", testProject)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		calls, _ := os.ReadFile(log)
		moved := regexp.MustCompile(`(?m)^gcloud run services update-traffic (\S+) .*--to-revisions=(\S+)$`).FindAllStringSubmatch(string(calls), -1)
		if c.wantErr {
			if err == nil || len(moved) > 0 || !strings.Contains(string(out), c.single+" has no earlier revision to roll back to") {
				t.Errorf("%s with one revision: %v, traffic moved %q, want exit 2 before any move\n%s", c.single, err, moved, out)
			}
			continue
		}
		var want [][]string
		for _, svc := range services {
			if svc != c.single {
				want = append(want, []string{"", svc, svc + "-00001=100"})
			}
		}
		for i := range moved {
			moved[i][0] = ""
		}
		if err != nil || !slices.EqualFunc(moved, want, slices.Equal) || !strings.Contains(string(out), c.single+" has no earlier revision: left on its newest revision") {
			t.Errorf("%s with one revision: %v, traffic moved %q, want the others to their previous revision and %s left\n%s", c.single, err, moved, c.single, out)
		}
	}
}

// TestAccessRefusesAnotherCaller: the gateway is the only caller of IssueCoupon and of
// RedeemCoupon. access.sh reads each service's policy back and stops, naming the binding, when
// another account may invoke it: the POS's own account on coupon-redeem (the POS and the cart go
// through the gateway), or anyone on issue-coupon; with the policies as granted it succeeds.
func TestAccessRefusesAnotherCaller(t *testing.T) {
	const pos = "serviceAccount:pos-terminal@store-pos-1.iam.gserviceaccount.com"
	gateway := sa("coupon-gateway")
	for _, extraOn := range []string{"", "coupon-redeem", "issue-coupon"} {
		bin := t.TempDir()
		log := filepath.Join(bin, "calls")
		// A gcloud that answers what access.sh reads, each policy holding what access.sh granted,
		// plus the POS's binding on extraOn, and records each call.
		fake := fmt.Sprintf(`#!/bin/sh
echo "gcloud $*" >> %s
case "$*" in
  "beta services identity create "*) echo service-%s@gcp-sa-iap.iam.gserviceaccount.com ;;
  "run services get-iam-policy issue-coupon "*|"run services get-iam-policy coupon-redeem "*)
    printf 'roles/run.invoker\t%%s\n' %s
    [ "$4" = "%s" ] && printf 'roles/run.invoker\t%%s\n' %s ;;
  "run services describe "*) echo https://relay-outbox-4a2b-an.a.run.app ;;
esac
exit 0
`, log, testProjectNumber, gateway, extraOn, pos)
		if err := os.WriteFile(filepath.Join(bin, "gcloud"), []byte(fake), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("bash", "access.sh", "--project", testProject, "--console-group", testConsoleGroup)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		calls, _ := os.ReadFile(log)
		if extraOn == "" {
			if err != nil || !strings.Contains(string(calls), "run services get-iam-policy coupon-redeem ") {
				t.Errorf("access.sh with the policies as granted: %v, want success after reading coupon-redeem's policy\n%s\n%s", err, out, calls)
			}
			continue
		}
		want := extraOn + `: unexpected binding "roles/run.invoker	` + pos + `"`
		if err == nil || !strings.Contains(string(out), want) || strings.Contains(string(calls), "scheduler jobs") {
			t.Errorf("access.sh with %s also on %s: %v, want exit 2 with %q before the scheduler job\n%s", pos, extraOn, err, want, out)
		}
	}
}
