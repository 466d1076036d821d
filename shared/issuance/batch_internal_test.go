package issuance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/db"
)

// queued is how many requests of campaign wait in s's coalescer.
func queued(s *Service, campaignID string) int {
	s.co.mu.Lock()
	defer s.co.mu.Unlock()
	if q := s.co.queues[campaignID]; q != nil {
		return len(q.waiting)
	}
	return 0
}

// batchFixture is a database with campaign B (1,000 yen coupons), an owner's connection for the
// faults and the counts, and a coalescing service on pool.
type batchFixture struct {
	url   string
	admin *pgx.Conn
	svc   *Service
	run   func([]*joined) // in place of svc's run when set: a broken variant's
}

func newBatchFixture(t *testing.T, dbURL, poolURL string, cfg Config) *batchFixture {
	t.Helper()
	ctx := context.Background()
	pool, closePool, err := db.Open(ctx, db.Config{DatabaseURL: poolURL, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closePool)
	f := &batchFixture{url: dbURL}
	if f.admin, err = pgx.Connect(ctx, dbURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.admin.Close(ctx) })
	if err := campaign.Create(ctx, f.admin, campaign.Campaign{ID: "B", DiscountYen: 1000, BudgetYen: 10_000_000, Stripes: 2}); err != nil {
		t.Fatal(err)
	}
	if f.svc, err = New(pool, cfg); err != nil {
		t.Fatal(err)
	}
	return f
}

// formBatch holds B's stripes with a session of its own, sends "first" (alone: it waits on a
// stripe), then each of members, which queue behind it in the coalescer; once they all wait it
// releases the hold, so that they go as one batch, and returns their answers' channels, in
// members' order, after first's.
func (f *batchFixture) formBatch(t *testing.T, members ...string) (first <-chan answered, rest []<-chan answered) {
	t.Helper()
	return f.formBatchBehind(t, "first", members...)
}

// formBatchBehind is formBatch with leader, a member without B's coupon, in place of "first".
func (f *batchFixture) formBatchBehind(t *testing.T, leader string, members ...string) (first <-chan answered, rest []<-chan answered) {
	t.Helper()
	ctx := context.Background()
	hold := pgtest.HoldCampaign(t, f.url, "B")
	send := func(m string) <-chan answered {
		c := make(chan answered, 1)
		if f.run != nil {
			j := newJoined(t, f.svc, "B", m)
			go func() { c <- f.svc.co.do(j, f.run) }()
			return c
		}
		go func() {
			out, err := f.svc.Issue(ctx, m, "B")
			c <- answered{out, err}
		}()
		return c
	}
	first = send(leader)
	hold.WaitBlocked(1)
	for _, m := range members {
		rest = append(rest, send(m))
	}
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if n := queued(f.svc, "B"); n != len(members) {
			return fmt.Errorf("%d requests queued behind the call in flight, want %d", n, len(members))
		}
		return nil
	})
	hold.Release()
	return first, rest
}

func (f *batchFixture) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.admin.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (f *batchFixture) rulesHold(t *testing.T) {
	t.Helper()
	rep, err := reconcile.Check(context.Background(), f.admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations() {
		t.Error(v)
	}
}

func await(t *testing.T, c <-chan answered, what string) answered {
	t.Helper()
	select {
	case a := <-c:
		return a
	case <-time.After(pgtest.PollTimeout):
		t.Fatalf("%s: no answer", what)
		return answered{}
	}
}

// proxied puts a toxiproxy in front of dbURL's server and returns it and a URL through it.
func proxied(t *testing.T, dbURL string) (*toxiproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), "pg", "127.0.0.1:0", u.Host)
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Stop)
	u.Host = proxy.Listen
	return proxy, u.String()
}

var batchMembers = []string{"b1", "b2", "b3", "b4"}

