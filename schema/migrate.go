package schema

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/mops/coupon-api/shared/backoff"
)

// Migrator applies migrations with goose, each in its own transaction (or, for a file marked
// NO TRANSACTION, statement by statement), and retries a migration that failed on a lock: SQLSTATE
// 55P03 (the lock_timeout each migration sets) or 40P01 (a deadlock it was chosen to end). Only the
// failed migration runs again: those before it are committed and recorded in goose's version
// table. Concurrent migrators on one database wait for each other (a goose session advisory lock).
// The zero value applies this tree's migrations with the defaults below and reports nothing.
type Migrator struct {
	// FS holds the migration files (NNNNN_name.sql); nil is [Migrations].
	FS fs.FS
	// Tries is how many times one migration is run before giving up (DefaultTries when 0).
	Tries int
	// BackoffBase and BackoffCap bound the full-jitter wait before each retry (shared/backoff;
	// DefaultBackoffBase and DefaultBackoffCap when 0).
	BackoffBase, BackoffCap time.Duration
	// Report receives one line per retry (couponctl migrate: stderr); nil discards them. The
	// give-up is the error Up returns.
	Report io.Writer
	// BlockerPoll is how often the sessions blocking the migration are sampled while it runs, so
	// that a give-up can name them (DefaultBlockerPoll when 0).
	BlockerPoll time.Duration
}

// Defaults of [Migrator]. A try waits at most the migration's own lock_timeout (3 s in
// schema/migrations), so five tries with waits of up to 2, 4, 8 and 16 s give up within about
// 45 s: long enough for an issuance's transaction (at most ISSUE_BUDGET, 2.5 s) or a relay batch
// to end, short enough for a deploy to fail while someone is still watching it.
const (
	DefaultTries       = 5
	DefaultBackoffBase = 2 * time.Second
	DefaultBackoffCap  = 16 * time.Second
	DefaultBlockerPoll = 100 * time.Millisecond
)

// LockError is the give-up: migration Version (file Source) failed on a lock Tries times.
type LockError struct {
	Version  int64
	Source   string
	SQLState string // of the last try: 55P03 or 40P01
	Tries    int
	// Blockers are the sessions pg_blocking_pids named as blocking the migration at the last
	// sample before it failed, as pg_stat_activity described them; empty when none was seen.
	Blockers []Blocker
	Err      error // the last try's error
}

// Blocker is a session that held a lock the migration waited for.
type Blocker struct {
	PID         int
	User        string
	Application string
	State       string // pg_stat_activity.state, such as "idle in transaction"
	XactStart   time.Time
	Query       string // its current or last statement, cut to 200 characters
}

func (e *LockError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "schema: migration %s gave up after %d tries on a lock (SQLSTATE %s: %s)",
		e.Source, e.Tries, e.SQLState, lockCause(e.SQLState))
	if len(e.Blockers) == 0 {
		b.WriteString("; no blocking session was seen (a deadlock's other side goes on at once)")
	}
	for _, s := range e.Blockers {
		fmt.Fprintf(&b, "\n  held by pid %d, user %q, application %q, %s since %s: %s",
			s.PID, s.User, s.Application, s.State, s.XactStart.UTC().Format(time.RFC3339), s.Query)
	}
	b.WriteString("\nNothing of this migration was applied; the migrations before it were. " +
		"Find what holds the lock (SELECT pid, state, xact_start, query FROM pg_stat_activity WHERE " +
		"xact_start IS NOT NULL ORDER BY xact_start), end it or wait for it to end " +
		"(SELECT pg_terminate_backend(pid) ends it), then run migrate again.")
	return b.String()
}

func (e *LockError) Unwrap() error { return e.Err }

func lockCause(state string) string {
	if state == "40P01" {
		return "deadlock detected"
	}
	return "lock_timeout"
}

// Migrate applies every pending migration of [Migrations] to db with the [Migrator] defaults and
// returns the versions it applied. A migration that fails leaves the database at the version
// before it.
func Migrate(ctx context.Context, db *sql.DB) ([]int64, error) {
	return Migrator{}.Up(ctx, db)
}

// Up applies every pending migration to db and returns the versions it applied, retrying a
// migration that failed on a lock as [Migrator] says. It gives up with a *[LockError] after Tries
// lock failures of one migration, and at once on any other error.
func (m Migrator) Up(ctx context.Context, db *sql.DB) ([]int64, error) {
	m = m.withDefaults()
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("schema: migration lock: %w", err)
	}
	pl := &pidLocker{SessionLocker: locker}
	p, err := goose.NewProvider(goose.DialectPostgres, db, m.FS, goose.WithSessionLocker(pl))
	if err != nil {
		return nil, fmt.Errorf("schema: load migrations: %w", err)
	}
	var applied []int64
	failures := map[int64]int{}
	for {
		w := watchBlockers(ctx, db, pl, m.BlockerPoll)
		results, err := p.Up(ctx)
		blockers := w.stop()
		applied = append(applied, appliedVersions(results, err)...)
		if err == nil {
			return applied, nil
		}
		failed, state := lockFailure(err)
		if failed == nil {
			return applied, fmt.Errorf("schema: migrate: %w", err)
		}
		v, src := failed.Source.Version, failed.Source.Path
		failures[v]++
		if failures[v] >= m.Tries {
			return applied, &LockError{Version: v, Source: src, SQLState: state, Tries: m.Tries, Blockers: blockers, Err: err}
		}
		wait := backoff.FullJitter(m.BackoffBase, m.BackoffCap, failures[v])
		fmt.Fprintf(m.Report, "migrate: %s failed on a lock (SQLSTATE %s: %s%s); retrying in %s (try %d of %d)\n",
			src, state, lockCause(state), blockerSummary(blockers), wait.Round(time.Millisecond), failures[v]+1, m.Tries)
		select {
		case <-ctx.Done():
			return applied, fmt.Errorf("schema: migrate: %s: %w", src, ctx.Err())
		case <-time.After(wait):
		}
	}
}

