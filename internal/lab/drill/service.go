package drill

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// serveReadyTimeout bounds how long a serving process may take to accept connections: it opens
// its pool and checks the schema first (under a second here; crash recovery of the database
// comes before, in the fault that needs it).
const serveReadyTimeout = 30 * time.Second

// serveStopTimeout bounds how long the serving process may take to exit after SIGTERM: Cloud
// Run's 10 s between SIGTERM and SIGKILL (shared/lifecycle, whose drain, grace and closers add
// up to 9.5 s).
const serveStopTimeout = 10 * time.Second

// service is IssueCoupon and RelayOutbox served by a child process (`couponctl serve`), which
// the drill kills, terminates and starts again, as Cloud Run does to an instance.
type service struct {
	argv []string // the command that serves both functions
	env  []string
	addr string // 127.0.0.1:PORT
	log  *os.File

	cmd    *exec.Cmd
	exited chan error // receives the process's exit once
}

// newService prepares argv to serve on a free loopback port with env added to this process's
// environment, less the settings that would send it elsewhere (see [childEnv]), its output
// appended to log.
func newService(argv []string, env []string, log *os.File) (*service, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("drill: free port: %w", err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	return &service{argv: argv, env: append(childEnv(), append(env, "PORT="+port)...), addr: addr, log: log}, nil
}

// childEnv is this process's environment without the variables the drill sets for the serving
// process or that would point it at another database, LINE or telemetry endpoint: DATABASE_URL,
// Cloud SQL's INSTANCE_CONNECTION_NAME and DB_*, FUNCTION_TARGET, PORT, LINE_*, RELAY_*,
// OTEL_* and GOOGLE_*. The issuance settings (MONTHLY_CAP_YEN, ISSUE_*) are kept: they are what
// is drilled.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "DATABASE_URL", k == "INSTANCE_CONNECTION_NAME", k == "FUNCTION_TARGET", k == "PORT",
			strings.HasPrefix(k, "DB_"), strings.HasPrefix(k, "LINE_"), strings.HasPrefix(k, "RELAY_"),
			strings.HasPrefix(k, "OTEL_"), strings.HasPrefix(k, "GOOGLE_"):
			continue
		}
		env = append(env, kv)
	}
	return env
}

// url is the base URL the functions are served at.
func (s *service) url() string { return "http://" + s.addr }

// running reports whether the process is up.
func (s *service) running() bool { return s.cmd != nil }

// start starts the process and waits until it accepts connections. A process that exits first
// is an error with the end of its log.
func (s *service) start(ctx context.Context) error {
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	cmd.Env = s.env
	cmd.Stdout, cmd.Stderr = s.log, s.log
	// Setpgid keeps a terminal's Ctrl-C away from it (the drill stops it); Pdeathsig kills it if
	// the drill dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("drill: start %s: %w", strings.Join(s.argv, " "), err)
	}
	s.cmd, s.exited = cmd, make(chan error, 1)
	go func() { s.exited <- cmd.Wait() }()
	deadline := time.Now().Add(serveReadyTimeout)
	for {
		if c, err := net.DialTimeout("tcp", s.addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case err := <-s.exited:
			s.cmd = nil
			return fmt.Errorf("drill: the serving process exited before serving (%v); its log, %s:\n%s", err, s.log.Name(), tail(s.log.Name()))
		case <-ctx.Done():
			s.kill()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("drill: the serving process does not accept connections on %s after %s", s.addr, serveReadyTimeout)
		}
	}
}

// kill ends the process with SIGKILL, as Cloud Run ends an instance that does not stop in time.
func (s *service) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// terminate sends SIGTERM, as Cloud Run does before it stops an instance, and waits for the
// process to drain and exit. It returns how long that took, and an error unless it exited 0
// within [serveStopTimeout] (after which it is killed).
func (s *service) terminate() (time.Duration, error) {
	if s.cmd == nil {
		return 0, errors.New("drill: the serving process is not running")
	}
	start := time.Now()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.exited:
		s.cmd = nil
		if err != nil {
			return time.Since(start), fmt.Errorf("the serving process exited with %v after SIGTERM, want 0 (its log: %s)", err, s.log.Name())
		}
		return time.Since(start), nil
	case <-time.After(serveStopTimeout):
		s.kill()
		return serveStopTimeout, fmt.Errorf("the serving process did not exit within %s of SIGTERM; killed", serveStopTimeout)
	}
}

// tail is the end of the file at path, for error messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