// TestBatchConnectionCut: the connection of a batch of four is cut while its COMMIT runs (a
// deferred trigger of the test sleeps in the first COMMIT of b1's coupon, counting its firings;
// the test stops the proxy meanwhile). The service settles each member on one connection of its
// own: the cut transaction never committed, so none holds a coupon, and the batch goes again with
// the same coupon ids: four coupons, each answered ISSUED with its own id after two attempts.
func TestBatchConnectionCut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	proxy, through := proxied(t, dbURL)
	f := newBatchFixture(t, dbURL, through, Config{})
	if _, err := f.admin.Exec(ctx, `
CREATE SEQUENCE commit_fault;
CREATE FUNCTION slow_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF nextval('commit_fault') = 1 THEN PERFORM pg_sleep(30); END IF; RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_first_commit AFTER INSERT ON issued_coupons
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.member_id = 'b1') EXECUTE FUNCTION slow_first_commit()`); err != nil {
		t.Fatal(err)
	}
	first, rest := f.formBatch(t, batchMembers...)
	if a := await(t, first, "first"); a.err != nil || a.out.Result != ResultIssued {
		t.Fatalf("the call before the batch: %+v %v", a.out, a.err)
	}
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if n := f.count(t, `SELECT count(*)::int FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'`); n != 1 {
			return fmt.Errorf("%d sessions sleep in a COMMIT, want the batch's", n)
		}
		return nil
	})
	proxy.Stop()
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	for i, c := range rest {
		a := await(t, c, batchMembers[i])
		if a.err != nil || a.out.Result != ResultIssued || a.out.Attempts < 2 {
			t.Errorf("%s: %+v %v, want ISSUED after a retry", batchMembers[i], a.out, a.err)
			continue
		}
		if id := f.count(t, `SELECT count(*)::int FROM issued_coupons WHERE member_id = $1 AND coupon_id = $2`, batchMembers[i], a.out.CouponID); id != 1 {
			t.Errorf("%s answered %s, which is not its coupon", batchMembers[i], a.out.CouponID)
		}
	}
	if n := f.count(t, `SELECT last_value::int FROM commit_fault`); n != 2 {
		t.Errorf("the COMMIT trigger fired %d times, want 2: the held COMMIT, then the retry's", n)
	}
	if n := f.count(t, `SELECT count(*)::int FROM issued_coupons`); n != 5 {
		t.Errorf("%d coupons, want 5", n)
	}
	f.rulesHold(t)
}

// TestBatchStatementTimeout: a batch whose call runs into its statement_timeout on every call
// (the fault: a trigger sleeps 5 s in b1's coupon insert, counting its firings) is rolled back
// and sent again while its members' time lasts; then each member is answered RETRY_EXHAUSTED,
// its attempts as many as the calls the trigger counted, at least 2 (the budget, 3 s, fits
// several 300 ms calls), and nothing of theirs was written. (TestRetryBranches makes a 57014 that
// leaves time for a retry.) The broken variant is a lone request's policy before issue 29, which
// gave up on 57014 at once (splitRun, for the group): the test must tell it from a retry.
func TestBatchStatementTimeout(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			t.Parallel()
			wrong := batchStatementTimeout(t, broken)
			if broken {
				if len(wrong) == 0 {
					t.Fatal("the broken variant passed: the test would not tell a retry from giving up")
				}
				t.Logf("the broken variant: %v", wrong)
				return
			}
			for _, w := range wrong {
				t.Error(w)
			}
		})
	}
}

// batchStatementTimeout runs TestBatchStatementTimeout's checks, its group run by splitRun's
// 57014 policy when broken, and returns what they found wrong.
func batchStatementTimeout(t *testing.T, broken bool) (wrong []string) {
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	f := newBatchFixture(t, dbURL, dbURL, Config{Budget: 3 * time.Second, StatementTimeout: 300 * time.Millisecond, LockTimeout: 200 * time.Millisecond})
	if broken {
		f.run = splitRun(f.svc, pgerrcode.QueryCanceled, false)
	}
	if _, err := f.admin.Exec(ctx, `
CREATE SEQUENCE slow_inserts;
CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM nextval('slow_inserts'); PERFORM pg_sleep(5); RETURN NEW; END $$;
CREATE TRIGGER slow_insert BEFORE INSERT ON issued_coupons FOR EACH ROW WHEN (NEW.member_id = 'b1') EXECUTE FUNCTION slow_insert()`); err != nil {
		t.Fatal(err)
	}
	first, rest := f.formBatch(t, batchMembers...)
	await(t, first, "first")
	attempts := map[int]bool{}
	for i, c := range rest {
		a := await(t, c, batchMembers[i])
		if a.err != nil || a.out.Result != ResultRetryExhausted {
			wrong = append(wrong, fmt.Sprintf("%s: %+v %v, want RETRY_EXHAUSTED", batchMembers[i], a.out, a.err))
		}
		attempts[a.out.Attempts] = true
	}
	n := f.count(t, `SELECT last_value::int FROM slow_inserts`)
	if n < 1 {
		t.Fatal("the slow insert never ran: the fault did not fire")
	}
	t.Logf("the group was sent %d times", n)
	if n < 2 {
		wrong = append(wrong, fmt.Sprintf("the group was sent %d time(s): want it sent again after its 57014, its time fitting more calls", n))
	}
	if len(attempts) != 1 || !attempts[n] {
		wrong = append(wrong, fmt.Sprintf("the members' attempts %v, the slow insert ran %d times: want every member tried once per call, as often as the group was sent", attempts, n))
	}
	if n := f.count(t, `SELECT count(*)::int FROM issued_coupons WHERE member_id LIKE 'b%'`); n != 0 {
		wrong = append(wrong, fmt.Sprintf("%d coupons of the timed-out batch's members", n))
	}
	f.rulesHold(t)
	return wrong
}

