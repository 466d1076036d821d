package issuance_test

// The shape of the hot path, judged by what PostgreSQL and the wire show: one round trip per
// attempt, no lock held across a client round trip, and refusals that write nothing. Each
// detector is first shown to catch a broken variant (kept here as a fixture: the transaction
// driven from the client, as before 00009_issue_coupon.sql), then run on the service.

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// roundTrips is a TCP proxy in front of a PostgreSQL server that counts the round trips clients
// make: each Sync (extended protocol) or Query (simple protocol) message is one request the
// client then waits on (PostgreSQL 15 docs, 55.2 "Message Flow").
type roundTrips struct {
	addr  string
	count atomic.Int64
}

// startRoundTrips starts a counting proxy to databaseURL's server and returns it and a URL
// through it (without TLS, so that the messages can be read).
func startRoundTrips(t *testing.T, databaseURL string) (*roundTrips, string) {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	rt := &roundTrips{addr: ln.Addr().String()}
	target := u.Host
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			go func() { io.Copy(client, server); client.Close() }()
			go func() { rt.relay(server, client); server.Close() }()
		}
	}()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	u.Host = rt.addr
	return rt, u.String()
}

// relay copies a client's messages to the server, counting Sync and Query messages. The first
// message (startup, or a cancel request) has no type byte.
func (rt *roundTrips) relay(server io.Writer, client io.Reader) {
	var head [5]byte
	if _, err := io.ReadFull(client, head[:4]); err != nil {
		return
	}
	if _, err := server.Write(head[:4]); err != nil {
		return
	}
	if _, err := io.CopyN(server, client, int64(binary.BigEndian.Uint32(head[:4]))-4); err != nil {
		return
	}
	for {
		if _, err := io.ReadFull(client, head[:]); err != nil {
			return
		}
		if head[0] == 'S' || head[0] == 'Q' {
			rt.count.Add(1)
		}
		if _, err := server.Write(head[:]); err != nil {
			return
		}
		if _, err := io.CopyN(server, client, int64(binary.BigEndian.Uint32(head[1:]))-4); err != nil {
			return
		}
	}
}

// TestOneRoundTripPerAttempt: every result code costs one round trip to PostgreSQL on a warm
// pooled connection (the first attempt on a connection reads its session once). The counter is
// first shown to see the round trips of the transaction driven from the client.
func TestOneRoundTripPerAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	rt, proxied := startRoundTrips(t, dbURL)
	pool := prodPool(t, proxied, 1)
	svc := faultService(t, pool, issuance.Config{}, "RT")
	owner := connect(t, dbURL)
	for _, c := range []campaign.Campaign{
		{ID: "RT-SMALL", DiscountYen: 1000, BudgetYen: 1000},
		{ID: "RT-STRIPED", DiscountYen: 1000, BudgetYen: 100_000, Stripes: 4},
		{ID: "RT-LATER", DiscountYen: 1000, BudgetYen: 100_000, StartsAt: ptr(faultDay.Add(time.Hour))},
	} {
		if err := campaign.Create(ctx, owner, c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.Issue(ctx, "warm", "RT"); err != nil { // reads the pooled session once
		t.Fatal(err)
	}

	t.Run("detector", func(t *testing.T) {
		before := rt.count.Load()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		})
		if got := rt.count.Load() - before; err != nil || got != 3 {
			t.Fatalf("BEGIN, SELECT, COMMIT counted as %d round trips (%v), want 3", got, err)
		}
	})

	for _, c := range []struct {
		member, campaign string
		want             issuance.Result
	}{
		{"m1", "RT", issuance.ResultIssued},
		{"m1", "RT", issuance.ResultAlreadyIssued},
		{"m1", "RT-STRIPED", issuance.ResultIssued},
		{"m1", "RT-SMALL", issuance.ResultMonthlyCap},
		{"m2", "RT-SMALL", issuance.ResultIssued},
		{"m3", "RT-SMALL", issuance.ResultBudgetExceeded},
		{"m3", "RT-LATER", issuance.ResultCampaignNotActive},
		{"m3", "NO-SUCH", issuance.ResultUnknownCampaign},
	} {
		before := rt.count.Load()
		out, err := svc.Issue(ctx, c.member, c.campaign)
		if err != nil || out.Result != c.want || out.Attempts != 1 {
			t.Fatalf("%s %s: %+v %v, want %s in one attempt", c.member, c.campaign, out, err, c.want)
		}
		if got := rt.count.Load() - before; got != 1 {
			t.Errorf("%s %s (%s): %d round trips, want 1", c.member, c.campaign, c.want, got)
		}
	}
	assertRules(t, owner)
}

