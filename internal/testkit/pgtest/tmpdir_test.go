package pgtest_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// leaveAFile names the environment variable under which TestLeavesAFileInTMPDIR runs: only as the
// child of TestMainFailsOnWhatATestLeaves.
const leaveAFile = "PGTEST_LEAVE_A_FILE"

// TestLeavesAFileInTMPDIR is the broken test TestMainFailsOnWhatATestLeaves runs: it writes a
// file into $TMPDIR and leaves it there. It does nothing in an ordinary run.
func TestLeavesAFileInTMPDIR(t *testing.T) {
	if os.Getenv(leaveAFile) == "" {
		t.Skip("run by TestMainFailsOnWhatATestLeaves")
	}
	if err := os.WriteFile(filepath.Join(os.TempDir(), "left-behind.log"), []byte("a log nobody removes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestMainFailsOnWhatATestLeaves: a test binary whose tests all pass but leave a file in $TMPDIR
// fails (exit 1), naming the file, and leaves nothing: pgtest.Main ran it in a TMPDIR of its own
// and removed it.
func TestMainFailsOnWhatATestLeaves(t *testing.T) {
	t.Parallel()
	// Not t.TempDir, which is closed to others (the child's throwaway server runs as postgres
	// when the tests run as root, and makes its directory in there), and beside this binary's
	// own TMPDIR, not in it: the child makes one more level, and the server's socket path must
	// stay within 107 bytes.
	tmp, err := os.MkdirTemp(filepath.Dir(os.TempDir()), "child-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLeavesAFileInTMPDIR$", "-test.count=1")
	cmd.Env = append(os.Environ(), leaveAFile+"=1", "TMPDIR="+tmp)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 ||
		!strings.Contains(out.String(), "the tests left these in TMPDIR") || !strings.Contains(out.String(), "left-behind.log (21 bytes)") {
		t.Fatalf("a test binary leaving a file in TMPDIR: %v, want exit 1 naming left-behind.log:\n%s", err, out.String())
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("the child left %v in its TMPDIR's parent, want nothing", left)
	}
}
