package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
)

// childTMPDIR is a temporary directory for the TMPDIR of a demo or drill the test runs: its
// throwaway server's directory and its log files go there, so that a test sees what it leaves
// behind, and they are removed when t ends. It is readable by the unprivileged account the
// server runs as when the tests run as root (t.TempDir is not).
func childTMPDIR(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cc-") // short: the server's socket path inside has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startDemo runs the couponctl binary's demo with args, in a process group of its own (as a
// shell runs a foreground job, so that a signal to the group reaches it as Ctrl-C does), with
// tmp as its TMPDIR and no DATABASE_URL.
func startDemo(t *testing.T, tmp string, args ...string) (*exec.Cmd, *syncbuf.Buffer) {
	t.Helper()
	cmd := exec.Command(proctest.Build(t, "."), append([]string{"demo"}, args...)...)
	cmd.Env = proctest.Env("TMPDIR="+tmp, "DATABASE_URL=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return cmd, &out
}

// waitExit waits for cmd to end, at most limit, and returns its exit code.
func waitExit(t *testing.T, cmd *exec.Cmd, out *syncbuf.Buffer, limit time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode()
	case <-time.After(limit):
		t.Fatalf("the demo did not end within %s:\n%s", limit, out.String())
		return -1
	}
}

// fileLevel is the level of one line of the demo's log file, read apart from the demo's own
// counting: a JSON line's "severity" or "level", the log package's "date time LEVEL msg" (slog's
// default logger), or "" for a line without one.
func fileLevel(line string) string {
	var v struct{ Level, Severity string }
	if json.Unmarshal([]byte(line), &v) == nil {
		return strings.ToUpper(v.Level + v.Severity)
	}
	if f := strings.Fields(line); len(f) >= 3 && regexp.MustCompile(`^\d{4}/\d\d/\d\d$`).MatchString(f[0]) {
		return f[2]
	}
	return ""
}

// TestDemoLogCountsMatchFile: the demo's summary of its log file counts the lines the file
// holds, by level, whatever shape telemetry gives them: JSON in Cloud Logging's shape
// (--telemetry=show) or slog's default text lines (--telemetry=off). The relay's warnings about
// the 5 injected failures are WARN lines in both.
func TestDemoLogCountsMatchFile(t *testing.T) {
	t.Parallel()
	summary := regexp.MustCompile(`Function logs: (\S+) \((\d+) lines: (\d+) ERROR, (\d+) WARN, (\d+) INFO`)
	for _, mode := range []string{"off", "show"} {
		tmp := childTMPDIR(t)
		cmd, out := startDemo(t, tmp, "--members", "40", "--telemetry="+mode)
		if code := waitExit(t, cmd, out, 3*time.Minute); code != 0 {
			t.Fatalf("--telemetry=%s: exit %d:\n%s", mode, code, out.String())
		}
		m := summary.FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("--telemetry=%s: no log summary:\n%s", mode, out.String())
		}
		b, err := os.ReadFile(m[1])
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		levels := map[string]int{}
		for _, l := range lines {
			levels[strings.Replace(fileLevel(l), "WARNING", "WARN", 1)]++
		}
		got := strings.Join(m[2:], " ")
		want := fmt.Sprintf("%d %d %d %d", len(lines), levels["ERROR"], levels["WARN"], levels["INFO"])
		if got != want {
			t.Errorf("--telemetry=%s: the summary counts lines, ERROR, WARN, INFO as %s; the file holds %s\n%s",
				mode, got, want, m[0])
		}
		if levels["WARN"] < 5 {
			t.Errorf("--telemetry=%s: %d WARN lines in the file, want the relay's 5 at least", mode, levels["WARN"])
		}
	}
}

// TestDemoInterrupted: Ctrl-C (SIGINT to the demo's process group, as a terminal sends it) at
// any phase ends the demo with one line saying "interrupted" and none of the phase's raw errors
// (a cancelled request, SQLSTATE 57014), exit code 130 as shells expect, the throwaway server
// stopped and its directory and the log file removed: nothing left in TMPDIR.
func TestDemoInterrupted(t *testing.T) {
	t.Parallel()
	for _, phase := range []struct{ name, after string }{
		{"setting up", "throwaway server on"},
		{"replaying", "IssueCoupon: 540/"},
		{"relaying", "Relay (RelayOutbox"},
	} {
		t.Run(phase.name, func(t *testing.T) {
			t.Parallel()
			tmp := childTMPDIR(t)
			cmd, out := startDemo(t, tmp)
			pgtest.Eventually(t, 4*pgtest.PollTimeout, func() error { // a loaded machine starts a server slowly
				if !strings.Contains(out.String(), phase.after) {
					return fmt.Errorf("no %q yet:\n%s", phase.after, out.String())
				}
				return nil
			})
			if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			code := waitExit(t, cmd, out, time.Minute)
			text := out.String()
			if code != 130 {
				t.Errorf("exit %d, want 130", code)
			}
			if n := strings.Count(text, "interrupted"); n != 1 || !strings.HasSuffix(text, "couponctl: interrupted\n") {
				t.Errorf("%d lines say interrupted, want one, the last, \"couponctl: interrupted\":\n%s", n, text)
			}
			for _, raw := range []string{"context canceled", "57014", "SQLSTATE", "Function logs:"} {
				if strings.Contains(text, raw) {
					t.Errorf("the output says %q:\n%s", raw, text)
				}
			}
			if m := regexp.MustCompile(`throwaway server on (127\.0\.0\.1:\d+)`).FindStringSubmatch(text); m == nil {
				t.Errorf("no throwaway server named:\n%s", text)
			} else if c, err := net.DialTimeout("tcp", m[1], time.Second); err == nil {
				c.Close()
				t.Errorf("the throwaway server at %s still accepts connections", m[1])
			}
			left, _ := filepath.Glob(filepath.Join(tmp, "*"))
			if len(left) > 0 {
				t.Errorf("left behind in TMPDIR: %v\n%s", left, text)
			}
		})
	}
}
