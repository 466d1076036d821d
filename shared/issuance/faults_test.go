package issuance_test

// Production faults, each injected by the test on a real PostgreSQL: sessions killed under the
// pool (a failover), a restart in the middle of the Silver Week traffic, a column type changed
// under prepared statements, a COMMIT whose answer is lost, a statement running into the
// deadline, and callers that give up while waiting on a lock. The pools are built by shared/db,
// as the deployed functions build theirs.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/localpg"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/issuance"
)

var faultDay = time.Date(2026, 9, 21, 10, 0, 0, 0, issuance.Tokyo)

// prodPool opens databaseURL through shared/db with maxConns connections, closed when t ends.
func prodPool(t *testing.T, databaseURL string, maxConns int) *pgxpool.Pool {
	t.Helper()
	pool, closePool, err := db.Open(context.Background(), db.Config{DatabaseURL: databaseURL, MaxConns: maxConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closePool)
	return pool
}

// faultService is a Service on pool with cfg and the database's clock set to faultDay
// (pgtest.SetClock), after creating campaigns of
// 1,000 yen coupons with a budget of 10,000,000 yen.
func faultService(t *testing.T, pool *pgxpool.Pool, cfg issuance.Config, campaigns ...string) *issuance.Service {
	t.Helper()
	for _, id := range campaigns {
		if err := campaign.Create(context.Background(), pool, campaign.Campaign{ID: id, DiscountYen: 1000, BudgetYen: 10_000_000}); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.SetClock(t, pool, faultDay)
	svc, err := issuance.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// connect opens a connection of its own to databaseURL (a lock holder, an observer).
func connect(t *testing.T, databaseURL string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func scalar[T any](t *testing.T, q db.Querier, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := q.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// firings reads how many times a fault's trigger fired, counted by nextval of sequence seq
// (not transactional: a firing whose transaction rolled back counts too).
func firings(t *testing.T, q db.Querier, seq string) int64 {
	t.Helper()
	return scalar[int64](t, q, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM `+pgx.Identifier{seq}.Sanitize())
}

// waitDone waits, at most pgtest.PollTimeout, for the one value a goroutine of the test sends on
// done: a call that never returns fails the test instead of hanging it.
func waitDone[T any](t *testing.T, done <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-done:
		return v
	case <-time.After(pgtest.PollTimeout):
		t.Fatalf("%s: no answer after %s", what, pgtest.PollTimeout)
		panic("unreachable")
	}
}

// assertRules checks R1-R3 and one outbox row per coupon, by SQL.
func assertRules(t *testing.T, q db.Querier) reconcile.Report {
	t.Helper()
	rep, err := reconcile.Check(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	if v := rep.Violations(); len(v) > 0 {
		t.Fatalf("rules broken: %v", v)
	}
	return rep
}

// TestPooledSessionsTerminated: every pooled session is ended by the server (57P01, as in a
// restart or failover) while the pool still holds them. Each request is retried on a fresh
// connection: all ISSUED, none doubled.
func TestPooledSessionsTerminated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	pool := prodPool(t, dbURL, 4)
	svc := faultService(t, pool, issuance.Config{}, "FAILOVER")
	warm := make([]*pgxpool.Conn, 4)
	for i := range warm {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		warm[i] = c
	}
	for _, c := range warm {
		c.Release()
	}
	admin := connect(t, dbURL)
	if n := scalar[int](t, admin, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))::int
		FROM (SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND usename = current_user
		      AND pid <> pg_backend_pid() OFFSET 0) pooled`); n != 4 {
		t.Fatalf("terminated %d pooled sessions, want 4", n)
	}
	for i := range 8 {
		out, err := svc.Issue(ctx, fmt.Sprintf("f%d", i), "FAILOVER")
		if err != nil || out.Result != issuance.ResultIssued {
			t.Fatalf("request %d after the sessions were ended: %+v %v, want ISSUED", i, out, err)
		}
	}
	if n := scalar[int](t, admin, `SELECT count(*)::int FROM issued_coupons`); n != 8 {
		t.Errorf("coupons: %d, want 8", n)
	}
	assertRules(t, admin)
}

// TestRestartDuringSilverWeek restarts PostgreSQL (fast shutdown, as `pg_ctl restart -m fast`)
// once a third of the Silver Week traffic has been answered, then stops it and starts it again.
// No request fails with an error; every answer is true (an ISSUED coupon exists with its id,
// every coupon was answered ISSUED to someone); the re-sends of those sent away complete the
// scenario (600 coupons); reconcile finds no drift and every coupon has its outbox row; while
// the database is down the answer is RETRY_EXHAUSTED; the same Service recovers. The fault is
// checked on the server (pg_postmaster_start_time changes across the restart) and in the
// answers (requests met it: retried, RETRY_EXHAUSTED or outcome unknown). An outcome is unknown
// only for a call in flight when the server went down, so there are at most as many as
// clients (32).
func TestRestartDuringSilverWeek(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := localpg.Start(ctx, localpg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	if _, err := schema.MigrateURL(ctx, srv.URL()); err != nil {
		t.Fatal(err)
	}
	pool := prodPool(t, srv.URL(), 8)
	startedAt := scalar[time.Time](t, pool, `SELECT pg_postmaster_start_time()`)
	if err := silverweek.CreateCampaigns(ctx, pool, silverweek.Campaigns); err != nil {
		t.Fatal(err)
	}
	pgtest.SetClock(t, pool, faultDay)
	svc, err := issuance.New(pool, issuance.Config{Budget: 1500 * time.Millisecond, StatementTimeout: time.Second, LockTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}

	type answer struct {
		member, campaign string
		out              issuance.Outcome
		err              error
	}
	var mu sync.Mutex
	var answers []answer
	issueFn := func(ctx context.Context, r silverweek.Request) (string, error) {
		out, err := svc.Issue(ctx, r.MemberID, r.CampaignID)
		mu.Lock()
		answers = append(answers, answer{r.MemberID, r.CampaignID, out, err})
		mu.Unlock()
		return string(out.Result), err
	}
	reqs := silverweek.Requests(silverweek.DefaultMembers, silverweek.Campaigns, silverweek.DefaultTapGap, 7)
	restarted := make(chan error, 1)
	var once sync.Once
	const clients = 32
	var answeredBefore, answeredAfter int
	silverweek.Run(ctx, reqs, clients, issueFn, func(done int) {
		if done >= len(reqs)/3 {
			once.Do(func() {
				answeredBefore = done
				go func() {
					err := srv.Restart(ctx)
					mu.Lock()
					answeredAfter = len(answers)
					mu.Unlock()
					restarted <- err
				}()
			})
		}
	})
	if answeredBefore == 0 {
		t.Fatal("the traffic ended before the restart began")
	}
	if err := waitDone(t, restarted, "the restart"); err != nil {
		t.Fatal(err)
	}
	if restartedAt := scalar[time.Time](t, pool, `SELECT pg_postmaster_start_time()`); !restartedAt.After(startedAt) {
		t.Fatalf("the server started at %s, and still at %s after the restart: it did not restart", startedAt, restartedAt)
	}
	if answeredAfter == len(reqs) {
		t.Fatalf("the traffic ended before the server was back up: no request met the restart")
	}

	issuedIDs := map[string]bool{}
	unknownPairs := map[string]bool{}
	exhausted, failed, unknown, retried := 0, 0, 0, 0
	for _, a := range answers {
		if a.out.Attempts > 1 {
			retried++
		}
		switch {
		case errors.Is(a.err, issuance.ErrOutcomeUnknown):
			unknown++
			unknownPairs[a.member+"/"+a.campaign] = true
		case a.err != nil:
			if failed++; failed <= 3 {
				t.Errorf("%s %s: %v", a.member, a.campaign, a.err)
			}
		case a.out.Result == issuance.ResultIssued:
			issuedIDs[a.out.CouponID] = true
		case a.out.Result == issuance.ResultRetryExhausted:
			exhausted++
		}
	}
	rows, err := pool.Query(ctx, `SELECT coupon_id::text, member_id || '/' || campaign_id FROM issued_coupons`)
	if err != nil {
		t.Fatal(err)
	}
	coupons, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ ID, Pair string }])
	if err != nil {
		t.Fatal(err)
	}
	inDB := map[string]bool{}
	for _, c := range coupons {
		inDB[c.ID] = true
		if !issuedIDs[c.ID] && !unknownPairs[c.Pair] {
			t.Errorf("coupon %s of %s exists, but no answer said ISSUED with it", c.ID, c.Pair)
		}
	}
	for id := range issuedIDs {
		if !inDB[id] {
			t.Errorf("answered ISSUED with %s, which does not exist", id)
		}
	}
	if failed > 0 {
		t.Errorf("%d requests failed with an error", failed)
	}
	t.Logf("restart began after %d answers, was over after %d; %d answers, %d coupons, %d retried, %d RETRY_EXHAUSTED, %d outcome unknown",
		answeredBefore, answeredAfter, len(answers), len(coupons), retried, exhausted, unknown)
	if retried+exhausted+unknown == 0 {
		t.Error("no request met the restart: none retried, RETRY_EXHAUSTED or outcome unknown")
	}
	if unknown > clients {
		t.Errorf("%d outcomes unknown, more than the %d calls that can have been in flight when the server went down", unknown, clients)
	}

	// The callers sent away re-send; the same Service, never restarted, completes the scenario.
	for _, r := range reqs {
		if _, err := svc.Issue(ctx, r.MemberID, r.CampaignID); err != nil {
			t.Fatalf("re-send %s %s: %v", r.MemberID, r.CampaignID, err)
		}
	}
	rep := assertRules(t, pool)
	if rep.Coupons != 600 {
		t.Errorf("coupons after the re-sends: %d, want 600", rep.Coupons)
	}

	if err := srv.Down(); err != nil {
		t.Fatal(err)
	}
	out, err := svc.Issue(ctx, "m9999", "SW-B")
	if err != nil || out.Result != issuance.ResultRetryExhausted {
		t.Errorf("with the database down: %+v %v, want RETRY_EXHAUSTED", out, err)
	}
	if err := srv.Up(ctx); err != nil {
		t.Fatal(err)
	}
	out, err = svc.Issue(ctx, "m9999", "SW-B")
	if err != nil || out.Result != issuance.ResultIssued {
		t.Errorf("once the database is back: %+v %v, want ISSUED", out, err)
	}
}

// TestColumnTypeChangedUnderPreparedStatements: a migration changes amount_yen to bigint while the
// pool's four sessions hold the call prepared (pgx's statement cache) and have run it, so that
// PostgreSQL has planned the coupon insert inside issue_coupons_batch_v2 on each. The fault: the
// ALTER runs between two rounds served by the same four sessions, which the test checks on the
// server (the backends waiting behind the campaign row in each round) along with the column's new
// type. Every request is still ISSUED. (The coupon insert lives inside issue_coupons_batch_v2,
// whose plans PL/pgSQL re-plans itself, so this migration never answers the client 0A000 "cached
// plan must not change result type"; a change of the call's own result columns does, and is
// retried: TestFunctionResultChangedUnderPreparedCalls.)
func TestColumnTypeChangedUnderPreparedStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	pool := prodPool(t, dbURL, 4)
	// One call per request (BatchMax 1): the test is about what each pooled session prepared.
	svc := faultService(t, pool, issuance.Config{BatchMax: 1}, "PLAN")
	admin := connect(t, dbURL)

	// Four requests at once, all parked on the campaign row after their coupon insert, so that
	// each of the four connections runs (and prepares) every statement. It returns the backends
	// that served them.
	round := func(name string) []int {
		hold := pgtest.HoldCampaign(t, dbURL, "PLAN")
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				out, err := svc.Issue(ctx, fmt.Sprintf("%s%d", name, i), "PLAN")
				if err != nil || out.Result != issuance.ResultIssued {
					t.Errorf("%s request %d: %+v %v, want ISSUED", name, i, out, err)
				}
			})
		}
		pids := hold.WaitBlocked(4)
		hold.Release()
		wg.Wait()
		return pids
	}
	before := round("before")
	if _, err := admin.Exec(ctx, `ALTER TABLE issued_coupons ALTER COLUMN amount_yen TYPE bigint`); err != nil {
		t.Fatal(err)
	}
	if typ := scalar[string](t, admin, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = 'issued_coupons'::regclass AND attname = 'amount_yen'`); typ != "bigint" {
		t.Fatalf("amount_yen is %s after the migration, want bigint", typ)
	}
	after := round("after")
	if !pgtest.SamePIDs(before, after) {
		t.Fatalf("the rounds ran on backends %v, then %v: the migration did not meet the sessions that prepared the call", before, after)
	}
	if n := scalar[int](t, admin, `SELECT count(*)::int FROM issued_coupons`); n != 8 {
		t.Errorf("coupons: %d, want 8", n)
	}
	assertRules(t, admin)
}

// startProxy puts a toxiproxy in front of databaseURL's server and returns the proxy and a URL
// through it.
func startProxy(t *testing.T, databaseURL string) (*toxiproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	proxy := toxiproxy.NewProxy(srv, "pg", "127.0.0.1:0", u.Host)
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Stop)
	u.Host = proxy.Listen
	if _, _, err := net.SplitHostPort(proxy.Listen); err != nil {
		t.Fatalf("proxy address %q: %v", proxy.Listen, err)
	}
	return proxy, u.String()
}

// blackholeToxic drops every byte of its stream, as a network that loses packets without
// resetting the connection, and counts what it dropped: the fault's own evidence.
type blackholeToxic struct {
	bytes atomic.Int64 // bytes dropped
	ready atomic.Int64 // ReadyForQuery messages among them: the ends of the server's answers
}

// pgReadyForQuery is the start of the backend ReadyForQuery message, which ends every answer
// (PostgreSQL 15 docs, 55.7 "Message Formats"); its last byte is the transaction status.
var pgReadyForQuery = []byte{'Z', 0, 0, 0, 5}

func (b *blackholeToxic) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			b.bytes.Add(int64(len(c.Data)))
			b.ready.Add(int64(bytes.Count(c.Data, pgReadyForQuery)))
		}
	}
}

func init() { toxics.Register("counting_blackhole", new(blackholeToxic)) }

// TestLostCommitAnswer: the server commits, but its answer to COMMIT never reaches the service
// (the network drops it). The fault, step by step: a deferred trigger holds the COMMIT on an
// advisory lock that the test holds (and counts its firings in a sequence); once the session
// waits there, the test blackholes the server-to-client stream and lets the COMMIT go; it lifts
// the blackhole only after the coupon is committed and the blackhole has swallowed the answer's
// ReadyForQuery. The service settles it before answering: ISSUED with the coupon that exists,
// never RETRY_EXHAUSTED ("nothing was written").
func TestLostCommitAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	proxy, proxied := startProxy(t, dbURL)
	pool := prodPool(t, proxied, 2)
	// The default budget: the COMMIT is held by the test, which must let it go before the call's
	// attempts end (1.9 s after the call began), or the cancel at that deadline rolls it back.
	svc := faultService(t, pool, issuance.Config{}, "LOST")
	admin := connect(t, dbURL)
	if _, err := admin.Exec(ctx, `
CREATE SEQUENCE held_commits;
CREATE FUNCTION held_commit() RETURNS trigger LANGUAGE plpgsql SET lock_timeout = 0 AS $$
BEGIN PERFORM nextval('held_commits'); PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER held_commit AFTER INSERT ON issued_coupons
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.member_id = 'lost') EXECUTE FUNCTION held_commit();
SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		out issuance.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := svc.Issue(ctx, "lost", "LOST")
		done <- result{out, err}
	}()
	pgtest.WaitBlockedBy(t, admin, int(admin.PgConn().PID()), 1) // the COMMIT waits for the test
	wrapper, err := proxy.Toxics.AddToxicJson(strings.NewReader(
		`{"name": "lost-answer", "type": "counting_blackhole", "stream": "downstream"}`))
	if err != nil {
		t.Fatal(err)
	}
	blackhole := proxy.Toxics.GetToxic(wrapper.Name).Toxic.(*blackholeToxic)
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
		t.Fatal(err)
	}
	var couponID string
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		couponID = scalar[string](t, admin, `SELECT coalesce((SELECT coupon_id::text FROM issued_coupons WHERE member_id = 'lost'), '')`)
		if couponID == "" || blackhole.ready.Load() == 0 {
			return fmt.Errorf("coupon %q committed, %d bytes and %d ReadyForQuery dropped: want the coupon and the answer's end dropped",
				couponID, blackhole.bytes.Load(), blackhole.ready.Load())
		}
		return nil
	})
	if err := proxy.Toxics.RemoveToxic(ctx, "lost-answer"); err != nil {
		t.Fatal(err)
	}
	r := waitDone(t, done, "Issue after its COMMIT answer was lost")
	t.Logf("the blackhole dropped %d bytes, %d ReadyForQuery; answer %+v %v", blackhole.bytes.Load(), blackhole.ready.Load(), r.out, r.err)
	if n := firings(t, admin, "held_commits"); n != 1 {
		t.Errorf("the COMMIT was held %d times, want once", n)
	}
	if r.err != nil || r.out.Result != issuance.ResultIssued || r.out.CouponID != couponID {
		t.Fatalf("COMMIT answer lost: %+v %v, want ISSUED with %s", r.out, r.err, couponID)
	}
	assertRules(t, admin)
}

