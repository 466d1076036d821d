package localpg

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestExplicitBinDirWithoutBinaries: a PG_BIN_DIR that holds no initdb is an error that names
// it, never a silent fall-back to other binaries.
func TestExplicitBinDirWithoutBinaries(t *testing.T) {
	empty := t.TempDir()
	t.Setenv("PG_BIN_DIR", empty)
	srv, err := Start(context.Background(), Options{})
	if err == nil {
		_ = srv.Stop()
		t.Fatalf("PG_BIN_DIR=%s: started %s from %s, want an error", empty, srv.Version(), srv.BinDir())
	}
	if !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), "PG_BIN_DIR="+empty) {
		t.Errorf("PG_BIN_DIR=%s: %v, want ErrBinariesMissing naming PG_BIN_DIR", empty, err)
	}
}

// TestRefusesASocketPathTooLong: under a TMPDIR so long that the server's Unix socket path would
// pass 107 bytes (which postgres refuses at start-up), Start says so and what to do, at once, and
// leaves no directory behind.
func TestRefusesASocketPathTooLong(t *testing.T) {
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 80))
	if err := os.Mkdir(long, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", long)
	srv, err := Start(context.Background(), Options{})
	if err == nil {
		_ = srv.Stop()
		t.Fatalf("TMPDIR=%s: started on %s, want an error", long, srv.SocketDir())
	}
	if !strings.Contains(err.Error(), "longer than the 107 bytes") || !strings.Contains(err.Error(), "point TMPDIR at a shorter directory") {
		t.Errorf("TMPDIR=%s: %v, want the socket path refused, naming TMPDIR", long, err)
	}
	if left, _ := os.ReadDir(long); len(left) != 0 {
		t.Errorf("left in TMPDIR: %v", left)
	}
}

// TestServerExitingAtStartUp: a postgres that exits during start-up (here: a setting it refuses)
// makes Start return its error with the server log's tail, instead of waiting on for the process
// it already saw end.
func TestServerExitingAtStartUp(t *testing.T) {
	srv, err := Start(context.Background(), Options{Settings: map[string]string{"shared_buffers": "a lot"}})
	if err == nil {
		_ = srv.Stop()
		t.Fatal("started with shared_buffers=a lot, want an error")
	}
	if !strings.Contains(err.Error(), "postgres exited during start-up") || !strings.Contains(err.Error(), "shared_buffers") {
		t.Errorf("%v, want the exit during start-up and the log naming shared_buffers", err)
	}
}

// TestReportsBinaries: a started server says which binaries it runs and their version.
func TestReportsBinaries(t *testing.T) {
	t.Setenv("PG_BIN_DIR", "")
	srv, err := Start(context.Background(), Options{})
	if errors.Is(err, ErrBinariesMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	if srv.BinDir() == "" || !strings.HasPrefix(srv.Version(), "postgres (PostgreSQL) ") {
		t.Errorf("BinDir %q, Version %q: want the directory and `postgres --version`", srv.BinDir(), srv.Version())
	}
}

// TestPauseResumeCrashUp: a paused server answers nothing (a query times out) until resumed;
// after a crash (immediate stop) it comes back up on the same port with every committed row.
func TestPauseResumeCrashUp(t *testing.T) {
	ctx := context.Background()
	srv, err := Start(ctx, Options{Durable: true})
	if errors.Is(err, ErrBinariesMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)`); err != nil {
		t.Fatal(err)
	}

	if n, err := srv.Pause(); err != nil || n < 5 {
		t.Fatalf("Pause: %d processes stopped, %v; want the postmaster and its children", n, err)
	}
	stalled, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pgx.Connect(stalled, srv.URL())
	cancel()
	if err == nil {
		t.Error("a paused server accepted a session, want no answer")
	}
	srv.Resume()
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM kept`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("after Resume: %d rows, %v; want 1", n, err)
	}

	if err := srv.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Error("the session survived the crash")
	}
	if err := srv.Up(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM kept`).Scan(&n); err != nil || n != 1 {
		t.Errorf("after the crash and Up: %d rows, %v; want the committed row", n, err)
	}
}

// TestHeldWALWriterLosesOnlyAsyncCommits: with the WAL writer held, a crash loses every commit
// made with synchronous_commit off, and none made with it on (each such commit flushes itself).
func TestHeldWALWriterLosesOnlyAsyncCommits(t *testing.T) {
	ctx := context.Background()
	srv, err := Start(ctx, Options{Durable: true, Settings: map[string]string{"autovacuum": "off", "bgwriter_lru_maxpages": "0"}})
	if errors.Is(err, ErrBinariesMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE commits (sync boolean)`); err != nil {
		t.Fatal(err)
	}
	if err := srv.HoldWALWriter(); err != nil {
		t.Fatal(err)
	}
	for _, setting := range []string{"on", "off"} {
		if _, err := conn.Exec(ctx, `SET synchronous_commit = `+setting); err != nil {
			t.Fatal(err)
		}
		for range 50 {
			if _, err := conn.Exec(ctx, `INSERT INTO commits VALUES ($1)`, setting == "on"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := srv.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Up(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var synced, async int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE sync), count(*) FILTER (WHERE NOT sync) FROM commits`).Scan(&synced, &async); err != nil {
		t.Fatal(err)
	}
	if synced != 50 || async != 0 {
		t.Errorf("after the crash: %d of 50 synchronous commits, %d of 50 asynchronous ones; want all and none", synced, async)
	}
}
