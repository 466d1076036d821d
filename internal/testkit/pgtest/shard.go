package pgtest

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// MainShards is [Main] for a package whose tests would run faster side by side but cannot call
// t.Parallel: they set the process's environment (t.Setenv, as couponctl's verbs read
// DATABASE_URL) or swap package variables for a broken variant. Each top-level test runs in a
// child process of the test binary of its own, a shard, at most [Shards] at once, all on the one
// server Main starts and in its TMPDIR; the parent prints each shard's output whole when it ends,
// then PASS or FAIL. A test that calls t.Parallel still runs beside the others of its shard only.
//
// The shards share what a test binary shares: the server, its template database, TMPDIR (Main
// checks it once, at the end) and [RunDir], where proctest keeps its builds. after runs once, in
// the parent, when every shard has ended. A run given -test.run, -test.list, -test.bench,
// -test.fuzz, coverage or a profile, or PGTEST_SHARDS=1, runs as [Main] does, in one process.
//
// first names the package's longest tests, the longest first: they start before the others,
// in that order, so that the run does not end waiting for a long test that started last.
func MainShards(m *testing.M, first []string, after ...func()) {
	shardFirst = first
	mainWith(m, true, after)
}

// shardFirst is [MainShards]'s first.
var shardFirst []string

// shardEnv marks a shard: a child process that [MainShards] started to run one top-level test.
const shardEnv = "PGTEST_SHARD"

// shardsEnv sets how many shards run at once; 1 runs the tests in one process, as [Main] does.
const shardsEnv = "PGTEST_SHARDS"

// runDirEnv carries [RunDir] from the parent to its shards.
const runDirEnv = "PGTEST_RUN_DIR"

// Shards is how many shards [MainShards] runs at once: PGTEST_SHARDS when set to a positive
// number, else twice GOMAXPROCS, at least 4 (most shards wait: on a lock, a timeout, a child
// process, a client that stalls on purpose).
func Shards() int {
	if n, err := strconv.Atoi(os.Getenv(shardsEnv)); err == nil && n > 0 {
		return n
	}
	return max(4, 2*runtime.GOMAXPROCS(0))
}

// runDir is [RunDir], set by Main.
var runDir string

// RunDir is a directory that the processes of one run of the test binary share (the parent and
// its shards): the test binary's own TMPDIR, as Main made it, whatever TMPDIR a test sets later.
// It is "" outside Main.
func RunDir() string { return runDir }

// flagGiven reports whether the command line names the test flag name (-name or --name, with or
// without =value).
func flagGiven(name string) bool {
	for _, a := range os.Args[1:] {
		if a == "--" {
			break
		}
		a = strings.TrimLeft(a, "-")
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// shardable reports whether this run of the test binary may run its tests in shards: none of
// the flags that pick tests, list them, fuzz, benchmark, measure coverage or write a profile.
func shardable() bool {
	if n, err := strconv.Atoi(os.Getenv(shardsEnv)); err == nil && n == 1 {
		return false
	}
	if testing.CoverMode() != "" {
		return false
	}
	for _, name := range []string{"test.run", "test.list", "test.bench", "test.fuzz", "test.fuzzworker",
		"test.coverprofile", "test.cpuprofile", "test.memprofile", "test.blockprofile", "test.mutexprofile",
		"test.trace", "test.gocoverdir"} {
		if f := flag.Lookup(name); f != nil && flagGiven(name) && f.Value.String() != "" && f.Value.String() != "false" {
			return false
		}
	}
	return true
}

// isListing reports whether args ask the test binary only to list its tests (-test.list), which
// needs no server.
func isListing(args []string) bool {
	for _, a := range args {
		a = strings.TrimLeft(a, "-")
		if a == "test.list" || strings.HasPrefix(a, "test.list=") {
			return true
		}
	}
	return false
}

// runShardChild runs a shard's tests on its parent's server, in its parent's TMPDIR; the parent
// runs the after functions.
func runShardChild(m *testing.M) int {
	serverURL = os.Getenv(workerServerEnv)
	runDir = os.Getenv(runDirEnv)
	if serverURL == "" {
		fmt.Fprintf(os.Stderr, "pgtest: a shard without %s: its parent did not run pgtest.MainShards\n", workerServerEnv)
		return 1
	}
	return m.Run()
}

// shard is the outcome of one shard: its test, its output (stdout and stderr, as go test reads a
// test binary's), and whether it passed.
type shard struct {
	test   string
	out    []byte
	passed bool
	err    error
}

// runShards runs every top-level test of the binary in a shard of its own, [Shards] at once,
// printing each shard's output as it ends, then PASS or FAIL as the testing package does; it
// returns the exit code. The go command's test log (-test.testlogfile), by which it decides
// whether a cached result still holds, gets what every shard read.
func runShards() int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: shards: %v\n", err)
		return 1
	}
	tests, err := listTests(self)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: shards: %v\n", err)
		return 1
	}
	if len(tests) == 0 {
		fmt.Fprintf(os.Stderr, "pgtest: shards: %s -test.list=. listed no test\n", self)
		return 1
	}
	tests = firstThese(tests, shardFirst)
	logs, err := os.MkdirTemp(runDir, "shard-logs-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: shards: %v\n", err)
		return 1
	}
	defer os.RemoveAll(logs)
	if d := testTimeout(); d > 0 {
		// The go command kills the parent a minute after its -timeout, which would leave the
		// shards running: the parent ends them first, as a test binary's own alarm would.
		timer := time.AfterFunc(d, func() {
			fmt.Printf("panic: test timed out after %s: the shards of %s ran past -test.timeout\n", d, self)
			os.Exit(2)
		})
		defer timer.Stop()
	}

	queue := make(chan string)
	done := make(chan shard)
	var wg sync.WaitGroup
	for range min(Shards(), max(1, len(tests))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range queue {
				done <- runShard(self, name, logs)
			}
		}()
	}
	go func() {
		for _, name := range tests {
			queue <- name
		}
		close(queue)
		wg.Wait()
		close(done)
	}()
	passed := true
	for s := range done {
		os.Stdout.Write(trimStatus(s.out))
		if s.err != nil {
			fmt.Printf("pgtest: shard %s: %v\n", s.test, s.err)
		}
		passed = passed && s.passed
	}
	if err := mergeTestLogs(logs); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: shards: %v\n", err)
		passed = false
	}
	prefix := ""
	if f := flag.Lookup("test.v"); f != nil && f.Value.String() == "test2json" {
		prefix = "\x16" // the testing package's framing of a status line for test2json
	}
	if !passed {
		fmt.Print(prefix, "FAIL\n")
		return 1
	}
	fmt.Print(prefix, "PASS\n")
	return 0
}