// TestStatementEndsOnTheServer: a statement runs into the end of the budget (the fault: a
// trigger sleeps 5 s in the coupon insert, and counts its firings in a sequence).
// The server's statement_timeout ends it before the client's deadline would cut the
// connection, so the pooled connection survives, even in a pool built with pgx's defaults
// (which close a connection whose context ends).
func TestStatementEndsOnTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, 1)
	svc := faultService(t, pool, issuance.Config{Budget: time.Second, StatementTimeout: time.Second,
		LockTimeout: 500 * time.Millisecond}, "SLOW")
	if _, err := pool.Exec(ctx, `
CREATE SEQUENCE slow_inserts;
CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM nextval('slow_inserts'); PERFORM pg_sleep(5); RETURN NEW; END $$;
CREATE TRIGGER slow_insert BEFORE INSERT ON issued_coupons FOR EACH ROW EXECUTE FUNCTION slow_insert()`); err != nil {
		t.Fatal(err)
	}
	before := scalar[int64](t, pool, `SELECT pg_backend_pid()`)
	out, err := svc.Issue(ctx, "slow", "SLOW")
	if err != nil || out.Result != issuance.ResultRetryExhausted {
		t.Fatalf("%+v %v, want RETRY_EXHAUSTED", out, err)
	}
	if n := firings(t, pool, "slow_inserts"); n < 1 || int(n) != out.Attempts {
		t.Errorf("the slow trigger fired %d times in %d attempts, want once per attempt", n, out.Attempts)
	}
	if after := scalar[int64](t, pool, `SELECT pg_backend_pid()`); after != before {
		t.Errorf("the pooled connection was cut (backend %d, then %d): the client's deadline fired first", before, after)
	}
	if n := scalar[int](t, pool, `SELECT count(*)::int FROM issued_coupons`); n != 0 {
		t.Errorf("coupons: %d, want 0", n)
	}
}