func ptr[T any](v T) *T { return &v }

// issueFunc issues one coupon of campaignID to memberID.
type issueFunc func(ctx context.Context, memberID, campaignID string) error

// clientTransaction is the broken variant: the same call inside a transaction that the client
// commits in a round trip of its own, so the budget row stays locked across that round trip.
func clientTransaction(pool *pgxpool.Pool) issueFunc {
	return func(ctx context.Context, memberID, campaignID string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var result string
			err := tx.QueryRow(ctx, `SELECT result FROM issue_coupon(gen_random_uuid(), $1, $2, $3, 2000, NULL)`,
				campaignID, memberID, faultDay).Scan(&result)
			if err == nil && result != string(issuance.ResultIssued) {
				err = fmt.Errorf("%s", result)
			}
			return err
		})
	}
}

// idleHolders samples, every few ms until stop is closed, the sessions that wait for a lock on
// campaign_budgets, and returns how many samples found one whose blocker sat between two client
// messages (idle in transaction, or waiting for the client's next message with a transaction
// open): a lock held across a round trip.
func idleHolders(t *testing.T, observer *pgx.Conn, stop <-chan struct{}) (waits, idle int) {
	t.Helper()
	for {
		select {
		case <-stop:
			return waits, idle
		default:
		}
		var w, i int
		err := observer.QueryRow(context.Background(), `
SELECT count(DISTINCT waiter.pid)::int,
       count(DISTINCT waiter.pid) FILTER (WHERE holder.state LIKE 'idle in transaction%'
                                  OR (holder.wait_event = 'ClientRead' AND holder.backend_xid IS NOT NULL))::int
  FROM pg_locks l
  JOIN pg_stat_activity waiter ON waiter.pid = l.pid
  JOIN pg_stat_activity holder ON holder.pid = ANY (pg_blocking_pids(l.pid))
 WHERE NOT l.granted AND waiter.datname = current_database()
   AND (l.relation = 'campaign_budgets'::regclass OR l.locktype IN ('transactionid', 'tuple'))`).Scan(&w, &i)
		if err != nil {
			t.Fatal(err)
		}
		waits += w
		idle += i
		time.Sleep(2 * time.Millisecond)
	}
}

// burstThroughLatency releases 32 issuances of one 1-stripe campaign from a barrier through a
// proxy adding 50 ms each way, samples the lock waiters meanwhile, and returns the samples.
func burstThroughLatency(t *testing.T, issue issueFunc, observer *pgx.Conn, campaignID string) (waits, idle int) {
	t.Helper()
	ctx := context.Background()
	const clients = 32
	var ready, wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, clients)
	ready.Add(clients)
	for i := range clients {
		wg.Go(func() {
			ready.Done()
			<-start
			errs <- issue(ctx, fmt.Sprintf("%s-%02d", campaignID, i), campaignID)
		})
	}
	ready.Wait()
	stop := make(chan struct{})
	sampled := make(chan [2]int, 1)
	go func() { w, i := idleHolders(t, observer, stop); sampled <- [2]int{w, i} }()
	close(start)
	wg.Wait()
	close(stop)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("%s: %v", campaignID, err)
		}
	}
	s := <-sampled
	if n := scalar[int](t, observer, `SELECT count(*)::int FROM issued_coupons WHERE campaign_id = $1`, campaignID); n != clients {
		t.Errorf("%s: %d coupons, want %d", campaignID, n, clients)
	}
	return s[0], s[1]
}

