package issuance

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// inFlight reports whether campaign has a call in flight in s's coalescer.
func inFlight(s *Service, campaignID string) bool {
	s.co.mu.Lock()
	defer s.co.mu.Unlock()
	_, busy := s.co.queues[campaignID]
	return busy
}

// onePool is a database with campaign S (1,000 yen coupons), its owner's connection, and a
// coalescing service on a pool of one connection, built with tracer.
func onePool(t *testing.T, tracer pgx.QueryTracer) (*Service, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	owner, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close(ctx) })
	if err := campaign.Create(ctx, owner, campaign.Campaign{ID: "S", DiscountYen: 1000, BudgetYen: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	s, err := New(pool, Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s, owner
}

func countOf(t *testing.T, q *pgx.Conn, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := q.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// stalledKey marks the context of the request whose group the broken variant runs without its
// deadline.
type stalledKey struct{}

// TestStalledGroupOfOneAnswersInItsBound: the pool's one connection is held (as by a call stalled
// on the database), request a of campaign S is in flight waiting for it, and b, a second later,
// queues behind a. When a's time is up, b leads a group of one and waits for the connection in turn. It answers
// RETRY_EXHAUSTED by its call's end, while the connection is still held; only after that is the
// connection let go, and no coupon of b is ever committed. The broken variant, the group of one
// run without its deadline (the incident of issue 29: context.WithoutCancel), waits until the
// connection is let go, past its bound, and commits a coupon that its late answer reports to a
// gateway that gave up.
func TestStalledGroupOfOneAnswersInItsBound(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, owner := onePool(t, nil)
			if broken {
				s.withDeadline = func(ctx context.Context, d time.Time) (context.Context, context.CancelFunc) {
					if ctx.Value(stalledKey{}) != nil {
						return context.WithoutCancel(ctx), func() {}
					}
					return context.WithDeadline(ctx, d)
				}
			}
			held, err := s.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			aStart := time.Now()
			aDone := make(chan answered, 1)
			go func() {
				out, err := s.Issue(ctx, "a", "S")
				aDone <- answered{out, err}
			}()
			pgtest.Eventually(t, pgtest.PollTimeout, func() error {
				if !inFlight(s, "S") {
					return errors.New("a is not in flight yet")
				}
				return nil
			})
			// b comes a second after a, so that it still has a second when a's time is up and
			// hands S on: it leads a group of one, not a request answered at the hand-off.
			time.Sleep(time.Until(aStart.Add(time.Second)))
			bStart := time.Now()
			bound := bStart.Add(s.cfg.Budget) // b's call ends no earlier than this
			bDone := make(chan answered, 1)
			go func() {
				out, err := s.Issue(context.WithValue(ctx, stalledKey{}, true), "b", "S")
				bDone <- answered{out, err}
			}()
			pgtest.Eventually(t, pgtest.PollTimeout, func() error {
				if n := queued(s, "S"); n != 1 {
					return fmt.Errorf("%d requests queued behind a, want b", n)
				}
				return nil
			})
			if a := await(t, aDone, "a"); a.err != nil || a.out.Result != ResultRetryExhausted {
				t.Fatalf("a, the connection held throughout: %+v %v, want RETRY_EXHAUSTED", a.out, a.err)
			}
			var b answered
			var answeredAt time.Time
			select {
			case b = <-bDone:
				answeredAt = time.Now()
			case <-time.After(time.Until(bound) + time.Second):
			}
			held.Release() // the database is back
			if answeredAt.IsZero() {
				b = await(t, bDone, "b")
				answeredAt = time.Now()
			}
			// The one connection serves c after whatever b sent: b's coupon, if any, is committed.
			if c, err := s.Issue(ctx, "c", "S"); err != nil || c.Result != ResultIssued {
				t.Fatalf("c, after the database is back: %+v %v, want ISSUED", c, err)
			}
			var wrong []string
			if b.err != nil || b.out.Result != ResultRetryExhausted {
				wrong = append(wrong, fmt.Sprintf("b answered %+v %v, want RETRY_EXHAUSTED", b.out, b.err))
			}
			if answeredAt.After(bound) {
				wrong = append(wrong, fmt.Sprintf("b answered %s after its call's end", answeredAt.Sub(bound)))
			}
			if n := countOf(t, owner, `SELECT count(*)::int FROM issued_coupons WHERE member_id = 'b'`); n != 0 {
				wrong = append(wrong, fmt.Sprintf("%d coupons of b committed after its answer", n))
			}
			if broken {
				if len(wrong) == 0 {
					t.Fatal("the broken variant passed: the test would not see a group of one without its deadline")
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

// panicking is a pool's tracer that panics as a call's pipeline starts while armed: a bug in
// the group's run.
type panicking struct{ armed atomic.Bool }

func (p *panicking) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (p *panicking) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (p *panicking) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	if p.armed.Load() {
		panic("a bug in the call")
	}
	return ctx
}
func (p *panicking) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (p *panicking) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// brokenLead is lead before issue 29: the hand-off after the run, not deferred, and the run
// without its panic answer.
func brokenLead(s *Service, j *joined, group []*joined) (Outcome, error) {
	s.calls(group)
	s.co.handOff(j.req.campaignID, 0)
	a := <-j.answer
	return a.out, a.err
}

// newJoined is a request of member for campaignID with s's budget, as Issue makes it.
func newJoined(t *testing.T, s *Service, campaignID, member string) *joined {
	now := time.Now()
	r := request{memberID: member, campaignID: campaignID}
	callEnd := now.Add(s.cfg.Budget)
	deadline := attemptsEnd(callEnd)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	t.Cleanup(cancel)
	ctx, span := startIssue(ctx, r)
	return &joined{ctx: ctx, req: r, couponID: uuid.NewString(),
		deadline: deadline, callEnd: callEnd, span: span, answer: make(chan answered, 1), lead: make(chan []*joined, 1)}
}

// TestPanicInAGroupFreesTheCampaign: a group of three of campaign S runs while its call panics
// (the pool's tracer panics as the pipeline starts), and a fourth request waits behind it. Each
// member of the group is answered an error wrapping errPanicked (500), the campaign is handed on
// to the fourth, which is served (ISSUED, its coupon counted), and nothing of the group is
// written. The broken variant, the hand-off not deferred and no answer on a panic, leaves the
// other members unanswered and the campaign in flight for good, the fourth never handed it.
func TestPanicInAGroupFreesTheCampaign(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			t.Parallel()
			tracer := &panicking{}
			s, owner := onePool(t, tracer)
			group := []*joined{newJoined(t, s, "S", "p1"), newJoined(t, s, "S", "p2"), newJoined(t, s, "S", "p3")}
			next := newJoined(t, s, "S", "n1")
			if !s.co.join(group[0]) || s.co.join(next) {
				t.Fatal("the coalescer did not make p1 the leader and queue n1")
			}
			tracer.armed.Store(true)
			var out Outcome
			var err error
			var panicked any
			func() {
				defer func() { panicked = recover() }()
				if broken {
					out, err = brokenLead(s, group[0], group)
				} else {
					a := s.co.lead(group[0], group, s.run)
					out, err = a.out, a.err
				}
			}()
			tracer.armed.Store(false)
			var wrong []string
			if panicked != nil {
				wrong = append(wrong, fmt.Sprintf("the leader panicked: %v", panicked))
			} else if !errors.Is(err, errPanicked) || out.Result != "" {
				wrong = append(wrong, fmt.Sprintf("p1: %+v %v, want an error wrapping errPanicked", out, err))
			}
			for _, j := range group[1:] {
				select {
				case a := <-j.answer:
					if !errors.Is(a.err, errPanicked) {
						wrong = append(wrong, fmt.Sprintf("%s: %+v %v, want an error wrapping errPanicked", j.req.memberID, a.out, a.err))
					}
				default: // lead has returned: every answer it gives is sent by now
					wrong = append(wrong, fmt.Sprintf("%s: no answer", j.req.memberID))
				}
			}
			select {
			case g := <-next.lead:
				if a := s.co.lead(next, g, s.run); a.err != nil || a.out.Result != ResultIssued {
					wrong = append(wrong, fmt.Sprintf("n1, handed the campaign: %+v %v, want ISSUED", a.out, a.err))
				}
				if n := countOf(t, owner, `SELECT count(*)::int FROM issued_coupons WHERE member_id = 'n1'`); n != 1 {
					wrong = append(wrong, fmt.Sprintf("n1 has %d coupons, want 1", n))
				}
			default:
				wrong = append(wrong, fmt.Sprintf("the campaign was not handed on (in flight: %v)", inFlight(s, "S")))
			}
			if n := countOf(t, owner, `SELECT count(*)::int FROM issued_coupons WHERE member_id LIKE 'p%'`); n != 0 {
				wrong = append(wrong, fmt.Sprintf("%d coupons of the group that panicked", n))
			}
			if broken {
				if len(wrong) == 0 {
					t.Fatal("the broken variant passed: the test would not see a campaign left in flight")
				}
				t.Logf("the broken variant: %v", wrong)
				return
			}
			for _, w := range wrong {
				t.Error(w)
			}
			if inFlight(s, "S") {
				t.Error("S is still in flight after every request was answered")
			}
		})
	}
}

// TestRetryBranches: each failure a call can meet is made to happen on a real PostgreSQL, by a
// trigger on the coupon insert of one member that counts its firings in a sequence (which no
// rollback undoes) and raises the SQLSTATE (57014: sleeps into the statement_timeout), and
// the test tells a retry from giving up by those firings, each answer's attempts and the
// coupons counted with SQL:
//
//   - the fault once, on a request alone (solo) and on one member of a coalesced group of four
//     (b1): every one is ISSUED after 2 attempts, the trigger fired twice, the coupons are there;
//   - the fault on every call, on one member of a group of four (a1): 40001, 40P01 and 55P03 are
//     given up after MaxAttempts (RETRY_EXHAUSTED, 5 firings), 0A000 after a second attempt (an
//     error, 2 firings), 57014 when the time no longer fits (RETRY_EXHAUSTED, at least 2 firings,
//     one per attempt); nothing of the group is written.
//
// The broken variant of each is the split policy before issue 29 (splitRun): for 57014 a request
// alone gave up at once while a batch retried it; for the others, a group that gives up on the
// code at once, the batch's branch no test ran then. The same checks must see it.
func TestRetryBranches(t *testing.T) {
	t.Parallel()
	raise := func(code string) string {
		return fmt.Sprintf("RAISE EXCEPTION USING ERRCODE = '%s', MESSAGE = 'fault'", code)
	}
	slow := Config{Budget: 3 * time.Second, StatementTimeout: time.Second, LockTimeout: 500 * time.Millisecond}
	for _, c := range []retryCase{
		{"40001", raise("40001"), Config{}, ResultRetryExhausted, MaxAttempts, false},
		{"40P01", raise("40P01"), Config{}, ResultRetryExhausted, MaxAttempts, false},
		{"55P03", raise("55P03"), Config{}, ResultRetryExhausted, MaxAttempts, false},
		{"0A000", raise("0A000"), Config{}, "", 2, false},
		{"57014", "PERFORM pg_sleep(5)", slow, ResultRetryExhausted, 0, true},
	} {
		for _, broken := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/broken=%v", c.code, broken), func(t *testing.T) {
				t.Parallel()
				wrong := retryBranches(t, c, broken)
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
}

// retryCase is one failure of TestRetryBranches.
type retryCase struct {
	code     string // its SQLSTATE
	fault    string // the statement the trigger runs
	cfg      Config
	result   Result // the answer when the fault fires on every call ("" : an error)
	attempts int    // and its attempts, 0: at least 2, one per firing
	alone    bool   // the broken variant gives up on code for a request alone, else for a group
}

// retryBranches runs TestRetryBranches' checks for c and returns what they found wrong. With
// broken, the requests run as splitRun(c.code, c.alone) runs them.
func retryBranches(t *testing.T, c retryCase, broken bool) (wrong []string) {
	fault, cfg, result, attempts, code, alone := c.fault, c.cfg, c.result, c.attempts, c.code, c.alone
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	f := newBatchFixture(t, dbURL, dbURL, cfg)
	if _, err := f.admin.Exec(ctx, fmt.Sprintf(`
CREATE SEQUENCE f_solo; CREATE SEQUENCE f_b1; CREATE SEQUENCE f_a1;
CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF nextval(TG_ARGV[0]) = 1 OR TG_ARGV[1]::boolean THEN %s; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER f_solo BEFORE INSERT ON issued_coupons FOR EACH ROW WHEN (NEW.member_id = 'solo') EXECUTE FUNCTION fault('f_solo', 'false');
CREATE TRIGGER f_b1 BEFORE INSERT ON issued_coupons FOR EACH ROW WHEN (NEW.member_id = 'b1') EXECUTE FUNCTION fault('f_b1', 'false');
CREATE TRIGGER f_a1 BEFORE INSERT ON issued_coupons FOR EACH ROW WHEN (NEW.member_id = 'a1') EXECUTE FUNCTION fault('f_a1', 'true')`, fault)); err != nil {
		t.Fatal(err)
	}
	firings := func(seq string) int { return f.count(t, fmt.Sprintf(`SELECT last_value::int FROM %s`, seq)) }

	cfg.BatchMax = 1
	solo, err := New(f.svc.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out Outcome
	if broken {
		f.run = splitRun(f.svc, code, alone)
		j := newJoined(t, solo, "B", "solo")
		splitRun(solo, code, alone)([]*joined{j})
		a := <-j.answer
		out, err = a.out, a.err
	} else {
		out, err = solo.Issue(ctx, "solo", "B")
	}
	if err != nil || out.Result != ResultIssued || out.Attempts != 2 {
		wrong = append(wrong, fmt.Sprintf("solo, the fault once: %+v %v, want ISSUED after 2 attempts", out, err))
	}
	if n := firings("f_solo"); n != 2 {
		wrong = append(wrong, fmt.Sprintf("solo: the fault fired %d times, want 2 (the retry)", n))
	}

	first, rest := f.formBatchBehind(t, "lead1", batchMembers...)
	await(t, first, "lead1")
	for i, ch := range rest {
		if a := await(t, ch, batchMembers[i]); a.err != nil || a.out.Result != ResultIssued || a.out.Attempts != 2 {
			wrong = append(wrong, fmt.Sprintf("%s, the fault once in its group: %+v %v, want ISSUED after 2 attempts", batchMembers[i], a.out, a.err))
		}
	}
	if n := firings("f_b1"); n != 2 {
		wrong = append(wrong, fmt.Sprintf("b1: the fault fired %d times, want 2 (the group's retry)", n))
	}
	if n := f.count(t, `SELECT count(*)::int FROM issued_coupons WHERE member_id IN ('solo', 'b1', 'b2', 'b3', 'b4')`); n != 5 {
		wrong = append(wrong, fmt.Sprintf("%d coupons of solo and b1-b4, want 5", n))
	}

	always := []string{"a1", "a2", "a3", "a4"}
	first, rest = f.formBatchBehind(t, "lead2", always...)
	await(t, first, "lead2")
	var tries []int
	for i, ch := range rest {
		a := await(t, ch, always[i])
		tries = append(tries, a.out.Attempts)
		if a.out.Result != result || (result == "") != (a.err != nil) {
			wrong = append(wrong, fmt.Sprintf("%s, the fault on every call: %+v %v, want %q", always[i], a.out, a.err, result))
		}
	}
	want := attempts
	if want == 0 {
		if want = tries[0]; want < 2 {
			wrong = append(wrong, fmt.Sprintf("the group was tried %d times, want a retry", want))
		}
	}
	for i, n := range tries {
		if n != want {
			wrong = append(wrong, fmt.Sprintf("%s: %d attempts, want %d", always[i], n, want))
		}
	}
	if n := firings("f_a1"); n != want {
		wrong = append(wrong, fmt.Sprintf("a1: the fault fired %d times in %d attempts, want one per attempt", n, want))
	}
	if n := f.count(t, `SELECT count(*)::int FROM issued_coupons WHERE member_id LIKE 'a%'`); n != 0 {
		wrong = append(wrong, fmt.Sprintf("%d coupons of the group that always failed", n))
	}
	f.rulesHold(t)
	return wrong
}

// splitRun is [Service.run] on s with the split retry policy before issue 29 (alone and batch,
// each with its own): the path named by alone (a request alone when true, else a coalesced
// group) gives up on SQLSTATE code at once (57014: on either timeout, as [isTimeout] says),
// answering RETRY_EXHAUSTED as alone's giveUp did, and the other path runs as run does.
func splitRun(s *Service, code string, alone bool) func([]*joined) {
	return func(group []*joined) {
		if (len(group) == 1) != alone {
			s.run(group)
			return
		}
		defer answerPanic(group)
		ctx, end := s.callContext(group)
		defer end()
		pending := make([]*member, len(group))
		for i, j := range group {
			pending[i] = &member{joined: j}
		}
		for n := 1; len(pending) > 0; n++ {
			if pending = dropLate(pending, 0); len(pending) == 0 {
				return
			}
			verdicts := s.try(ctx, pending, n)
			for i, v := range verdicts {
				if sqlState(v.err) == code || code == pgerrcode.QueryCanceled && isTimeout(v.err) {
					verdicts[i] = verdict{step: answer, out: Outcome{Result: ResultRetryExhausted}}
				}
			}
			var wait bool
			if pending, wait = act(pending, verdicts); wait {
				pending = pause(ctx, pending, n)
			}
		}
	}
}

// TestRetryAnswer: issue_coupons_batch_v2 answers RETRY for a member it cannot place without
// waiting out of lock order. Campaign R has two stripes with room for one coupon each; a session
// holds stripe 0. A group of two runs: r1 takes stripe 1, r2 is answered RETRY (its rows deleted
// in the call). r2 goes again alone, waits on stripe 0 (pg_blocking_pids shows it), and is ISSUED
// once the holder lets go: attempts 1 and 2, r2's coupon inserted twice (a counting trigger), two
// coupons, both stripes spent.
func TestRetryAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	f := newBatchFixture(t, dbURL, dbURL, Config{})
	if err := campaign.Create(ctx, f.admin, campaign.Campaign{ID: "R", DiscountYen: 1000, BudgetYen: 2000, Stripes: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.Exec(ctx, `
CREATE SEQUENCE r2_inserts;
CREATE FUNCTION count_r2() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM nextval('r2_inserts'); RETURN NEW; END $$;
CREATE TRIGGER count_r2 BEFORE INSERT ON issued_coupons FOR EACH ROW WHEN (NEW.member_id = 'r2') EXECUTE FUNCTION count_r2()`); err != nil {
		t.Fatal(err)
	}
	hold := pgtest.HoldCampaign(t, dbURL, "R", 0)
	now := time.Now()
	var group []*joined
	for _, m := range []string{"r1", "r2"} {
		r := request{memberID: m, campaignID: "R"}
		callEnd := now.Add(f.svc.cfg.Budget)
		jctx, cancel := context.WithDeadline(ctx, attemptsEnd(callEnd))
		t.Cleanup(cancel)
		jctx, span := startIssue(jctx, r)
		group = append(group, &joined{ctx: jctx, req: r, couponID: uuid.NewString(), deadline: attemptsEnd(callEnd), callEnd: callEnd,
			span: span, answer: make(chan answered, 1), lead: make(chan []*joined, 1)})
	}
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		f.svc.run(group)
	}()
	if a := await(t, group[0].answer, "r1"); a.err != nil || a.out.Result != ResultIssued || a.out.Attempts != 1 {
		t.Fatalf("r1: %+v %v, want ISSUED at the first attempt", a.out, a.err)
	}
	hold.WaitBlocked(1) // r2's second attempt, alone, waits for stripe 0
	if n := f.count(t, `SELECT last_value::int FROM r2_inserts`); n != 2 {
		t.Errorf("r2's coupon was inserted %d times before the hold was let go, want 2 (RETRY, then again)", n)
	}
	hold.Release()
	if a := await(t, group[1].answer, "r2"); a.err != nil || a.out.Result != ResultIssued || a.out.Attempts != 2 {
		t.Errorf("r2: %+v %v, want ISSUED at the second attempt (after RETRY)", a.out, a.err)
	}
	<-ran
	if n := f.count(t, `SELECT count(*)::int FROM issued_coupons WHERE campaign_id = 'R'`); n != 2 {
		t.Errorf("%d coupons of R, want 2", n)
	}
	if n := f.count(t, `SELECT count(*)::int FROM campaign_budgets WHERE campaign_id = 'R' AND issued_yen = budget_yen`); n != 2 {
		t.Errorf("%d of R's 2 stripes spent, want both", n)
	}
	f.rulesHold(t)
}
