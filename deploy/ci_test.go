package deploy_test

import (
	"cloud.google.com/go/cloudbuild/apiv1/v2/cloudbuildpb"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// ciStep runs cloudbuild.yaml's test step in ws as Cloud Build runs it (its entrypoint and
// arguments, substituted), with stand-ins first on PATH for go (recording each command line
// in the returned file, and failing `go test` when goTestFails), apt-get and useradd: what
// the step installs, vets and tests is not this test's business, only that it runs there.
func ciStep(t *testing.T, ws string, goTestFails bool) (string, string, error) {
	t.Helper()
	return ciStepWithPath(t, ws, goTestFails, os.Getenv("PATH"))
}

// ciStepWithPath is [ciStep] with the stand-ins put first on path instead of this PATH.
func ciStepWithPath(t *testing.T, ws string, goTestFails bool, path string) (string, string, error) {
	t.Helper()
	cb := loadCloudBuild(t)
	i := slices.IndexFunc(cb.GetSteps(), func(s *cloudbuildpb.BuildStep) bool { return s.GetId() == "test" })
	if i < 0 {
		t.Fatal("cloudbuild.yaml: no test step")
	}
	s := cb.GetSteps()[i]
	bin := t.TempDir()
	log := filepath.Join(bin, "go.log")
	fail := ""
	if goTestFails {
		fail = `[ "$1" = test ] && exit 1` + "\n"
	}
	stubs := map[string]string{
		"go":      "#!/bin/sh\necho \"go $*\" >> " + log + "\n" + fail + "exit 0\n",
		"apt-get": "#!/bin/sh\necho \"apt-get $*\" >> " + log + "\nexit 0\n",
		"useradd": "#!/bin/sh\necho \"useradd $*\" >> " + log + "\nexit 0\n",
	}
	for name, body := range stubs {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := make([]string, len(s.GetArgs()))
	for i, a := range s.GetArgs() {
		args[i] = substitute(cb, a)
	}
	cmd := exec.Command(s.GetEntrypoint(), args...)
	cmd.Dir = ws
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+path)
	out, err := cmd.CombinedOutput()
	ran, _ := os.ReadFile(log)
	return string(out), string(ran), err
}

// TestCIInstallsWhatIsMissing: on a machine without shellcheck and Debian's chromium (the
// console's browser tests drive it), the test step installs both with apt-get, in one install
// after one update, before it vets and tests; what is there already is not installed again.
func TestCIInstallsWhatIsMissing(t *testing.T) {
	t.Parallel()
	real := realGcloud(t)
	ws := uploadedTree(t, real)
	path := pathWithout(t, "chromium", "shellcheck")
	out, ran, err := ciStepWithPath(t, ws, false, path)
	if err != nil {
		t.Fatalf("the test step without chromium and shellcheck: %v\n%s", err, out)
	}
	var installs, updates []string
	for _, line := range strings.Split(ran, "\n") {
		switch {
		case strings.HasPrefix(line, "apt-get install "):
			installs = append(installs, line)
		case strings.HasPrefix(line, "apt-get update"):
			updates = append(updates, line)
		}
	}
	if len(installs) != 1 || len(updates) != 1 {
		t.Fatalf("want one apt-get update and one install, got:\n%s", ran)
	}
	words := strings.Fields(installs[0])
	for _, pkg := range []string{"chromium", "shellcheck"} {
		if !slices.Contains(words, pkg) {
			t.Errorf("%s missing, but not installed: %s", pkg, installs[0])
		}
	}
	if _, err := os.Stat("/usr/lib/postgresql/15/bin/initdb"); err == nil && slices.Contains(words, "postgresql-15") {
		t.Errorf("postgresql-15 is installed here, and installed again: %s", installs[0])
	}
	if strings.Index(ran, "apt-get install") > strings.Index(ran, "go vet") {
		t.Errorf("installed after vetting:\n%s", ran)
	}
}

// pathWithout returns a PATH that finds every command this PATH finds except the names hidden:
// a directory of links to the first of each name on PATH.
func pathWithout(t *testing.T, hidden ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if slices.Contains(hidden, e.Name()) {
				continue
			}
			// The first on PATH wins, as in a shell: a later one of the same name is not linked.
			_ = os.Symlink(filepath.Join(d, e.Name()), filepath.Join(dir, e.Name()))
		}
	}
	for _, name := range hidden {
		if _, err := exec.LookPath(filepath.Join(dir, name)); err == nil {
			t.Fatalf("%s still found", name)
		}
	}
	return dir
}

// TestCIStepInUploadedTree: cloudbuild.yaml's test step (.ci/run) works in the tree that
// `gcloud builds submit` uploads, which has no .git, and runs the README's test command there;
// it still fails on an unformatted file and on a failing test.
func TestCIStepInUploadedTree(t *testing.T) {
	t.Parallel()
	real := realGcloud(t)
	ws := uploadedTree(t, real)
	if _, err := os.Stat(filepath.Join(ws, ".git")); err == nil {
		t.Fatal("the uploaded tree has a .git")
	}
	out, ran, err := ciStep(t, ws, false)
	if err != nil {
		t.Fatalf("the test step in the uploaded tree: %v\n%s", err, out)
	}
	for _, want := range []string{"go vet ./...", "go test ./..."} {
		if !strings.Contains(ran, want+"\n") {
			t.Errorf("the test step did not run %q:\n%s", want, ran)
		}
	}

	// The script as it was at 2cf95fc listed the Go files with git, which the uploaded tree
	// cannot answer.
	useCIRun(t, ws, "testdata/ci-run-2cf95fc")
	if out, _, err := ciStep(t, ws, false); err == nil || !strings.Contains(out, "not a git repository") {
		t.Errorf(".ci/run of 2cf95fc in the uploaded tree: %v, want it to stop at git\n%s", err, out)
	}
	useCIRun(t, ws, "../.ci/run")

	if out, _, err := ciStep(t, ws, true); err == nil {
		t.Errorf("the test step passed with go test failing:\n%s", out)
	}
	bad := filepath.Join(ws, "shared", "unformatted.go")
	if err := os.WriteFile(bad, []byte("package shared\nfunc  x(){}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, err := ciStep(t, ws, false); err == nil || !strings.Contains(out, "unformatted.go") {
		t.Errorf("the test step passed with an unformatted file, or did not name it: %v\n%s", err, out)
	}
}

// useCIRun makes the file at path the .ci/run of the tree ws.
func useCIRun(t *testing.T, ws, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, ".ci", "run"), b, 0o755); err != nil {
		t.Fatal(err)
	}
}