// pooledPIDs takes all n connections of pool at once, runs a query on each, and returns their
// backends' pids.
func pooledPIDs(t *testing.T, pool *pgxpool.Pool, n int) []int {
	t.Helper()
	ctx := context.Background()
	pids := make([]int, n)
	for i := range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		pids[i] = scalar[int](t, c, `SELECT pg_backend_pid()`)
	}
	return pids
}

// TestCallerCancelStorm: 48 callers, in 6 rounds of 8 at once on a pool of 8 connections, give up
// while their requests wait on a locked campaign row (the fault: a session of the test holds the
// row; the test checks on the server that exactly the 8 pooled sessions wait behind it before
// it cancels). Each time: Issue returns context.Canceled; the cancel reached the server (every
// session whose connection the pool kept is idle the moment its Issue has returned, read from
// pg_stat_activity without waiting: the server ended its query before it answered); no session
// keeps queueing on the lock; and the pooled connections, kept, serve the next query unharmed
// (no stray cancel, no transaction left open). Then one request is ISSUED and the 48 wrote
// nothing.
func TestCallerCancelStorm(t *testing.T) {
	t.Parallel()
	const conns, rounds = 8, 6
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	pool := prodPool(t, dbURL, conns)
	// The longest lock wait an attempt can be given (the budget at its 3 s maximum), so that a
	// session the cancel did not reach would still be waiting when its state is read. One call
	// per request (BatchMax 1): the test is about each pooled session's wait; callers leaving the
	// coalescer's queue are TestCoalescedCallersLeave's.
	cfg := issuance.Config{Budget: issuance.AppTimeout, LockTimeout: 2800 * time.Millisecond, StatementTimeout: 2900 * time.Millisecond,
		BatchMax: 1}
	svc := faultService(t, pool, cfg, "HELD")
	admin := connect(t, dbURL)
	hold := pgtest.HoldCampaign(t, dbURL, "HELD")
	pooled := pooledPIDs(t, pool, conns)
	replaced := 0
	for round := range rounds {
		callCtx, cancel := context.WithCancel(ctx)
		errs := make(chan error, conns)
		for i := range conns {
			go func() {
				_, err := svc.Issue(callCtx, fmt.Sprintf("c%d-%d", round, i), "HELD")
				errs <- err
			}()
		}
		if waiting := hold.WaitBlocked(conns); !pgtest.SamePIDs(waiting, pooled) {
			t.Fatalf("round %d: backends %v wait behind the holder, want the pooled ones %v", round, waiting, pooled)
		}
		cancel()
		for i := range conns {
			if err := waitDone(t, errs, fmt.Sprintf("round %d: Issue %d after cancel", round, i)); !errors.Is(err, context.Canceled) {
				t.Fatalf("round %d: Issue after cancel: %v, want context.Canceled", round, err)
			}
		}
		states := sessionStates(t, admin, pooled) // before anything else uses the pool
		now := pooledPIDs(t, pool, conns)
		for _, pid := range pooled {
			switch {
			case !slices.Contains(now, pid):
				replaced++ // pgx closed it after db.CancelGrace: its cancel came late
			case states[pid] != "idle":
				t.Fatalf("round %d: backend %d, kept by the pool, was %q when its caller's Issue had returned: "+
					"its query outlived the cancel", round, pid, states[pid])
			}
		}
		// A session whose connection pgx closed may still wait a moment, until its late cancel
		// request arrives.
		pgtest.Eventually(t, pgtest.PollTimeout, func() error {
			if pids := hold.Waiters(); len(pids) > 0 {
				return fmt.Errorf("round %d: backends %v still wait on the lock after their callers left", round, pids)
			}
			return nil
		})
		pooled = now
	}
	// pgx's default closes the connection on every cancel; cancel-then-wait keeps it,
	// but on an overloaded machine a cancel request may take longer than the grace.
	t.Logf("%d of %d pooled connections replaced after their caller cancelled", replaced, conns*rounds)
	if replaced > conns*rounds/20 {
		t.Errorf("the pooled connection was replaced in %d of %d cancels, want it kept", replaced, conns*rounds)
	}
	hold.Release()
	if out, err := svc.Issue(ctx, "next", "HELD"); err != nil || out.Result != issuance.ResultIssued {
		t.Fatalf("next request: %+v %v, want ISSUED", out, err)
	}
	for _, table := range []string{"issued_coupons", "member_monthly_usage", "notification_outbox"} {
		if n := scalar[int](t, admin, `SELECT count(*)::int FROM `+table); n != 1 {
			t.Errorf("%s: %d rows, want 1 (the cancelled requests wrote nothing)", table, n)
		}
	}
	if n := scalar[int](t, admin, `SELECT count(*)::int FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`); n != 0 {
		t.Errorf("%d sessions idle in a transaction", n)
	}
}

