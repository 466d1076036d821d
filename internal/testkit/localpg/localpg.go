// Package localpg starts a throwaway PostgreSQL server for the demo and the tests: initdb into a
// temporary directory, a postgres process listening on a free loopback port, and removal of both
// on Stop. It needs the PostgreSQL server binaries (Debian: apt-get install postgresql-15).
//
// initdb refuses to run as root, so when the caller is root the server runs as an unprivileged
// user (default "postgres", the account the Debian package creates).
package localpg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultBinDir is where Debian's postgresql-15 package installs the server binaries.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// startTimeout bounds how long Start waits for the server to accept connections (wall time),
// far above a healthy initdb and start.
const startTimeout = 60 * time.Second

// dirPrefix names the temporary directories of this package's servers.
const dirPrefix = "coupon-localpg-"

// maxSocketPath is the longest path a Unix socket may have on Linux (sun_path holds 108 bytes,
// its terminating NUL included), which postgres refuses to start beyond.
const maxSocketPath = 107

// staleAfter is how old a server directory without a live postmaster must be before
// [removeStale] deletes it: far longer than an initdb takes, so a server still starting is never
// taken for a stale one.
const staleAfter = 10 * time.Minute

// ErrBinariesMissing is returned by Start when initdb or postgres cannot be found.
var ErrBinariesMissing = errors.New("localpg: PostgreSQL server binaries not found")

// Options configure Start. The zero value is usable.
type Options struct {
	// BinDir holds initdb and postgres. Default: $PG_BIN_DIR, else [DefaultBinDir], else the
	// directory of `pg_config --bindir`. A BinDir or PG_BIN_DIR without initdb is an error.
	BinDir string
	// RunAs is the unprivileged account the server runs as when the caller is root.
	// Default: $LOCALPG_USER, else "postgres".
	RunAs string
	// Durable keeps fsync and synchronous_commit on (PostgreSQL's defaults), as the demo does so
	// that its latency figures mean something. Tests leave it off: a throwaway database needs no
	// crash safety.
	Durable bool
	// Settings are extra server settings passed as -c name=value.
	Settings map[string]string
}

// Server is a running throwaway PostgreSQL. Stop it to end the process and delete its files.
type Server struct {
	dir     string
	bin     string
	version string
	port    int
	cmd     *exec.Cmd
	done    chan error
	// postgres and args start the server again after [Server.Down].
	postgres string
	args     []string
	cred     *syscall.Credential
	// paused are the processes [Server.Pause] stopped, the postmaster first.
	paused []int
}

// URL is a connection URL for the superuser "postgres" on database "postgres".
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Port is the loopback TCP port the server listens on.
func (s *Server) Port() int { return s.port }

// SocketDir is the directory of the server's Unix socket, .s.PGSQL.<Port>.
func (s *Server) SocketDir() string { return s.dir }

// BinDir is the directory of the initdb and postgres the server was started from.
func (s *Server) BinDir() string { return s.bin }

// Version is the server binary's `postgres --version`, such as "postgres (PostgreSQL) 15.18".
func (s *Server) Version() string { return s.version }