// TestBatchAnswerLost: a batch's COMMIT completes but its answer never reaches the service (a
// deferred trigger holds b1's COMMIT on an advisory lock the test holds; once it waits there the
// test blackholes the server-to-client stream, lets the COMMIT go, and lifts the blackhole once
// the coupons are committed and their answer's ReadyForQuery dropped). Each member is settled:
// ISSUED with the coupon that exists, never RETRY_EXHAUSTED.
func TestBatchAnswerLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	proxy, through := proxied(t, dbURL)
	f := newBatchFixture(t, dbURL, through, Config{})
	if _, err := f.admin.Exec(ctx, `
CREATE SEQUENCE held_commits;
CREATE FUNCTION held_commit() RETURNS trigger LANGUAGE plpgsql SET lock_timeout = 0 AS $$
BEGIN PERFORM nextval('held_commits'); PERFORM pg_advisory_xact_lock(4243); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER held_commit AFTER INSERT ON issued_coupons
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.member_id = 'b1') EXECUTE FUNCTION held_commit();
SELECT pg_advisory_lock(4243)`); err != nil {
		t.Fatal(err)
	}
	first, rest := f.formBatch(t, batchMembers...)
	await(t, first, "first")
	pgtest.WaitBlockedBy(t, f.admin, int(f.admin.PgConn().PID()), 1)
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name": "lost", "type": "batch_blackhole", "stream": "downstream"}`)); err != nil {
		t.Fatal(err)
	}
	blackhole := proxy.Toxics.GetToxic("lost").Toxic.(*countingBlackhole)
	if _, err := f.admin.Exec(ctx, `SELECT pg_advisory_unlock(4243)`); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if n := f.count(t, `SELECT count(*)::int FROM issued_coupons WHERE member_id LIKE 'b%'`); n != 4 || blackhole.ready.Load() == 0 {
			return fmt.Errorf("%d coupons of the batch committed, %d ReadyForQuery dropped", n, blackhole.ready.Load())
		}
		return nil
	})
	if err := proxy.Toxics.RemoveToxic(ctx, "lost"); err != nil {
		t.Fatal(err)
	}
	for i, c := range rest {
		a := await(t, c, batchMembers[i])
		if a.err != nil || a.out.Result != ResultIssued {
			t.Errorf("%s: %+v %v, want ISSUED", batchMembers[i], a.out, a.err)
			continue
		}
		if n := f.count(t, `SELECT count(*)::int FROM issued_coupons WHERE member_id = $1 AND coupon_id = $2`, batchMembers[i], a.out.CouponID); n != 1 {
			t.Errorf("%s answered %s, which is not its coupon", batchMembers[i], a.out.CouponID)
		}
	}
	if n := f.count(t, `SELECT last_value::int FROM held_commits`); n != 1 {
		t.Errorf("the COMMIT was held %d times, want once", n)
	}
	f.rulesHold(t)
}