// sessionStates reads the state in pg_stat_activity of each of pids that still runs, with what
// it waits for unless that is its client ("active, waiting on Lock"; an idle session waits on
// ClientRead).
func sessionStates(t *testing.T, q *pgx.Conn, pids []int) map[int]string {
	t.Helper()
	rows, err := q.Query(context.Background(), `SELECT pid, coalesce(state, '') || coalesce(', waiting on ' ||
		NULLIF(wait_event_type, 'Client'), '') FROM pg_stat_activity WHERE pid = ANY($1)`, pids)
	if err != nil {
		t.Fatal(err)
	}
	states := map[int]string{}
	var pid int
	var state string
	if _, err := pgx.ForEachRow(rows, []any{&pid, &state}, func() error { states[pid] = state; return nil }); err != nil {
		t.Fatal(err)
	}
	return states
}

// TestConnectionCutDuringCommit: the connection is cut while COMMIT runs (the fault: a deferred
// trigger holds the first COMMIT 30 s, counting its firings in a sequence; the test stops the
// proxy while the session sleeps in it), so the service cannot know the outcome. It settles it
// (the server ended that transaction: the test checks that the held session is gone and that
// the held COMMIT never completed), finds no coupon, retries and issues: one coupon, answered
// ISSUED with its id after two attempts, and no session left behind.
func TestConnectionCutDuringCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	proxy, proxied := startProxy(t, dbURL)
	pool := prodPool(t, proxied, 2)
	svc := faultService(t, pool, issuance.Config{}, "CUT")
	admin := connect(t, dbURL)
	if _, err := admin.Exec(ctx, `
CREATE SEQUENCE commit_fault;
CREATE FUNCTION slow_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF nextval('commit_fault') = 1 THEN PERFORM pg_sleep(30); END IF; RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_first_commit AFTER INSERT ON issued_coupons
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_first_commit()`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		out issuance.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := svc.Issue(ctx, "cut", "CUT")
		done <- result{out, err}
	}()
	var held int
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		held = scalar[int](t, admin, `SELECT coalesce((SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'PgSleep'), 0)`)
		if held == 0 {
			return fmt.Errorf("no session sleeps in the COMMIT (the trigger fired %d times)", firings(t, admin, "commit_fault"))
		}
		return nil
	})
	proxy.Stop() // cuts every connection through it, the one waiting for COMMIT's answer included
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	r := waitDone(t, done, "Issue after its connection was cut")
	if n := firings(t, admin, "commit_fault"); n != 2 {
		t.Errorf("the COMMIT trigger fired %d times, want 2: the held COMMIT, then the retry's", n)
	}
	if n := scalar[int](t, admin, `SELECT count(*)::int FROM pg_stat_activity WHERE pid = $1`, held); n != 0 {
		t.Errorf("the session held in its COMMIT (backend %d) still runs", held)
	}
	if r.err != nil || r.out.Result != issuance.ResultIssued || r.out.Attempts < 2 {
		t.Fatalf("connection cut during COMMIT: %+v %v, want ISSUED after a retry", r.out, r.err)
	}
	if id := scalar[string](t, admin, `SELECT coupon_id::text FROM issued_coupons`); id != r.out.CouponID {
		t.Errorf("answered %s, the coupon is %s", r.out.CouponID, id)
	}
	if n := scalar[int](t, admin, `SELECT count(*)::int FROM pg_stat_activity
		WHERE datname = current_database() AND (wait_event = 'PgSleep' OR state LIKE 'idle in transaction%')`); n != 0 {
		t.Errorf("%d sessions still sleeping or idle in a transaction", n)
	}
	assertRules(t, admin)
}