func (m Migrator) withDefaults() Migrator {
	if m.FS == nil {
		m.FS = Migrations()
	}
	if m.Tries <= 0 {
		m.Tries = DefaultTries
	}
	if m.BackoffBase <= 0 {
		m.BackoffBase = DefaultBackoffBase
	}
	if m.BackoffCap <= 0 {
		m.BackoffCap = DefaultBackoffCap
	}
	if m.BlockerPoll <= 0 {
		m.BlockerPoll = DefaultBlockerPoll
	}
	if m.Report == nil {
		m.Report = io.Discard
	}
	return m
}

// appliedVersions are the versions a goose Up applied: all of results, or on a
// *goose.PartialError those applied before the failed one.
func appliedVersions(results []*goose.MigrationResult, err error) []int64 {
	var partial *goose.PartialError
	if errors.As(err, &partial) {
		results = partial.Applied
	}
	vs := make([]int64, 0, len(results))
	for _, r := range results {
		vs = append(vs, r.Source.Version)
	}
	return vs
}

// lockFailure is the migration that failed on a lock, and the SQLSTATE, when err is a goose
// *PartialError whose cause is 55P03 or 40P01; else nil.
func lockFailure(err error) (*goose.MigrationResult, string) {
	var partial *goose.PartialError
	if !errors.As(err, &partial) || partial.Failed == nil {
		return nil, ""
	}
	if state := lockState(err); state != "" {
		return partial.Failed, state
	}
	return nil, ""
}

// lockState is err's SQLSTATE when it is 55P03 (lock_not_available) or 40P01
// (deadlock_detected), else "".
func lockState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01") {
		return pgErr.Code
	}
	return ""
}

func blockerSummary(bs []Blocker) string {
	if len(bs) == 0 {
		return ""
	}
	pids := make([]string, len(bs))
	for i, b := range bs {
		pids[i] = fmt.Sprintf("pid %d (%s)", b.PID, b.State)
	}
	return ", blocked by " + strings.Join(pids, ", ")
}

// pidLocker is goose's PostgreSQL session advisory lock, taken on the connection goose runs the
// migrations on; it also records that connection's backend pid, whose blockers watchBlockers
// samples.
type pidLocker struct {
	lock.SessionLocker
	mu  sync.Mutex
	pid int
}

func (l *pidLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	var pid int
	if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return fmt.Errorf("schema: migration session: %w", err)
	}
	l.mu.Lock()
	l.pid = pid
	l.mu.Unlock()
	return l.SessionLocker.SessionLock(ctx, conn)
}

func (l *pidLocker) backendPID() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pid
}

// sqlBlockers describes the sessions blocking backend $1 (PostgreSQL 15 docs, 9.26 "System
// Information Functions": pg_blocking_pids).
const sqlBlockers = `
SELECT a.pid, coalesce(a.usename, ''), coalesce(a.application_name, ''), coalesce(a.state, ''),
       coalesce(a.xact_start, now()), left(coalesce(a.query, ''), 200)
  FROM unnest(pg_blocking_pids($1)) AS b(pid) JOIN pg_stat_activity a ON a.pid = b.pid
 ORDER BY a.pid`

// blockerWatch samples, on a connection of its own, the sessions blocking the migration's
// connection, and keeps the last non-empty sample.
type blockerWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	last   []Blocker
}

func watchBlockers(ctx context.Context, db *sql.DB, pl *pidLocker, every time.Duration) *blockerWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &blockerWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if pid := pl.backendPID(); pid != 0 {
				if bs := sampleBlockers(ctx, db, pid); len(bs) > 0 {
					w.last = bs
				}
			}
		}
	}()
	return w
}

// stop ends the sampling and returns the last sessions seen blocking the migration.
func (w *blockerWatch) stop() []Blocker {
	w.cancel()
	<-w.done
	return w.last
}

// sampleBlockers is one sample; an error (the pool busy, the context ended) is no sample.
func sampleBlockers(ctx context.Context, db *sql.DB, pid int) []Blocker {
	rows, err := db.QueryContext(ctx, sqlBlockers, pid)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var bs []Blocker
	for rows.Next() {
		var b Blocker
		if rows.Scan(&b.PID, &b.User, &b.Application, &b.State, &b.XactStart, &b.Query) != nil {
			return nil
		}
		bs = append(bs, b)
	}
	return bs
}