// Start runs initdb in a new temporary directory and starts postgres on a free loopback port.
// It returns once the server accepts connections. Errors name what is missing (binaries, the
// unprivileged user) or include the tail of the server log.
func Start(ctx context.Context, opt Options) (*Server, error) {
	bin, err := binDir(opt.BinDir)
	if err != nil {
		return nil, err
	}
	ver, err := version(bin)
	if err != nil {
		return nil, err
	}
	cred, uid, gid, err := credential(opt.RunAs)
	if err != nil {
		return nil, err
	}
	removeStale()
	dir, err := serverDir()
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin, version: ver}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, fmt.Errorf("localpg: chown %s: %w", dir, err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("localpg: initdb: %w\n%s", err, out)
	}

	if s.port, err = freePort(); err != nil {
		return nil, err
	}
	args := []string{"-D", data, "-p", strconv.Itoa(s.port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=300"}
	if !opt.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	for k, v := range opt.Settings {
		args = append(args, "-c", k+"="+v)
	}
	s.postgres, s.args, s.cred = filepath.Join(bin, "postgres"), args, cred
	if err := s.launch(ctx); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// serverDir makes a new temporary directory for a server, its data and its Unix socket. It
// refuses one whose socket path would be longer than [maxSocketPath], which postgres would
// refuse at start-up, naming TMPDIR.
func serverDir() (string, error) {
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return "", fmt.Errorf("localpg: temp dir: %w", err)
	}
	if socket := filepath.Join(dir, ".s.PGSQL.65535"); len(socket) > maxSocketPath {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("localpg: the server's Unix socket %s would be longer than the %d bytes a socket path may have: "+
			"point TMPDIR at a shorter directory", socket, maxSocketPath)
	}
	return dir, nil
}

// launch starts postgres on the server's directory and port and waits until it accepts
// connections.
func (s *Server) launch(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("localpg: server log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(s.postgres, s.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Setpgid keeps a terminal's Ctrl-C away from the server, so Stop decides how it ends;
	// Pdeathsig ends it at once if this process dies without calling Stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("localpg: start postgres: %w", err)
	}
	s.cmd = cmd
	// Closed after its one value: waitReady may take the value (postgres exited during
	// start-up) before this function, or halt, waits on it.
	done := make(chan error, 1)
	s.done = done
	go func() {
		done <- cmd.Wait()
		close(done)
	}()
	if err := s.waitReady(ctx); err != nil {
		_ = cmd.Process.Kill()
		<-done
		s.cmd = nil
		return fmt.Errorf("%w\n%s", err, s.logTail())
	}
	return nil
}

// Down stops the server as `pg_ctl stop -m fast` does (open sessions are rolled back and get
// 57P01 admin_shutdown) but keeps its files, so that [Server.Up] starts it again on the same
// port with the same data: a database restart or failover, for fault tests.
func (s *Server) Down() error { return s.halt(syscall.SIGINT, "fast") }

// Crash stops the server as `pg_ctl stop -m immediate` does: SIGQUIT to the postmaster, which
// ends every server process at once, without a checkpoint and without writing what the WAL
// buffers still hold. [Server.Up] then starts it with crash recovery from the WAL on disk. The
// operating system survives, so WAL already written to it is kept even if not yet fsynced: with
// synchronous_commit on, every commit that was answered is. Processes stopped by
// [Server.Pause] or [Server.HoldWALWriter] are killed, never resumed.
func (s *Server) Crash() error { return s.halt(syscall.SIGQUIT, "immediate") }

// haltTimeout bounds how long a shutdown may take before the postmaster is killed.
const haltTimeout = 30 * time.Second

// halt sends sig to the postmaster and waits for it to exit, killing it after [haltTimeout]; mode
// names the shutdown in the error. Stopped processes are resumed first for a shutdown and killed
// after SIGQUIT (a crash).
func (s *Server) halt(sig syscall.Signal, mode string) error {
	if s.cmd == nil {
		return errors.New("localpg: server is not running")
	}
	cmd := s.cmd
	s.cmd = nil
	if sig == syscall.SIGQUIT {
		_ = cmd.Process.Signal(sig)
		s.killPaused() // a crash: what was stopped never runs again
	} else {
		s.Resume() // a shutdown: every process must run to take part
		_ = cmd.Process.Signal(sig)
	}
	select {
	case <-s.done:
		return nil
	case <-time.After(haltTimeout):
		_ = cmd.Process.Kill()
		<-s.done
		return fmt.Errorf("localpg: %s shutdown took over %s; killed", mode, haltTimeout)
	}
}

// Pause stops every process of the server with SIGSTOP, the postmaster first so that it starts
// no new one, then its children (backends, WAL writer, checkpointer, ...): a database that
// hangs. The kernel still accepts connections on its port, and nothing answers them, until
// [Server.Resume]. It returns how many processes it stopped.
func (s *Server) Pause() (int, error) {
	if s.cmd == nil {
		return 0, errors.New("localpg: server is not running")
	}
	postmaster := s.cmd.Process.Pid
	if err := syscall.Kill(postmaster, syscall.SIGSTOP); err != nil {
		return 0, fmt.Errorf("localpg: stop postmaster %d: %w", postmaster, err)
	}
	s.paused = append(s.paused, postmaster)
	children, err := childrenOf(postmaster)
	for _, pid := range children {
		if syscall.Kill(pid, syscall.SIGSTOP) == nil {
			s.paused = append(s.paused, pid)
		}
	}
	if err != nil {
		s.Resume()
		return 0, err
	}
	return len(s.paused), nil
}

// HoldWALWriter stops the server's WAL writer with SIGSTOP, until [Server.Resume] or a crash.
// Commits made with synchronous_commit=off then stay in the server's WAL buffers instead of being
// written out within wal_writer_delay, so that [Server.Crash] loses every one of them; a commit
// made with synchronous_commit on is flushed by its own backend and survives.
func (s *Server) HoldWALWriter() error {
	if s.cmd == nil {
		return errors.New("localpg: server is not running")
	}
	children, err := childrenOf(s.cmd.Process.Pid)
	if err != nil {
		return err
	}
	for _, pid := range children {
		title, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.HasPrefix(string(title), walWriterTitle) {
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				return fmt.Errorf("localpg: stop the WAL writer %d: %w", pid, err)
			}
			s.paused = append(s.paused, pid)
			return nil
		}
	}
	return errors.New("localpg: no WAL writer process among the postmaster's children")
}

// walWriterTitle is how the WAL writer names itself in its command line (PostgreSQL's process
// title, "postgres: walwriter").
const walWriterTitle = "postgres: walwriter"