// dropSyncToxic is a partition after the request left: on each link it passes the client's
// bytes until the first pipeline ending in Sync, forwards that pipeline without its Sync, and
// drops everything after it. The server runs the call and then waits, in the call's
// transaction, for a Sync (its COMMIT) that never comes. It counts the Syncs it held back: the
// fault's own evidence.
type dropSyncToxic struct {
	dropped atomic.Int64
}

// pgSync is the frontend Sync message (PostgreSQL 15 docs, 55.7 "Message Formats").
var pgSync = []byte{'S', 0, 0, 0, 4}

func (d *dropSyncToxic) Pipe(stub *toxics.ToxicStub) {
	dropping := false
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			switch {
			case c == nil:
				stub.Close()
				return
			case dropping:
			case bytes.HasSuffix(c.Data, pgSync):
				dropping = true
				d.dropped.Add(1)
				c.Data = c.Data[:len(c.Data)-len(pgSync)]
				stub.Output <- c
			default:
				stub.Output <- c
			}
		}
	}
}

func init() { toxics.Register("drop_sync", new(dropSyncToxic)) }

// TestCommitNeverArrives: the network drops the end of the call, its Sync (which commits it),
// and keeps dropping (the test's toxic strips the Sync from the pipeline and holds the link; it
// is lifted once the session is seen waiting in the call's transaction, holding its rows). The
// service cannot know whether the call committed: it settles it, and its answer agrees with the
// table (ISSUED with the coupon that exists, or RETRY_EXHAUSTED and none), with no session left
// in a transaction to block the next request. (Termination of a session that stays open,
// as in a real partition, is proved by TestResolveTerminatesTheSession.)
func TestCommitNeverArrives(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	proxy, proxied := startProxy(t, dbURL)
	pool := prodPool(t, proxied, 1)
	svc := faultService(t, pool, issuance.Config{Budget: time.Second, LockTimeout: 300 * time.Millisecond,
		StatementTimeout: 600 * time.Millisecond}, "DROP")
	admin := connect(t, dbURL)
	// The pooled connection's first attempt reads its session (its own Sync): done here, before
	// the fault, by a request of another member.
	if out, err := svc.Issue(ctx, "warm", "DROP"); err != nil || out.Result != issuance.ResultIssued {
		t.Fatalf("warm-up: %+v %v", out, err)
	}
	wrapper, err := proxy.Toxics.AddToxicJson(strings.NewReader(
		`{"name": "drop-sync", "type": "drop_sync", "stream": "upstream"}`))
	if err != nil {
		t.Fatal(err)
	}
	dropSync := proxy.Toxics.GetToxic(wrapper.Name).Toxic.(*dropSyncToxic)
	type result struct {
		out issuance.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := svc.Issue(ctx, "drop", "DROP")
		done <- result{out, err}
	}()
	// Without its Sync the session has run the call and waits for the next message, still
	// "active" (the state turns idle only at a Sync), holding the call's transaction and rows.
	waiting := `SELECT count(*)::int FROM pg_stat_activity WHERE datname = current_database()
		AND backend_xid IS NOT NULL AND wait_event = 'ClientRead'`
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if scalar[int](t, admin, waiting) == 0 {
			return fmt.Errorf("no session waits in the call's transaction: the Sync was not held back (%d held)", dropSync.dropped.Load())
		}
		return nil
	})
	if got := dropSync.dropped.Load(); got != 1 {
		t.Fatalf("the toxic held back %d Syncs, want 1", got)
	}
	if err := proxy.Toxics.RemoveToxic(ctx, "drop-sync"); err != nil {
		t.Fatal(err)
	}
	r := waitDone(t, done, "Issue after its Sync was dropped")
	coupon := scalar[string](t, admin, `SELECT coalesce((SELECT coupon_id::text FROM issued_coupons WHERE member_id = 'drop'), '')`)
	switch {
	case r.err != nil:
		t.Fatalf("COMMIT dropped: %v, want an answer", r.err)
	case r.out.Result == issuance.ResultIssued && r.out.CouponID == coupon:
	case r.out.Result == issuance.ResultRetryExhausted && coupon == "":
	default:
		t.Fatalf("COMMIT dropped: %+v, but the table holds coupon %q", r.out, coupon)
	}
	if n := scalar[int](t, admin, `SELECT count(*)::int FROM pg_stat_activity WHERE datname = current_database()
		AND (state LIKE 'idle in transaction%' OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()`); n != 0 {
		t.Errorf("%d sessions left in a transaction, holding the campaign row", n)
	}
	if out, err := svc.Issue(ctx, "drop", "DROP"); err != nil || (out.Result != issuance.ResultIssued && out.Result != issuance.ResultAlreadyIssued) {
		t.Errorf("re-send: %+v %v, want ISSUED or ALREADY_ISSUED", out, err)
	}
	assertRules(t, admin)
}

