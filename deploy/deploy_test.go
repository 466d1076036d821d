package deploy_test

import (
	"go/build"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox"
)

type cloudBuild struct {
	Substitutions map[string]string `yaml:"substitutions"`
	Steps         []struct {
		ID      string   `yaml:"id"`
		Name    string   `yaml:"name"`
		Args    []string `yaml:"args"`
		Env     []string `yaml:"env"`
		WaitFor []string `yaml:"waitFor"`
	} `yaml:"steps"`
}

// builtinSubstitutions are the ones Cloud Build provides itself (Cloud Build docs,
// "Substituting variable values").
var builtinSubstitutions = []string{"PROJECT_ID", "PROJECT_NUMBER", "BUILD_ID", "LOCATION", "TRIGGER_NAME",
	"COMMIT_SHA", "SHORT_SHA", "REVISION_ID", "BRANCH_NAME", "TAG_NAME", "REPO_NAME", "REPO_FULL_NAME", "SERVICE_ACCOUNT_EMAIL"}

func loadCloudBuild(t *testing.T) cloudBuild {
	t.Helper()
	b, err := os.ReadFile("../cloudbuild.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cb cloudBuild
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&cb); err != nil {
		t.Fatalf("cloudbuild.yaml: %v", err)
	}
	return cb
}

// TestCloudBuildSteps: ids unique, waitFor names earlier steps, and every $VAR is a defined
// user substitution or a built-in (Cloud Build refuses others; a shell variable must be $$VAR).
func TestCloudBuildSteps(t *testing.T) {
	cb := loadCloudBuild(t)
	ref := regexp.MustCompile(`\$\$|\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)
	seen := map[string]bool{}
	for _, s := range cb.Steps {
		if s.ID == "" || s.Name == "" || seen[s.ID] {
			t.Errorf("step %q: needs a unique id and an image name", s.ID)
		}
		for _, w := range s.WaitFor {
			if !seen[w] {
				t.Errorf("step %s waits for %q, which is not an earlier step", s.ID, w)
			}
		}
		seen[s.ID] = true
		for _, text := range append(slices.Clone(s.Args), s.Env...) {
			for _, m := range ref.FindAllStringSubmatch(text, -1) {
				name := m[1]
				if m[0] == "$$" {
					continue
				}
				if _, ok := cb.Substitutions[name]; !ok && !slices.Contains(builtinSubstitutions, name) {
					t.Errorf("step %s: $%s is no substitution (write $$%s for a shell variable)", s.ID, name, name)
				}
			}
		}
	}
}

// TestDeployedServices: each deploy step builds a main package that exists and reads an
// environment file that the function's configuration loaders accept.
func TestDeployedServices(t *testing.T) {
	cb := loadCloudBuild(t)
	deployed := 0
	for _, s := range cb.Steps {
		buildable, envFile := argValue(s.Args, "--set-build-env-vars=GOOGLE_BUILDABLE="), argValue(s.Args, "--env-vars-file=")
		if buildable == "" {
			continue
		}
		deployed++
		pkg, err := build.ImportDir(filepath.Join("..", buildable), 0)
		if err != nil || pkg.Name != "main" {
			t.Errorf("step %s: GOOGLE_BUILDABLE %s is not a main package: %v", s.ID, buildable, err)
		}
		env := loadEnv(t, filepath.Join("..", envFile))
		target := env["FUNCTION_TARGET"]
		if !registers(t, filepath.Join("..", filepath.Dir(buildable)), target) {
			t.Errorf("step %s: FUNCTION_TARGET %q is not registered with functions.HTTP in %s", s.ID, target, filepath.Dir(buildable))
		}
		for k, v := range env {
			t.Setenv(k, v)
		}
		// Secrets are mounted as environment variables by --set-secrets=NAME=secret:version.
		if secrets := argValue(s.Args, "--set-secrets="); secrets != "" {
			for _, kv := range strings.Split(secrets, ",") {
				name, _, _ := strings.Cut(kv, "=")
				t.Setenv(name, "from-secret-manager")
			}
		}
		if _, err := db.ConfigFromEnv(); err != nil {
			t.Errorf("%s: %v", envFile, err)
		}
		switch target {
		case "IssueCoupon":
			_, err = issuance.ConfigFromEnv()
		case "RelayOutbox":
			_, err = outbox.ConfigFromEnv()
		}
		if err != nil {
			t.Errorf("%s: %v", envFile, err)
		}
	}
	if deployed != 2 {
		t.Errorf("deploy steps: %d, want IssueCoupon and RelayOutbox", deployed)
	}
}

func argValue(args []string, prefix string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, prefix); ok {
			return v
		}
	}
	return ""
}

func loadEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]string // Cloud Run wants every value a string
	if err := yaml.Unmarshal(b, &env); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return env
}

// registers reports whether a Go file in dir registers target with functions.HTTP.
func registers(t *testing.T, dir, target string) bool {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), `functions.HTTP("`+target+`"`) {
			return true
		}
	}
	return false
}
