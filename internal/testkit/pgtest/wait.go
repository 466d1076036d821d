package pgtest

// The shared test kit of lock tests: a bounded poll ([Eventually]), a session that holds a
// campaign's budget rows until released ([HoldCampaign]), and counts of the sessions waiting
// behind one backend ([BlockedBy], [WaitBlockedBy]), never server-wide counts: tests of other
// packages and databases run on the same server at the same time.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PollTimeout bounds the waits of this package's helpers, and is the usual bound of a test's own
// [Eventually]. It is generous on purpose: on a loaded machine a wait that takes milliseconds
// may take seconds; a test may be slow, never wrong. A condition that never comes still fails the test, instead of hanging it until go
// test's own timeout.
const PollTimeout = 30 * time.Second

// Eventually calls cond until it returns nil, with short pauses (1 ms, doubling to 20 ms), and
// fails t with cond's last error once timeout has passed. cond's error says what is still
// missing ("3 sessions wait, want 4"); cond may call t.Fatal itself (it runs on t's goroutine).
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still not so after %s: %v", timeout, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// Querier is a connection, a pool or a transaction to run a count through.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// sqlWaitersOf lists the backends waiting for a lock that backend $1 holds, directly or behind
// another such waiter: of several sessions waiting for one locked row only the first waits for
// the holder's transaction itself, the others queue for the row's tuple lock, which the first
// holds (PostgreSQL 15 docs, 9.26 "System Information Functions", pg_blocking_pids). It reads
// pg_locks, which is live on every call, not pg_stat_activity, whose snapshot stays fixed until
// the end of the reader's transaction (the reader may be the holder's own transaction).
const sqlWaitersOf = `
WITH RECURSIVE waiter(pid) AS (
    SELECT l.pid FROM pg_locks l WHERE NOT l.granted AND $1::int = ANY (pg_blocking_pids(l.pid))
    UNION
    SELECT l.pid FROM pg_locks l JOIN waiter w ON w.pid = ANY (pg_blocking_pids(l.pid)) WHERE NOT l.granted
)
SELECT coalesce(array_agg(DISTINCT pid ORDER BY pid), '{}')::int[] FROM waiter`

// WaitersOf returns the pids of the backends waiting, directly or behind another waiter, for a
// lock that backend pid holds (see [sqlWaitersOf]), in ascending order. Only pid's waiters
// count: a lock waiter of a parallel test, in any database, never does.
func WaitersOf(t testing.TB, q Querier, pid int) []int {
	t.Helper()
	var pids []int32
	if err := q.QueryRow(context.Background(), sqlWaitersOf, pid).Scan(&pids); err != nil {
		t.Fatalf("pgtest: waiters of backend %d: %v", pid, err)
	}
	out := make([]int, len(pids))
	for i, p := range pids {
		out[i] = int(p)
	}
	return out
}

// BlockedBy counts the backends waiting for a lock that backend pid holds (see [WaitersOf]).
func BlockedBy(t testing.TB, q Querier, pid int) int {
	t.Helper()
	return len(WaitersOf(t, q, pid))
}

// WaitBlockedBy polls through q, at most [PollTimeout], until exactly n backends wait for a lock
// that backend pid holds (see [WaitersOf]), and returns their pids.
func WaitBlockedBy(t testing.TB, q Querier, pid, n int) []int {
	t.Helper()
	var pids []int
	Eventually(t, PollTimeout, func() error {
		if pids = WaitersOf(t, q, pid); len(pids) != n {
			return fmt.Errorf("%d backends wait for a lock that backend %d holds (%v), want %d", len(pids), pid, pids, n)
		}
		return nil
	})
	return pids
}

// Hold is a session of its own that holds rows of campaign_budgets FOR UPDATE in an open
// transaction, as a stuck or slow transaction of another instance would, until [Hold.Release].
type Hold struct {
	t        testing.TB
	conn     *pgx.Conn // the holder
	observer *pgx.Conn // counts the holder's waiters, so that the holder's transaction is never touched
	tx       pgx.Tx
	pid      int
	once     sync.Once
}

// HoldCampaign opens a connection to databaseURL and locks campaignID's budget rows, all of its
// stripes, or only the stripes given, in a transaction kept open until [Hold.Release] (or the
// end of t, which releases it). It fails t if no row was locked: a hold of a campaign that does
// not exist holds nothing.
func HoldCampaign(t testing.TB, databaseURL, campaignID string, stripes ...int) *Hold {
	t.Helper()
	ctx := context.Background()
	h := &Hold{t: t}
	var err error
	if h.conn, err = pgx.Connect(ctx, databaseURL); err != nil {
		t.Fatalf("pgtest: hold %s: connect: %v", campaignID, err)
	}
	t.Cleanup(func() { h.conn.Close(context.Background()) })
	if h.observer, err = pgx.Connect(ctx, databaseURL); err != nil {
		t.Fatalf("pgtest: hold %s: connect the observer: %v", campaignID, err)
	}
	t.Cleanup(func() { h.observer.Close(context.Background()) })
	h.pid = int(h.conn.PgConn().PID())
	if h.tx, err = h.conn.Begin(ctx); err != nil {
		t.Fatalf("pgtest: hold %s: begin: %v", campaignID, err)
	}
	t.Cleanup(h.Release)
	var locked int
	if err := h.tx.QueryRow(ctx, `SELECT count(*)::int FROM (SELECT 1 FROM campaign_budgets
		WHERE campaign_id = $1 AND (coalesce(cardinality($2::int[]), 0) = 0 OR stripe = ANY ($2)) FOR UPDATE) held`,
		campaignID, stripes).Scan(&locked); err != nil {
		t.Fatalf("pgtest: hold %s: %v", campaignID, err)
	}
	if locked == 0 || (len(stripes) > 0 && locked != len(stripes)) {
		t.Fatalf("pgtest: hold %s stripes %v: locked %d budget rows", campaignID, stripes, locked)
	}
	return h
}

// PID is the holder's backend pid.
func (h *Hold) PID() int { return h.pid }

// Tx is the holder's transaction, for a test that writes in it before [Hold.Release] commits it.
func (h *Hold) Tx() pgx.Tx { return h.tx }

// Waiters returns the pids of the backends waiting behind the holder (see [WaitersOf]).
func (h *Hold) Waiters() []int {
	h.t.Helper()
	return WaitersOf(h.t, h.observer, h.pid)
}

// Blocked counts the backends waiting behind the holder (see [WaitersOf]).
func (h *Hold) Blocked() int {
	h.t.Helper()
	return len(h.Waiters())
}

// WaitBlocked polls, at most [PollTimeout], until exactly n backends wait behind the holder, and
// returns their pids.
func (h *Hold) WaitBlocked(n int) []int {
	h.t.Helper()
	return WaitBlockedBy(h.t, h.observer, h.pid, n)
}

// Release ends the holder's transaction (a commit: the holder wrote nothing of its own unless
// the test did so through [Hold.Tx]). Later calls do nothing.
func (h *Hold) Release() {
	h.t.Helper()
	h.once.Do(func() {
		if err := h.tx.Commit(context.Background()); err != nil {
			h.t.Errorf("pgtest: release the hold of backend %d: %v", h.pid, err)
		}
	})
}

// SamePIDs reports whether a and b name the same backends, in any order.
func SamePIDs(a, b []int) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