// TestCoalescedCallersLeave: requests queued behind a call in flight whose callers give up
// return context.Canceled, leave the queue and write nothing; the call in flight is answered.
func TestCoalescedCallersLeave(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	f := newBatchFixture(t, dbURL, dbURL, Config{})
	hold := pgtest.HoldCampaign(t, dbURL, "B")
	first := make(chan answered, 1)
	go func() {
		out, err := f.svc.Issue(ctx, "first", "B")
		first <- answered{out, err}
	}()
	hold.WaitBlocked(1)
	callCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { _, errs[i] = f.svc.Issue(callCtx, fmt.Sprintf("q%d", i), "B") })
	}
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if n := queued(f.svc, "B"); n != len(errs) {
			return fmt.Errorf("%d queued, want %d", n, len(errs))
		}
		return nil
	})
	cancel()
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("caller %d: %v, want context.Canceled", i, err)
		}
	}
	if n := queued(f.svc, "B"); n != 0 {
		t.Errorf("%d requests still queued after their callers left", n)
	}
	hold.Release()
	if a := await(t, first, "first"); a.err != nil || a.out.Result != ResultIssued {
		t.Errorf("the call in flight: %+v %v, want ISSUED", a.out, a.err)
	}
	if n := f.count(t, `SELECT count(*)::int FROM issued_coupons WHERE member_id LIKE 'q%'`); n != 0 {
		t.Errorf("%d coupons of callers who left", n)
	}
}

// TestBatchTimeoutsFollowTheTightestMember: a batch's statement_timeout, as sent, never exceeds
// the time its tightest member has left (a member that waited behind a slow call has less than
// one that just came). The check is first shown to catch the broken variant, timeouts taken from
// the member that came last.
func TestBatchTimeoutsFollowTheTightestMember(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	sent := &timeoutsSeen{}
	cfg.ConnConfig.Tracer = sent
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "B", DiscountYen: 1000, BudgetYen: 10_000_000}); err != nil {
		t.Fatal(err)
	}
	s, err := New(pool, Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var group []*joined
	for i, left := range []time.Duration{1800 * time.Millisecond, 600 * time.Millisecond, 1200 * time.Millisecond} {
		r := request{memberID: fmt.Sprintf("t%d", i), campaignID: "B"}
		_, span := startIssue(ctx, r)
		group = append(group, &joined{ctx: ctx, req: r, couponID: fmt.Sprintf("00000000-0000-4000-8000-00000000000%d", i),
			deadline: now.Add(left), callEnd: now.Add(left + db.CancelGrace + ResolveTimeout), span: span,
			answer: make(chan answered, 1), lead: make(chan []*joined, 1)})
	}
	s.run(group)
	for _, j := range group {
		if a := <-j.answer; a.err != nil || a.out.Result != ResultIssued {
			t.Fatalf("%s: %+v %v", j.req.memberID, a.out, a.err)
		}
	}
	tooLong := func(statement time.Duration, at time.Time) bool {
		return statement > group[1].deadline.Sub(at) // t1, 600 ms: the tightest
	}
	if len(sent.statement) != 1 || tooLong(sent.statement[0], sent.at[0]) {
		t.Errorf("statement_timeout sent %v, want one call within the tightest member's %s", sent.statement, group[1].deadline.Sub(now))
	}
	// The broken variant: timeouts from the member that came last.
	_, broken := s.cfg.attemptTimeouts(time.Until(group[len(group)-1].deadline))
	if !tooLong(broken, time.Now()) {
		t.Error("the check passed the broken variant's timeout: it would not see a batch ignoring a member's deadline")
	}
}

// timeoutsSeen records the statement_timeout of every sqlTimeoutsSet the pool pipelines, and
// when its pipeline was sent.
type timeoutsSeen struct {
	mu        sync.Mutex
	started   time.Time
	statement []time.Duration
	at        []time.Time
}

func (s *timeoutsSeen) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (s *timeoutsSeen) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *timeoutsSeen) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.mu.Lock()
	s.started = time.Now()
	s.mu.Unlock()
	return ctx
}

func (s *timeoutsSeen) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if d.SQL != sqlTimeoutsSet || len(d.Args) != 2 {
		return
	}
	if statement, err := time.ParseDuration(fmt.Sprint(d.Args[1])); err == nil {
		s.mu.Lock()
		s.statement, s.at = append(s.statement, statement), append(s.at, s.started)
		s.mu.Unlock()
	}
}

func (s *timeoutsSeen) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// countingBlackhole drops every byte of its stream and counts the ReadyForQuery messages among
// them: the ends of the server's answers (PostgreSQL 15 docs, 55.7 "Message Formats").
type countingBlackhole struct {
	ready atomic.Int64
}

func (b *countingBlackhole) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			b.ready.Add(int64(bytes.Count(c.Data, []byte{'Z', 0, 0, 0, 5})))
		}
	}
}

func init() { toxics.Register("batch_blackhole", new(countingBlackhole)) }