// TestNoLockHeldAcrossTheNetwork: 32 issuances of one 1-stripe campaign at once, each 100 ms of
// round trip away from PostgreSQL. All are issued, and no session waiting for the budget row is
// ever blocked by one that holds it while waiting for its client. The transaction driven from
// the client, through the same proxy, is caught doing exactly that.
func TestNoLockHeldAcrossTheNetwork(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	proxy, proxied := startProxy(t, dbURL)
	for _, stream := range []string{"upstream", "downstream"} {
		if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
			`{"name": "rtt-%s", "type": "latency", "stream": %q, "attributes": {"latency": 50}}`, stream, stream))); err != nil {
			t.Fatal(err)
		}
	}
	pool := prodPool(t, proxied, 32)
	svc := faultService(t, pool, issuance.Config{}, "NET", "NET-CLIENT-TX")
	observer := connect(t, dbURL)

	waits, idle := burstThroughLatency(t, clientTransaction(pool), observer, "NET-CLIENT-TX")
	if waits == 0 || idle == 0 {
		t.Fatalf("transaction driven from the client: %d waiter samples, %d behind an idle holder; want both > 0 (the detector)", waits, idle)
	}
	t.Logf("transaction driven from the client: %d waiter samples, %d behind a holder waiting for its client", waits, idle)

	waits, idle = burstThroughLatency(t, func(ctx context.Context, memberID, campaignID string) error {
		out, err := svc.Issue(ctx, memberID, campaignID)
		if err == nil && out.Result != issuance.ResultIssued {
			err = fmt.Errorf("%s", out.Result)
		}
		return err
	}, observer, "NET")
	t.Logf("IssueCoupon's one call: %d waiter samples, %d behind a holder waiting for its client", waits, idle)
	if idle != 0 {
		t.Errorf("%d samples found a budget row waiter blocked by a session waiting for its client", idle)
	}
	assertRules(t, observer)
}

// writes is what the statistics say was written to the issuance tables and rolled back in the
// current database, as flushed by sessions that have ended (PostgreSQL 15 docs, 28.2.2 "Viewing
// Statistics": a backend reports its counts at least once a second, and when it exits).
type writes struct{ inserted, updated, deleted, rolledBack int64 }

// writesNow waits until no other session of the database runs (their statistics are flushed when
// they exit), then reads [writes] on a connection of its own.
func writesNow(t *testing.T, dbURL string) writes {
	t.Helper()
	ctx := context.Background()
	conn := connect(t, dbURL)
	defer conn.Close(ctx)
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if n := scalar[int](t, conn, `SELECT count(*)::int FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`); n > 0 {
			return fmt.Errorf("%d sessions of the database still run after their pools closed", n)
		}
		return nil
	})
	var w writes
	if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `
SELECT sum(n_tup_ins)::bigint, sum(n_tup_upd)::bigint, sum(n_tup_del)::bigint,
       (SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database())
  FROM pg_stat_user_tables
 WHERE relname IN ('campaign_budgets', 'issued_coupons', 'member_monthly_usage', 'notification_outbox')`).
		Scan(&w.inserted, &w.updated, &w.deleted, &w.rolledBack); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestRefusalsWriteNothing: once a campaign is sold out, a burst of 64 requests for it, a