// testNames are the names -test.list prints that -test.run runs as tests: tests, the seed corpus
// of fuzz targets, and examples (never benchmarks).
var testNames = regexp.MustCompile(`^(Test|Fuzz|Example)`)

// listTests lists the binary's top-level tests, in their order (-test.list).
func listTests(self string) ([]string, error) {
	cmd := exec.Command(self, "-test.list=.")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing the tests: %v\n%s", err, stderr.Bytes())
	}
	var tests []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if name := strings.TrimSpace(sc.Text()); testNames.MatchString(name) {
			tests = append(tests, name)
		}
	}
	return tests, sc.Err()
}

// firstThese is tests with those of first moved to the front, in first's order; a name of
// first that is not among tests is left out.
func firstThese(tests, first []string) []string {
	var front, rest []string
	for _, f := range first {
		if slices.Contains(tests, f) && !slices.Contains(front, f) {
			front = append(front, f)
		}
	}
	for _, t := range tests {
		if !slices.Contains(front, t) {
			rest = append(rest, t)
		}
	}
	return append(front, rest...)
}

// runShard runs the test name alone in a child of the test binary, with the binary's own flags
// less those that pick the tests or name the go command's test log (the shard writes its own
// into dir).
func runShard(self, name, dir string) shard {
	log := ""
	if flagGiven("test.testlogfile") {
		log = shardLog(dir, name)
	}
	cmd := exec.Command(self, shardArgs(os.Args[1:], name, log)...)
	cmd.Env = append(os.Environ(), shardEnv+"=1", runDirEnv+"="+runDir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// A shard ends with its parent, which go test kills past its -timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	s := shard{test: name, out: out.Bytes(), passed: err == nil}
	var exit *exec.ExitError
	switch {
	case err != nil && !errors.As(err, &exit):
		s.err = err
	case noTests.Match(s.out):
		s.passed, s.err = false, errors.New("it ran no test")
	}
	return s
}

// noTests is the line a test binary prints when -test.run matched no test.
var noTests = regexp.MustCompile(`(?m)^testing: warning: no tests to run$`)

// shardArgs are the arguments of the shard that runs test name: the test binary's own args
// less -test.run and -test.testlogfile, then -test.run for name alone and, when log is not "",
// -test.testlogfile log.
func shardArgs(args []string, name, log string) []string {
	var out []string
	skipNext := false
	for _, a := range args {
		if skipNext {
			skipNext = false
			continue
		}
		bare := strings.TrimLeft(a, "-")
		switch {
		case bare == "test.run" || bare == "test.testlogfile":
			skipNext = true // -test.run X
			continue
		case strings.HasPrefix(bare, "test.run=") || strings.HasPrefix(bare, "test.testlogfile="):
			continue
		}
		out = append(out, a)
	}
	out = append(out, "-test.run=^"+regexp.QuoteMeta(name)+"$")
	if log != "" {
		out = append(out, "-test.testlogfile="+log)
	}
	return out
}

// shardLog is where the shard of test name writes its test log.
func shardLog(dir, name string) string { return dir + "/" + name + ".log" }

// trimStatus drops from a shard's output the line the parent prints once for all: its last,
// when it is PASS or FAIL (framed for test2json or not).
func trimStatus(out []byte) []byte {
	body := bytes.TrimSuffix(out, []byte("\n"))
	i := bytes.LastIndexByte(body, '\n') + 1
	switch string(bytes.TrimPrefix(body[i:], []byte("\x16"))) {
	case "PASS", "FAIL":
		return out[:i]
	}
	return out
}

// testLogHeader starts the go command's test log (testing's -test.testlogfile).
const testLogHeader = "# test log\n"

// mergeTestLogs writes the go command's test log, when it asked for one: the header, what Main
// reads of the environment before any shard starts, then every shard's log in dir.
func mergeTestLogs(dir string) error {
	f := flag.Lookup("test.testlogfile")
	if f == nil || f.Value.String() == "" {
		return nil
	}
	var b bytes.Buffer
	b.WriteString(testLogHeader)
	for _, env := range []string{"TEST_DATABASE_URL", "PG_BIN_DIR", "LOCALPG_USER", shardsEnv} {
		fmt.Fprintf(&b, "getenv %s\n", env)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		data, err := os.ReadFile(dir + "/" + e.Name())
		if err != nil {
			return err
		}
		b.Write(bytes.TrimPrefix(data, []byte(testLogHeader)))
	}
	return os.WriteFile(f.Value.String(), b.Bytes(), 0o644)
}

// testTimeout is the binary's -test.timeout, 0 when none.
func testTimeout() time.Duration {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return 0
	}
	d, err := time.ParseDuration(f.Value.String())
	if err != nil {
		return 0
	}
	return d
}
