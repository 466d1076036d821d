// Package proctest runs a deployable main (functions/*/cmd) as a child process for tests, as
// Cloud Run runs it: built once per test binary, started with an environment of the test's
// choosing, on a free port, waited for until it accepts connections.
package proctest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
)

// builds holds one build per package directory, shared by the tests of a test binary, all in
// one temporary directory ([RemoveBuilds] removes it). Under pgtest.Main that directory is in
// pgtest.RunDir, which the shards of pgtest.MainShards share: one build serves them all.
var (
	builds   sync.Map // dir -> func() (string, error)
	buildDir = sync.OnceValues(func() (string, error) {
		if run := pgtest.RunDir(); run != "" {
			dir := filepath.Join(run, "proctest-builds")
			return dir, os.MkdirAll(dir, 0o755)
		}
		return os.MkdirTemp("", "proctest-")
	})
)

// Build compiles the main package in dir (relative to the test's working directory) once per
// test binary and returns the executable's path. Call [RemoveBuilds] when the tests end
// (pgtest.Main(m, proctest.RemoveBuilds)): each build is tens of megabytes.
func Build(t testing.TB, dir string) string {
	t.Helper()
	once, _ := builds.LoadOrStore(dir, sync.OnceValues(func() (string, error) {
		tmp, err := buildDir()
		if err != nil {
			return "", err
		}
		return buildOnce(tmp, dir)
	}))
	bin, err := once.(func() (string, error))()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// buildOnce builds the main package in dir into tmp, unless a process sharing tmp (a shard of
// the same test binary) has built it already: the build of each directory is named after it
// (its absolute path's hash) and made under a lock, and a finished one renamed into place.
func buildOnce(tmp, dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(abs))
	out := filepath.Join(tmp, "main-"+hex.EncodeToString(sum[:8]))
	bin := filepath.Join(out, "main")
	lock, err := os.OpenFile(out+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close() // closing it releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	if out, err := exec.Command("go", "build", "-o", bin+".tmp", dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", dir, err, out)
	}
	return bin, os.Rename(bin+".tmp", bin)
}

// RemoveBuilds removes every executable [Build] made in this process.
func RemoveBuilds() {
	if dir, err := buildDir(); err == nil {
		_ = os.RemoveAll(dir)
	}
}

// Env is this process's environment without what would change where a child's telemetry goes
// or whose Google credentials it uses (OTEL_*, GOOGLE_*, GCE_*, Cloud Run's K_*, HOME's gcloud
// configuration), followed by extra.
func Env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "OTEL_") || strings.HasPrefix(k, "GOOGLE_") || strings.HasPrefix(k, "GCE_") ||
			strings.HasPrefix(k, "K_") || k == "CLOUDSDK_CONFIG" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// Start runs bin with [Env](env...), its stdout and stderr in the returned buffer, and kills
// it when the test ends if it still runs.
func Start(t testing.TB, bin string, env ...string) (*exec.Cmd, *syncbuf.Buffer) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = Env(env...)
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, &out
}

// Terminate sends SIGTERM to cmd, as Cloud Run does before it stops an instance, and fails the
// test unless the process then exits 0.
func Terminate(t testing.TB, cmd *exec.Cmd, out *syncbuf.Buffer) {
	t.Helper()
	if err := Terminated(cmd); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
}

// Terminated is [Terminate] for a check that records what it finds instead of failing the test:
// it sends SIGTERM to cmd and returns nil once the process exits 0, else what went wrong.
func Terminated(cmd *exec.Cmd) error {
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("exit after SIGTERM: %w, want 0", err)
	}
	return nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// WaitServing waits, at most pgtest.PollTimeout, until something accepts connections on port,
// and fails the test with the child's output if nothing does. A dial that connected to itself
// does not count.
func WaitServing(t testing.TB, port string, out *syncbuf.Buffer) {
	t.Helper()
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err != nil {
			return fmt.Errorf("nothing serves on %s (%v): %s", port, err, out.String())
		}
		defer c.Close()
		// A dial to a free port of the ephemeral range can connect to itself (TCP simultaneous
		// open, when the kernel picks that port as the source): nothing serves there then.
		if c.LocalAddr().String() == c.RemoteAddr().String() {
			return fmt.Errorf("nothing serves on %s (the dial connected to itself): %s", port, out.String())
		}
		return nil
	})
}

// EnvFile returns the entries of a Cloud Run environment file (--env-vars-file: YAML, string
// values) whose names start with prefix.
func EnvFile(t testing.TB, path, prefix string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var all map[string]string
	if err := yaml.Unmarshal(b, &all); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out := map[string]string{}
	for k, v := range all {
		if strings.HasPrefix(k, prefix) {
			out[k] = v
		}
	}
	return out
}
