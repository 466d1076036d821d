package localpg

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartStandby makes a streaming standby of s and starts it: pg_basebackup of s into a new
// temporary directory, run as the server's account, connecting to primaryAddr (host:port), which
// must lead to s, such as a latency proxy in front of [Server.Port]; the standby's replication
// connection (primary_conninfo, written by pg_basebackup -R) goes there too. It runs with s's
// settings on a free loopback port of its own and returns once it accepts (read-only)
// connections. Commits on s do not wait for it until [Server.RequireSyncStandby]. Stop the
// standby before s: a primary waiting for a standby that is gone waits forever.
func (s *Server) StartStandby(ctx context.Context, primaryAddr string) (*Server, error) {
	if s.cmd == nil {
		return nil, fmt.Errorf("localpg: the primary is not running")
	}
	host, port, err := net.SplitHostPort(primaryAddr)
	if err != nil {
		return nil, fmt.Errorf("localpg: primary address %q: %w", primaryAddr, err)
	}
	dir, err := serverDir()
	if err != nil {
		return nil, err
	}
	sb := &Server{dir: dir, bin: s.bin, version: s.version, postgres: s.postgres, cred: s.cred}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return nil, fmt.Errorf("localpg: chown %s: %w", dir, err)
		}
	}
	data := filepath.Join(dir, "data")
	// --no-sync: the copy needs no crash safety; what the standby flushes from then on is what a
	// synchronous commit waits for.
	backup := exec.CommandContext(ctx, filepath.Join(s.bin, "pg_basebackup"),
		"-D", data, "-h", host, "-p", port, "-U", "postgres", "-X", "stream", "-R", "-c", "fast", "--no-sync")
	backup.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := backup.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("localpg: pg_basebackup: %w\n%s", err, out)
	}
	if sb.port, err = freePort(); err != nil {
		return nil, err
	}
	sb.args = slices.Clone(s.args)
	for i := 0; i+1 < len(sb.args); i++ {
		switch sb.args[i] {
		case "-D":
			sb.args[i+1] = data
		case "-p":
			sb.args[i+1] = strconv.Itoa(sb.port)
		case "-k":
			sb.args[i+1] = dir
		}
	}
	if err := sb.launch(ctx); err != nil {
		return nil, err
	}
	ok = true
	return sb, nil
}

// syncTimeout bounds how long RequireSyncStandby waits for a standby to become synchronous.
const syncTimeout = 60 * time.Second

// RequireSyncStandby makes every commit on s that has synchronous_commit on ([Options.Durable])
// wait until a standby has flushed its WAL (synchronous_standby_names '*': the first standby
// connected), and returns once pg_stat_replication shows a standby with sync_state 'sync'.
func (s *Server) RequireSyncStandby(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = '*'`); err != nil {
		return fmt.Errorf("localpg: synchronous_standby_names: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return fmt.Errorf("localpg: reload: %w", err)
	}
	deadline := time.Now().Add(syncTimeout)
	for {
		var sync bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_replication WHERE sync_state = 'sync')`).Scan(&sync); err != nil {
			return fmt.Errorf("localpg: pg_stat_replication: %w", err)
		}
		if sync {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("localpg: no synchronous standby in pg_stat_replication after %s\n%s", syncTimeout, s.logTail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
