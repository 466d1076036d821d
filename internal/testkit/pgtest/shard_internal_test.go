package pgtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestShardArgs: a shard gets the test binary's flags less those that pick the tests or name
// the go command's test log, in either form (-flag=value, -flag value), then its own.
func TestShardArgs(t *testing.T) {
	got := shardArgs([]string{"-test.paniconexit0", "-test.run", "X", "-test.timeout=10m0s", "-test.testlogfile=/b/testlog.txt",
		"--test.run=^Y$", "-test.v=test2json", "-test.short"}, "TestA", "/logs/TestA.log")
	want := []string{"-test.paniconexit0", "-test.timeout=10m0s", "-test.v=test2json", "-test.short",
		"-test.run=^TestA$", "-test.testlogfile=/logs/TestA.log"}
	if !slices.Equal(got, want) {
		t.Errorf("shardArgs = %q, want %q", got, want)
	}
	if got := shardArgs(nil, "TestB", ""); !slices.Equal(got, []string{"-test.run=^TestB$"}) {
		t.Errorf("shardArgs without a test log = %q", got)
	}
}

// TestTrimStatus: only a shard's last line is dropped, and only when it is PASS or FAIL (framed
// for test2json or not); a test's own output that says PASS stays.
func TestTrimStatus(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"PASS\n", ""},
		{"--- FAIL: TestX (0.00s)\n    x_test.go:5: no\nFAIL\n", "--- FAIL: TestX (0.00s)\n    x_test.go:5: no\n"},
		{"=== RUN   TestX\n\x16--- PASS: TestX (0.00s)\n\x16PASS\n", "=== RUN   TestX\n\x16--- PASS: TestX (0.00s)\n"},
		{"PASS\npanic: x\n\ngoroutine 1 [running]:\n", "PASS\npanic: x\n\ngoroutine 1 [running]:\n"},
		{"", ""},
	} {
		if got := string(trimStatus([]byte(c.in))); got != c.want {
			t.Errorf("trimStatus(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestFirstThese: the tests named first start first, in first's order; a name that is no test
// is left out, and every test runs once.
func TestFirstThese(t *testing.T) {
	got := firstThese([]string{"TestA", "TestB", "TestC", "TestD"}, []string{"TestC", "TestGone", "TestA", "TestC"})
	if want := []string{"TestC", "TestA", "TestB", "TestD"}; !slices.Equal(got, want) {
		t.Errorf("firstThese = %q, want %q", got, want)
	}
}

// TestMainShards runs testdata/sharded, whose TestMain is MainShards, with go test as a user
// does, one of its tests failing on purpose: each top-level test runs in a process of its own,
// a child of the test binary, all on one server and in one TMPDIR; the failure is reported by
// name and fails the package; the others pass; a test's parallel subtests still run.
func TestMainShards(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "test", "-count=1", "-v", ".")
	cmd.Dir = filepath.Join("testdata", "sharded")
	cmd.Env = append(os.Environ(), "SHARDED_FIXTURE_FAIL=TestB", shardsEnv+"=3")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err == nil {
		t.Fatalf("go test passed with TestB failing:\n%s", out.String())
	}
	text := out.String()
	for _, want := range []string{"--- FAIL: TestB", "--- PASS: TestA", "--- PASS: TestLong", "--- PASS: TestWithSubtests/x",
		"--- PASS: TestWithSubtests/y", "--- PASS: TestWithSubtests", "\nFAIL\n", "FAIL\tgithub.com/mops/coupon-api/internal/testkit/pgtest/testdata/sharded"} {
		if !strings.Contains(text, want) {
			t.Errorf("the output does not say %q:\n%s", want, text)
		}
	}
	if n := strings.Count(text, "\nPASS\n"); n != 0 {
		t.Errorf("the output says PASS %d times: a shard's own status line was not dropped:\n%s", n, text)
	}
	pids, servers, dirs := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, m := range regexp.MustCompile(`where: pid=(\d+) server=(\d+) tmpdir=(\S+) rundir=(\S+)`).FindAllStringSubmatch(text, -1) {
		pids[m[1]], servers[m[2]], dirs[m[3]], dirs[m[4]] = true, true, true, true
		if parent := strings.TrimPrefix(filepath.Base(m[3]), tmpPrefix); strings.HasPrefix(parent, m[1]+"-") {
			t.Errorf("a test ran in the parent, pid %s:\n%s", m[1], text)
		}
	}
	if len(pids) != 4 || len(servers) != 1 || len(dirs) != 1 {
		t.Errorf("4 tests ran in %d processes on %d servers in %d TMPDIRs; want 4, 1, 1:\n%s", len(pids), len(servers), len(dirs), text)
	}
}
