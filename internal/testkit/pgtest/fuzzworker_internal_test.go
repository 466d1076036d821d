package pgtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// FuzzWorkerUsesItsCoordinators is the fuzz target TestFuzzWorkersMakeNothingOfTheirOwn runs: in
// a fuzzing worker it fails when the worker runs in a TMPDIR of its own (which, with the server
// Main would start in it, a worker stopped by SIGINT leaves behind) or on another server than
// its coordinator's. In an ordinary run its seed does nothing.
func FuzzWorkerUsesItsCoordinators(f *testing.F) {
	f.Add(0)
	f.Fuzz(func(t *testing.T, _ int) {
		if !isFuzzWorker(os.Args[1:]) {
			return
		}
		if own := tmpPrefix + strconv.Itoa(os.Getpid()) + "-"; strings.HasPrefix(filepath.Base(os.TempDir()), own) {
			t.Fatalf("the fuzzing worker runs in a TMPDIR of its own, %s", os.TempDir())
		}
		if serverURL == "" || serverURL != os.Getenv(workerServerEnv) {
			t.Fatalf("the fuzzing worker's server %q, want its coordinator's %q", serverURL, os.Getenv(workerServerEnv))
		}
	})
}

// TestFuzzWorkersMakeNothingOfTheirOwn runs FuzzWorkerUsesItsCoordinators under -test.fuzz, as
// `go test -fuzz` does: its workers must use the coordinator's server and TMPDIR, and the run
// leaves nothing in TMPDIR.
func TestFuzzWorkersMakeNothingOfTheirOwn(t *testing.T) {
	t.Parallel()
	tmp, err := os.MkdirTemp(filepath.Dir(os.TempDir()), "fuzz-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.fuzz=^FuzzWorkerUsesItsCoordinators$",
		"-test.fuzztime=200x", "-test.parallel=2", "-test.fuzzcachedir="+filepath.Join(tmp, "cache"))
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("fuzzing with pgtest.Main's workers: %v\n%s", err, out.String())
	}
	left, _ := os.ReadDir(tmp)
	for _, e := range left {
		if e.Name() != "cache" {
			t.Errorf("the fuzzing run left %s in its TMPDIR's parent, want nothing", e.Name())
		}
	}
}

// TestIsFuzzWorker: only the flag `go test -fuzz` gives its workers makes a worker.
func TestIsFuzzWorker(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"-test.fuzzworker"}, true},
		{[]string{"-test.run=^$", "--test.fuzzworker=true"}, true},
		{[]string{"-test.fuzz=^FuzzX$", "-test.fuzzcachedir=/tmp/c"}, false},
		{[]string{"-test.run=^Test$", "test.fuzzworker"}, false},
		{nil, false},
	} {
		if got := isFuzzWorker(c.args); got != c.want {
			t.Errorf("isFuzzWorker(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}