// killPaused ends every stopped process with SIGKILL, which a stopped process cannot hold off.
func (s *Server) killPaused() {
	for _, pid := range s.paused {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	s.paused = nil
}

// Resume sends SIGCONT to every process [Server.Pause] or [Server.HoldWALWriter] stopped,
// children first.
func (s *Server) Resume() {
	for i := len(s.paused) - 1; i >= 0; i-- {
		_ = syscall.Kill(s.paused[i], syscall.SIGCONT) // a process gone since has nothing to resume
	}
	s.paused = nil
}

// childrenOf lists the processes whose parent is pid, from /proc (Linux).
func childrenOf(pid int) ([]int, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return nil, fmt.Errorf("localpg: list processes: %w", err)
	}
	var children []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // ended since the listing
		}
		// "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ")" ends it.
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		child, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		children = append(children, child)
	}
	if len(children) == 0 {
		return nil, fmt.Errorf("localpg: postmaster %d has no child process in /proc", pid)
	}
	return children, nil
}

// Up starts a server stopped by [Server.Down] again, on the same port and data.
func (s *Server) Up(ctx context.Context) error {
	if s.cmd != nil {
		return errors.New("localpg: server is already running")
	}
	return s.launch(ctx)
}

// Restart is [Server.Down] then [Server.Up]: `pg_ctl restart -m fast`.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Down(); err != nil {
		return err
	}
	return s.Up(ctx)
}

// Stop shuts the server down (fast shutdown: open sessions are rolled back) and deletes its
// directory. It is safe to call more than once.
func (s *Server) Stop() error {
	if s == nil || s.dir == "" {
		return nil
	}
	if s.cmd != nil {
		_ = s.Down()
	}
	dir := s.dir
	s.dir = ""
	return os.RemoveAll(dir)
}

func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, s.URL())
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case werr := <-s.done:
			return fmt.Errorf("localpg: postgres exited during start-up: %v", werr)
		case <-ctx.Done():
			return fmt.Errorf("localpg: postgres not ready after %s: %w", startTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return "server log:\n" + string(b)
}

// binDir returns the directory of initdb and postgres: dir or $PG_BIN_DIR when one is set (an
// error if it holds no initdb: a wrong setting is never silently replaced by another server's
// binaries), else [DefaultBinDir], else `pg_config --bindir`.
func binDir(dir string) (string, error) {
	for _, explicit := range []struct{ name, dir string }{{"Options.BinDir", dir}, {"PG_BIN_DIR", os.Getenv("PG_BIN_DIR")}} {
		if explicit.dir == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(explicit.dir, "initdb")); err != nil {
			return "", fmt.Errorf("%w: %s=%s holds no initdb (%v); point it at the server binaries' "+
				"directory, such as %s, or unset it", ErrBinariesMissing, explicit.name, explicit.dir, err, DefaultBinDir)
		}
		return explicit.dir, nil
	}
	candidates := []string{DefaultBinDir}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	for _, c := range candidates {
		if _, err := os.Stat(filepath.Join(c, "initdb")); err == nil {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w (looked in %s and pg_config --bindir): install them with "+
		"`apt-get install postgresql-15` (Debian/Ubuntu), or set PG_BIN_DIR, or set DATABASE_URL "+
		"to an existing server", ErrBinariesMissing, DefaultBinDir)
}

// version returns the first line of `postgres --version` in bin, such as
// "postgres (PostgreSQL) 15.18 (Debian 15.18-1.pgdg120+1)".
func version(bin string) (string, error) {
	out, err := exec.Command(filepath.Join(bin, "postgres"), "--version").Output()
	if err != nil {
		return "", fmt.Errorf("localpg: %s --version: %w", filepath.Join(bin, "postgres"), err)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return first, nil
}

// credential returns the credential to run initdb and postgres with: nil when the caller is not
// root, else the unprivileged account's.
func credential(name string) (*syscall.Credential, int, int, error) {
	if os.Geteuid() != 0 {
		return nil, -1, -1, nil
	}
	if name == "" {
		name = os.Getenv("LOCALPG_USER")
	}
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("localpg: running as root, and initdb refuses root: need the "+
			"unprivileged user %q (created by `apt-get install postgresql-15`, or set LOCALPG_USER): %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("localpg: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// removeStale deletes the directories of earlier servers whose owner died without calling Stop
// (killed by SIGKILL or a broken pipe): the postgres process itself ended with its parent
// (Pdeathsig), but its files stayed. A directory is stale when it is older than [staleAfter]
// and its postmaster.pid names no live process.
func removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		info, err := os.Stat(d)
		if err != nil || time.Since(info.ModTime()) < staleAfter {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(d, "data", "postmaster.pid")); err == nil {
			first, _, _ := strings.Cut(string(b), "\n")
			if pid, err := strconv.Atoi(first); err == nil && syscall.Kill(pid, 0) != syscall.ESRCH {
				continue // alive (or not ours to signal): in use
			}
		}
		_ = os.RemoveAll(d)
	}
}