// TestStalledDatabaseAnswersAgreeWithTheTables: under load from 32 clients, every process of
// the database is stopped (SIGSTOP) for 3 s, as a database that hangs, then resumed. Requests are
// in every phase when it stops: waiting for a connection, in their call, committing, settling a
// lost answer. Every call ends with an answer, each answer agrees with the tables, and the rules
// hold. (That every answer also comes inside the gateway's 3 s is the drill's and the audit's to
// check, timed by their caller: docs/api.md, "The 3 s bound".)
func TestStalledDatabaseAnswersAgreeWithTheTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := localpg.Start(ctx, localpg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Resume(); srv.Stop() })
	if _, err := schema.MigrateURL(ctx, srv.URL()); err != nil {
		t.Fatal(err)
	}
	pool := prodPool(t, srv.URL(), 16)
	svc := faultService(t, pool, issuance.Config{}, "STALL")

	type answer struct {
		member string
		out    issuance.Outcome
		err    error
		took   time.Duration
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
		next    atomic.Int64
	)
	stop := make(chan struct{})
	for range 32 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				member := fmt.Sprintf("s%05d", next.Add(1))
				start := time.Now()
				out, err := svc.Issue(ctx, member, "STALL")
				mu.Lock()
				answers = append(answers, answer{member, out, err, time.Since(start)})
				mu.Unlock()
			}
		})
	}
	// The traffic runs (every client has had an answer's worth of time) before the stall.
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(answers) < 64 {
			return fmt.Errorf("%d answers before the stall, want 64", len(answers))
		}
		return nil
	})
	if n, err := srv.Pause(); err != nil || n < 2 {
		t.Fatalf("stopped %d processes of the server (%v), want the postmaster and its children", n, err)
	}
	time.Sleep(3 * time.Second) // the fault's length: a database that hangs for 3 s
	srv.Resume()
	time.Sleep(time.Second) // and traffic once it is back
	close(stop)
	wg.Wait()

	issued := map[string]string{}
	stalled, unknown, longest := 0, 0, time.Duration(0)
	for _, a := range answers {
		longest = max(longest, a.took)
		switch {
		case errors.Is(a.err, issuance.ErrOutcomeUnknown):
			unknown++
			if a.out.Attempts < 1 {
				t.Errorf("%s: outcome unknown after %d attempts, want the attempt that ran counted", a.member, a.out.Attempts)
			}
		case a.err != nil:
			t.Errorf("%s: %v", a.member, a.err)
		case a.out.Result == issuance.ResultIssued:
			issued[a.member] = a.out.CouponID
		case a.out.Result == issuance.ResultRetryExhausted:
			stalled++
		default:
			t.Errorf("%s: %+v, want ISSUED or RETRY_EXHAUSTED", a.member, a.out)
		}
	}
	t.Logf("%d answers, %d ISSUED, %d RETRY_EXHAUSTED, %d outcome unknown; the longest took %s",
		len(answers), len(issued), stalled, unknown, longest)
	if stalled+unknown == 0 {
		t.Fatal("no request met the stall: nothing answered RETRY_EXHAUSTED or outcome unknown")
	}
	rows, err := pool.Query(ctx, `SELECT member_id, coupon_id::text FROM issued_coupons WHERE campaign_id = 'STALL'`)
	if err != nil {
		t.Fatal(err)
	}
	inDB, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Member, ID string }])
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, c := range inDB {
		found[c.Member] = c.ID
	}
	for member, id := range issued {
		if found[member] != id {
			t.Errorf("%s: answered ISSUED with %s, the table holds %q", member, id, found[member])
		}
	}
	if extra := len(found) - len(issued); extra > unknown {
		t.Errorf("%d coupons exist that no ISSUED answer named, more than the %d outcomes unknown", extra, unknown)
	}
	assertRules(t, pool)
}