// double tap, a member at the monthly cap, an unknown, a not started and a paused campaign are all refused
// from reads: the statistics show no row inserted, updated or deleted and no transaction rolled
// back. The same statistics are first shown to see a refusal that inserts and rolls back.
func TestRefusalsWriteNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	setup, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	svc := faultService(t, setup, issuance.Config{}, "OPEN")
	for _, c := range []campaign.Campaign{
		{ID: "SOLD", DiscountYen: 1000, BudgetYen: 2000, Stripes: 2},
		{ID: "LATER", DiscountYen: 1000, BudgetYen: 100_000, StartsAt: ptr(faultDay.Add(time.Hour))},
		{ID: "HELD", DiscountYen: 1000, BudgetYen: 100_000, Stripes: 4},
	} {
		if err := campaign.Create(ctx, setup, c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := campaign.Pause(ctx, setup, "HELD", "TestRefusalsWriteNothing"); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]string{{"a", "SOLD"}, {"b", "SOLD"}, {"a", "OPEN"}} {
		if out, err := svc.Issue(ctx, r[0], r[1]); err != nil || out.Result != issuance.ResultIssued {
			t.Fatalf("set-up %v: %+v %v", r, out, err)
		}
	}
	setup.Close()

	t.Run("detector", func(t *testing.T) {
		before := writesNow(t, dbURL)
		conn := connect(t, dbURL)
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
				VALUES ('SOLD', 'z', '2026-09', 1000)`); err != nil {
				return err
			}
			return fmt.Errorf("BUDGET_EXCEEDED") // rolls the insert back, as the refusals of old did
		})
		if err == nil {
			t.Fatal("the fixture's transaction committed")
		}
		conn.Close(ctx)
		if d := diff(writesNow(t, dbURL), before); d.inserted != 1 || d.rolledBack != 1 {
			t.Fatalf("an insert rolled back seen as %+v, want 1 inserted, 1 rolled back", d)
		}
	})

	before := writesNow(t, dbURL)
	pool := prodPool(t, dbURL, 16)
	svc = faultService(t, pool, issuance.Config{})
	var wg sync.WaitGroup
	var ready sync.WaitGroup
	start := make(chan struct{})
	results := make(chan issuance.Outcome, 64)
	ready.Add(64)
	for i := range 64 {
		wg.Go(func() {
			ready.Done()
			<-start
			out, err := svc.Issue(ctx, fmt.Sprintf("late%02d", i), "SOLD")
			if err != nil {
				t.Error(err)
			}
			results <- out
		})
	}
	ready.Wait()
	close(start)
	wg.Wait()
	close(results)
	for out := range results {
		if out.Result != issuance.ResultBudgetExceeded {
			t.Errorf("sold out: %+v, want BUDGET_EXCEEDED", out)
		}
	}
	for _, c := range []struct {
		member, campaign string
		want             issuance.Result
	}{
		{"a", "SOLD", issuance.ResultAlreadyIssued},
		{"a", "NO-SUCH", issuance.ResultUnknownCampaign},
		{"a", "LATER", issuance.ResultCampaignNotActive},
		{"a", "HELD", issuance.ResultCampaignNotActive},
	} {
		if out, err := svc.Issue(ctx, c.member, c.campaign); err != nil || out.Result != c.want {
			t.Errorf("%s %s: %+v %v, want %s", c.member, c.campaign, out, err, c.want)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE member_monthly_usage SET used_yen = 2000 WHERE member_id = 'b'`); err != nil {
		t.Fatal(err)
	}
	if out, err := svc.Issue(ctx, "b", "OPEN"); err != nil || out.Result != issuance.ResultMonthlyCap {
		t.Errorf("b OPEN: %+v %v, want MONTHLY_CAP", out, err)
	}
	pool.Close()
	d := diff(writesNow(t, dbURL), before)
	d.updated-- // the test's own UPDATE of b's usage, to put b at the cap
	if d != (writes{}) {
		t.Errorf("the refusals wrote %+v, want nothing", d)
	}
}

func diff(after, before writes) writes {
	return writes{after.inserted - before.inserted, after.updated - before.updated,
		after.deleted - before.deleted, after.rolledBack - before.rolledBack}
}
