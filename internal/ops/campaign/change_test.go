package campaign_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// The tests of live changes: in each, clients issuers issue at full rate while an operator
// (a user in coupon_admin) changes the campaign; the outcome is judged by counting the tables.
const (
	issuers = 32
	coupon  = 1000 // yen, every test campaign's discount
	// changeApp is the application_name of the operator's sessions.
	changeApp = "campaign-change"
)

// live is a test's database: the owner's pool that IssueCoupon's services run on (one per
// instance: each coalesces its own requests), and an operator's pool logged in as a user in
// coupon_admin, as couponctl's change verbs run.
type live struct {
	url   string
	pool  *pgxpool.Pool
	admin *pgxpool.Pool
	svcs  []*issuance.Service
}

// instances is how many IssueCoupon instances serve a test's traffic.
const instances = 4

func newLive(t *testing.T, c campaign.Campaign) *live {
	return newLiveWith(t, c, issuance.Config{})
}

func newLiveWith(t *testing.T, c campaign.Campaign, cfg issuance.Config) *live {
	t.Helper()
	ctx := context.Background()
	l := &live{url: pgtest.URL(t)}
	var err error
	if l.pool, err = pgxpool.New(ctx, l.url+"&pool_max_conns=40"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.pool.Close)
	// The operator's sessions set a lock_timeout of their own, which a change keeps: these tests
	// hold stripes while changes queue behind them, for as long as the machine takes to see them
	// queued (TestChangeGivesUpBehindAStuckHolder tests the default).
	if l.admin, err = pgxpool.New(ctx, adminURL(t, l.url)+"&lock_timeout=60s"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.admin.Close)
	if err := campaign.Create(ctx, l.pool, c); err != nil {
		t.Fatal(err)
	}
	for range instances {
		svc, err := issuance.New(l.pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		l.svcs = append(l.svcs, svc)
	}
	// Registered last, so run first of the cleanups above, and after those of what the test
	// opens later (a held campaign's sessions): no deadlock, 40P01, in any test.
	t.Cleanup(func() {
		l.pool.Close()
		l.admin.Close()
		if n := pgtest.Deadlocks(t, l.url); n != 0 {
			t.Errorf("%d deadlocks (40P01)", n)
		}
	})
	return l
}

// adminURL is url logged in as a user in coupon_admin, as couponctl's change verbs run, with
// changeApp as the application name.
func adminURL(t *testing.T, url string) string {
	return pgtest.LoginAs(t, url, "coupon_admin") + "&application_name=" + changeApp
}

func (l *live) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := l.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (l *live) coupons(t *testing.T, id string) int64 {
	t.Helper()
	return l.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = $1`, id)
}

// waitChangeBlocked waits until n operator sessions queue behind hold (issuances may wait
// behind it too, at times: they are not counted).
func (l *live) waitChangeBlocked(t *testing.T, hold *pgtest.Hold, n int) {
	t.Helper()
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if got := l.count(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY ($1) AND application_name = $2`,
			hold.Waiters(), changeApp); got != int64(n) {
			return fmt.Errorf("%d changes wait behind the hold, want %d", got, n)
		}
		return nil
	})
}

// answer is one request of the traffic and what IssueCoupon's service answered.
type answer struct {
	start  time.Time
	member string
	out    issuance.Outcome
	err    error
}

// traffic is issuers clients issuing one campaign at full rate, each a new member per request,
// and every fourth request a re-send of the client's previous member, until stop.
type traffic struct {
	stopped chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	answers []answer
	latest  [issuers]time.Time // the start of each client's latest request
}

func startTraffic(l *live, id string) *traffic {
	tr := &traffic{stopped: make(chan struct{})}
	barrier := make(chan struct{})
	for c := range issuers {
		tr.wg.Go(func() {
			<-barrier
			member := ""
			for k := 0; ; k++ {
				select {
				case <-tr.stopped:
					return
				default:
				}
				if member == "" || k%4 != 3 {
					member = fmt.Sprintf("%s-c%02d-%06d", id, c, k)
				}
				a := answer{start: time.Now(), member: member}
				tr.mu.Lock()
				tr.latest[c] = a.start
				tr.mu.Unlock()
				a.out, a.err = l.svcs[c%instances].Issue(context.Background(), member, id)
				tr.mu.Lock()
				tr.answers = append(tr.answers, a)
				tr.mu.Unlock()
			}
		})
	}
	close(barrier)
	return tr
}

// answered is how many answers came so far.
func (tr *traffic) answered() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.answers)
}

// await waits until n more answers than now have come.
func (tr *traffic) await(t *testing.T, n int) {
	t.Helper()
	want := tr.answered() + n
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if got := tr.answered(); got < want {
			return fmt.Errorf("%d answers, want %d", got, want)
		}
		return nil
	})
}

// startedAfter waits until every client has started a request after from, so that every request
// that was in flight at from has been answered (each client sends one request at a time).
func (tr *traffic) startedAfter(t *testing.T, from time.Time) {
	t.Helper()
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for c, at := range tr.latest {
			if !at.After(from) {
				return fmt.Errorf("client %d has not started a request since %s", c, from.Format(time.RFC3339Nano))
			}
		}
		return nil
	})
}

// stop ends the traffic and returns every answer; it fails t on any request that failed.
func (tr *traffic) stop(t *testing.T) []answer {
	t.Helper()
	close(tr.stopped)
	tr.wg.Wait()
	for _, a := range tr.answers {
		if a.err != nil {
			t.Fatalf("%s: %v", a.member, a.err)
		}
	}
	return tr.answers
}

// results counts answers by result (and reason).
func results(answers []answer) map[string]int {
	got := map[string]int{}
	for _, a := range answers {
		got[strings.TrimSuffix(string(a.out.Result)+" "+a.out.Reason, " ")]++
	}
	return got
}

// waitCoupons waits until campaign id has at least n coupons.
func (l *live) waitCoupons(t *testing.T, id string, n int64) {
	t.Helper()
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if got := l.coupons(t, id); got < n {
			return fmt.Errorf("%d coupons of %s, want %d", got, id, n)
		}
		return nil
	})
}

// violations checks the tables of campaign id after its traffic stopped: it has stripes budget
// stripes summing to budgetYen, none over its own budget, its counters equal to its coupons, and
// reconcile finds nothing.
func (l *live) violations(t *testing.T, id string, stripes, budgetYen int64) []string {
	t.Helper()
	var v []string
	if n := l.count(t, `SELECT count(*) FROM campaign_budgets WHERE campaign_id = $1`, id); n != stripes {
		v = append(v, fmt.Sprintf("%d budget stripes, want %d", n, stripes))
	}
	if n := l.count(t, `SELECT sum(budget_yen) FROM campaign_budgets WHERE campaign_id = $1`, id); n != budgetYen {
		v = append(v, fmt.Sprintf("the stripes' budgets sum to %d yen, want %d", n, budgetYen))
	}
	if n := l.count(t, `SELECT count(*) FROM campaign_budgets WHERE issued_yen > budget_yen OR issued_yen < 0`); n != 0 {
		v = append(v, fmt.Sprintf("%d stripes outside 0..their budget", n))
	}
	if n := l.count(t, `SELECT coalesce(sum(amount_yen), 0) FROM issued_coupons WHERE campaign_id = $1`, id); n > budgetYen {
		v = append(v, fmt.Sprintf("coupons of %d yen over the %d yen budget", n, budgetYen))
	}
	rep, err := reconcile.Check(context.Background(), l.pool)
	if err != nil {
		t.Fatal(err)
	}
	return append(v, rep.Violations()...)
}

func changed(t *testing.T, got []campaign.Change, err error, what ...string) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(what) {
		t.Fatalf("changes %+v, want %v", got, what)
	}
	for i, c := range got {
		if c.What != what[i] {
			t.Fatalf("change %d is %s, want %s", i, c.What, what[i])
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestRaiseSoldOut: a 16-stripe campaign sells out under load; a raise of 50 coupons' yen lets
// out exactly 50 more, and no more however long the traffic goes on.
func TestRaiseSoldOut(t *testing.T) {
	t.Parallel()
	for round := range 2 {
		t.Run(fmt.Sprint("round ", round+1), func(t *testing.T) {
			l := newLive(t, campaign.Campaign{ID: "BF", DiscountYen: coupon, BudgetYen: 100 * coupon, Stripes: 16})
			tr := startTraffic(l, "BF")
			l.waitCoupons(t, "BF", 100)
			tr.await(t, 200) // sold out: refusals only
			changes, err := campaign.Update(context.Background(), l.admin, "BF",
				campaign.Changes{AddBudgetYen: ptr[int64](50 * coupon), Reason: "marketing approved 50 more"})
			changed(t, changes, err, "budget")
			l.waitCoupons(t, "BF", 150)
			tr.await(t, 500)
			answers := tr.stop(t)
			if n := l.coupons(t, "BF"); n != 150 {
				t.Errorf("%d coupons, want exactly 150", n)
			}
			for _, v := range l.violations(t, "BF", 16, 150*coupon) {
				t.Error(v)
			}
			t.Logf("answers %v", results(answers))
		})
	}
}

// TestCutJustAboveIssued: while issuing, the budget is cut to 20 coupons above what is issued;
// exactly that many come out, never more. A cut below what is issued is then refused, naming the
// issued yen, and changes nothing.
func TestCutJustAboveIssued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLive(t, campaign.Campaign{ID: "CUT", DiscountYen: coupon, BudgetYen: 5000 * coupon, Stripes: 16})
	tr := startTraffic(l, "CUT")
	l.waitCoupons(t, "CUT", 100)
	var cut int64
	for cut == 0 {
		target := l.count(t, `SELECT sum(issued_yen) FROM campaign_budgets WHERE campaign_id = 'CUT'`) + 20*coupon
		_, err := campaign.Update(ctx, l.admin, "CUT", campaign.Changes{BudgetYen: &target, Reason: "cut"})
		switch {
		case err == nil:
			cut = target
		case !errors.Is(err, campaign.ErrRefused):
			t.Fatal(err) // refused: the issued yen passed the target meanwhile; try again
		}
	}
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if got := l.coupons(t, "CUT") * coupon; got < cut {
			return fmt.Errorf("%d yen of coupons, want %d", got, cut)
		}
		return nil
	})
	tr.await(t, 500)
	tr.stop(t)
	if got := l.coupons(t, "CUT") * coupon; got != cut {
		t.Errorf("%d yen of coupons after a cut to %d yen", got, cut)
	}
	for _, v := range l.violations(t, "CUT", 16, cut) {
		t.Error(v)
	}

	before := l.count(t, `SELECT count(*) FROM campaign_changes`)
	below := cut - coupon
	_, err := campaign.Update(ctx, l.admin, "CUT", campaign.Changes{BudgetYen: &below, Reason: "too far"})
	if !errors.Is(err, campaign.ErrRefused) || !strings.Contains(err.Error(), fmt.Sprintf("below the %d yen already issued", cut)) {
		t.Errorf("a cut below the issued yen: %v, want refused naming %d yen", err, cut)
	}
	if n := l.count(t, `SELECT count(*) FROM campaign_changes`); n != before {
		t.Errorf("the refused cut wrote %d history rows", n-before)
	}
	for _, v := range l.violations(t, "CUT", 16, cut) {
		t.Errorf("after the refused cut: %s", v)
	}
}

// stopsIssuing is the guarantee of pause, end and a moved end. stop makes the change and returns
// its boundary: the moment it returned, or the new end if that lies ahead. From the boundary on
// (once the requests in flight at a boundary ahead have answered), the campaign's coupons stay as
// many as they were, and every request that started after it is answered CAMPAIGN_NOT_ACTIVE with
// reason, or ALREADY_ISSUED. It returns what it found wrong, and the running traffic.
func stopsIssuing(t *testing.T, l *live, id, reason string, stop func() (time.Time, error)) ([]string, *traffic) {
	t.Helper()
	tr := startTraffic(l, id)
	l.waitCoupons(t, id, 50)
	boundary, err := stop()
	if err != nil {
		t.Fatal(err)
	}
	if boundary.After(time.Now()) {
		tr.startedAfter(t, boundary)
	}
	atBoundary := l.coupons(t, id)
	tr.await(t, 300)
	var wrong []string
	if n := l.coupons(t, id); n != atBoundary {
		wrong = append(wrong, fmt.Sprintf("%d coupons at the change's boundary, %d after", atBoundary, n))
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, a := range tr.answers {
		ok := a.out.Result == issuance.ResultAlreadyIssued ||
			(a.out.Result == issuance.ResultCampaignNotActive && a.out.Reason == reason)
		if a.start.After(boundary) && a.err == nil && !ok {
			wrong = append(wrong, fmt.Sprintf("%s after the change: %s %s", a.member, a.out.Result, a.out.Reason))
		}
	}
	return wrong, tr
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// returned is the boundary of a change that stops issuing as it returns.
func returned(err error) (time.Time, error) { return time.Now(), err }

// TestPauseUnderLoad: a pause under load stops every coupon once it returns, on one stripe and
// on 16; a resume issues again. Over a queued call, the race is made to happen instead of hoped
// for (overAQueuedCall): a call that read the campaign active waits behind the pause, and
// is refused once the pause commits. The broken variant, a pause judged only by the reads before
// the writes, lets that call commit after the pause returned.
func TestPauseUnderLoad(t *testing.T) {
	t.Parallel()
	for _, stripes := range []int{1, 16} {
		t.Run(fmt.Sprintf("%d stripes", stripes), func(t *testing.T) {
			t.Parallel()
			for round := range 2 {
				l := newLive(t, campaign.Campaign{ID: "RUN", DiscountYen: coupon, BudgetYen: 100_000 * coupon, Stripes: stripes})
				wrong, tr := stopsIssuing(t, l, "RUN", issuance.ReasonPaused, func() (time.Time, error) {
					_, err := campaign.Pause(context.Background(), l.admin, "RUN", "runaway discount")
					return returned(err)
				})
				for _, w := range wrong {
					t.Errorf("round %d: %s", round+1, w)
				}
				paused := l.coupons(t, "RUN")
				if _, err := campaign.Resume(context.Background(), l.admin, "RUN", "fixed"); err != nil {
					t.Fatal(err)
				}
				l.waitCoupons(t, "RUN", paused+50)
				tr.stop(t)
				for _, v := range l.violations(t, "RUN", int64(stripes), 100_000*coupon) {
					t.Error(v)
				}
			}
		})
	}
	queuedBehind(t, issuance.ReasonPaused, stateOnlyByReads, func(ctx context.Context, l *live) error {
		_, err := campaign.Pause(ctx, l.admin, "RUN", "runaway discount")
		return err
	})
}

// queuedBehind runs overAQueuedCall with change (a pause or an end) on the production code and on
// the broken variant of issue_coupons_batch_v3 that broken makes, as subtests: the call queued
// behind the change must write no coupon and answer CAMPAIGN_NOT_ACTIVE reason; the variant must
// be caught.
func queuedBehind(t *testing.T, reason string, broken [][2]string, change func(context.Context, *live) error) {
	for _, isBroken := range []bool{false, true} {
		t.Run(fmt.Sprintf("over a queued call broken=%v", isBroken), func(t *testing.T) {
			t.Parallel()
			l := newLive(t, campaign.Campaign{ID: "RUN", DiscountYen: coupon, BudgetYen: 100_000 * coupon})
			if isBroken {
				pgtest.BreakFunction(t, l.pool, "issue_coupons_batch_v3", broken...)
			}
			answer := overAQueuedCall(t, l, "RUN", func(ctx context.Context) error { return change(ctx, l) })
			var wrong []string
			if n := l.coupons(t, "RUN"); n != 0 {
				wrong = append(wrong, fmt.Sprintf("the call queued behind the change wrote %d coupon (answered %q)", n, answer))
			}
			if want := "CAMPAIGN_NOT_ACTIVE " + reason; answer != want {
				wrong = append(wrong, fmt.Sprintf("the call queued behind the change answered %q, want %q", answer, want))
			}
			if isBroken {
				if len(wrong) == 0 {
					t.Fatal("the broken variant passed: the test would not see a change that lets issuances in flight commit")
				}
				t.Logf("the broken variant: %d findings, first %q", len(wrong), wrong[0])
				return
			}
			for _, w := range wrong {
				t.Error(w)
			}
			for _, v := range l.violations(t, "RUN", 1, 100_000*coupon) {
				t.Error(v)
			}
		})
	}
}

// overAQueuedCall makes change (a pause or an end of campaign id: one stripe, no coupon yet, no
// traffic) while a call of issue_coupon waits behind it, a call that read the campaign active
// before the change committed, and returns the call's answer: "RESULT REASON", or for the refusal
// issue_coupon raises after its writes (CI409, rolled back) "MESSAGE DETAIL".
// The order is made, not hoped for: a session of the test holds the stripe FOR UPDATE, the change
// queues behind it, the call queues behind the change (it names it in pg_blocking_pids), and the
// hold commits. The hold only locked the row, so the change, first in its queue, locks
// that same row version before the call. Traffic beside it would break that order: an UPDATE
// that commits first makes a new row version, for which the queue starts afresh.
func overAQueuedCall(t *testing.T, l *live, id string, change func(context.Context) error) string {
	t.Helper()
	ctx := context.Background()
	hold := pgtest.HoldCampaign(t, l.url, id)
	changed := make(chan error, 1)
	go func() { changed <- change(ctx) }()
	changer := hold.WaitBlocked(1)[0]
	conn, err := pgx.Connect(ctx, l.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	call := int(conn.PgConn().PID())
	answered := make(chan string, 1)
	go func() {
		var result, reason string
		err := conn.QueryRow(ctx, `SELECT result, coalesce(reason, '') FROM issue_coupon(gen_random_uuid(), $1, 'm1', now(), 2000, NULL)`,
			id).Scan(&result, &reason)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "CI409":
			answered <- pgErr.Message + " " + pgErr.Detail
		case err != nil:
			answered <- "error: " + err.Error()
		default:
			answered <- strings.TrimSpace(result + " " + reason)
		}
	}()
	if waiters := pgtest.WaitBlockedBy(t, l.pool, changer, 1); waiters[0] != call {
		t.Fatalf("backend %d waits behind the change (backend %d), want the call's %d", waiters[0], changer, call)
	}
	hold.Release()
	if err := <-changed; err != nil {
		t.Fatal(err)
	}
	return <-answered
}

// TestEndUnderLoad: ending now, and moving the end to now, stop every coupon once the change
// returns (reason ENDED); an end moved a moment ahead stops them once that moment has passed.
// Over a queued call (overAQueuedCall), a call that read the clock before the end stamped its own
// and waited for the stripe is refused once the end commits. The broken variant, a stripe judged
// at a clock read before the wait (00031, fixed by 00033; here the call's start), lets it commit
// after the end returned.
func TestEndUnderLoad(t *testing.T) {
	t.Parallel()
	queuedBehind(t, issuance.ReasonEnded, clockBeforeTheWait, func(ctx context.Context, l *live) error {
		_, err := campaign.End(ctx, l.admin, "RUN", "misconfigured discount")
		return err
	})
	tomorrow := time.Now().Add(24 * time.Hour)
	for _, c := range []struct {
		name string
		stop func(*live) (time.Time, error)
	}{
		{"end now", func(l *live) (time.Time, error) {
			_, err := campaign.End(context.Background(), l.admin, "RUN", "misconfigured discount")
			return returned(err)
		}},
		{"ends moved to now", func(l *live) (time.Time, error) {
			_, err := campaign.Update(context.Background(), l.admin, "RUN",
				campaign.Changes{SetEnds: true, EndsAt: ptr(time.Now()), Reason: "stop it"})
			return returned(err)
		}},
		{"ends moved a moment ahead", func(l *live) (time.Time, error) {
			end := time.Now().Add(200 * time.Millisecond)
			_, err := campaign.Update(context.Background(), l.admin, "RUN",
				campaign.Changes{SetEnds: true, EndsAt: &end, Reason: "ends shortly"})
			return latest(end, time.Now()), err // the change may commit after the end it sets
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l := newLive(t, campaign.Campaign{ID: "RUN", DiscountYen: coupon, BudgetYen: 100_000 * coupon, Stripes: 4, EndsAt: &tomorrow})
			wrong, tr := stopsIssuing(t, l, "RUN", issuance.ReasonEnded, func() (time.Time, error) { return c.stop(l) })
			tr.stop(t)
			for _, w := range wrong {
				t.Error(w)
			}
			for _, v := range l.violations(t, "RUN", 4, 100_000*coupon) {
				t.Error(v)
			}
		})
	}
}

// restripe runs traffic on a 1-stripe campaign of 10,000 coupons, re-stripes it to 16 and then
// to 4 while it issues, and returns what the tables and the answers show wrong.
func restripe(t *testing.T, l *live) []string {
	t.Helper()
	tr := startTraffic(l, "HOT")
	l.waitCoupons(t, "HOT", 100)
	changes, err := campaign.Update(context.Background(), l.admin, "HOT", campaign.Changes{Stripes: ptr(16), Reason: "hot"})
	changed(t, changes, err, "stripes")
	// 16 to 4 waits behind a session holding stripe 0 while the other stripes issue 50 coupons:
	// what commits while a change waits for the stripes must be in its figures.
	hold := pgtest.HoldCampaign(t, l.url, "HOT", 0)
	done := make(chan error, 1)
	go func() {
		changes, err := campaign.Update(context.Background(), l.admin, "HOT", campaign.Changes{Stripes: ptr(4), Reason: "cooler"})
		if err == nil && (len(changes) != 1 || changes[0].What != "stripes") {
			err = fmt.Errorf("changes %+v, want one stripes change", changes)
		}
		done <- err
	}()
	l.waitChangeBlocked(t, hold, 1)
	l.waitCoupons(t, "HOT", l.coupons(t, "HOT")+50)
	hold.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	tr.await(t, 300)
	answers := tr.stop(t)
	wrong := l.violations(t, "HOT", 4, 10_000*coupon)
	if n := results(answers)[string(issuance.ResultBudgetExceeded)]; n > 0 {
		wrong = append(wrong, fmt.Sprintf("%d BUDGET_EXCEEDED with room left", n))
	}
	return wrong
}

// TestRestripeUnderLoad: re-striping 1 to 16 and 16 to 4 under load keeps the budget and the
// issued yen exactly, R1, and refuses nobody while room remains. The broken variant, a re-stripe
// that recomputes the issued yen from the coupons it read before it held the stripes, loses the
// coupons that committed meanwhile.
func TestRestripeUnderLoad(t *testing.T) {
	t.Parallel()
	for round := range 2 {
		t.Run(fmt.Sprint("round ", round+1), func(t *testing.T) {
			t.Parallel()
			l := newLive(t, campaign.Campaign{ID: "HOT", DiscountYen: coupon, BudgetYen: 10_000 * coupon})
			for _, w := range restripe(t, l) {
				t.Error(w)
			}
		})
	}
	t.Run("broken: issued yen recomputed from an earlier read", func(t *testing.T) {
		t.Parallel()
		l := newLive(t, campaign.Campaign{ID: "HOT", DiscountYen: coupon, BudgetYen: 10_000 * coupon})
		pgtest.BreakFunction(t, l.pool, "campaign_change_budget", [2]string{
			"SELECT count(*), sum(l.budget_yen), sum(l.issued_yen) INTO v_k, v_budget, v_issued FROM campaign_lock(p_campaign_id) l;",
			`v_issued := (SELECT coalesce(sum(amount_yen), 0) FROM issued_coupons WHERE campaign_id = p_campaign_id);
			 SELECT count(*), sum(l.budget_yen) INTO v_k, v_budget FROM campaign_lock(p_campaign_id) l;`})
		if wrong := restripe(t, l); len(wrong) == 0 {
			t.Error("the broken variant passed: the test would not see a re-stripe that loses issued yen")
		} else {
			t.Logf("the broken variant: %v", wrong)
		}
	})
}

// TestConcurrentChanges: changes that queue behind one another on the campaign (held here by a
// session of the test, with traffic running) all take effect, in commit order: two adds add up,
// two absolute budgets leave the later commit's, a pause and a raise both stay, and the history
// has every change in commit order. The broken variant, a budget written from the value read
// before the change held the stripes, loses one of two adds.
func TestConcurrentChanges(t *testing.T) {
	t.Parallel()
	type race struct {
		name    string
		changes []func(*live) error
		check   func(*testing.T, *live, []campaign.Change)
	}
	add := func(d int64) func(*live) error {
		return func(l *live) error {
			_, err := campaign.Update(context.Background(), l.admin, "BF", campaign.Changes{AddBudgetYen: &d, Reason: fmt.Sprint("add ", d)})
			return err
		}
	}
	set := func(b int64) func(*live) error {
		return func(l *live) error {
			_, err := campaign.Update(context.Background(), l.admin, "BF", campaign.Changes{BudgetYen: &b, Reason: fmt.Sprint("set ", b)})
			return err
		}
	}
	budget := func(l *live, t *testing.T) int64 {
		return l.count(t, `SELECT sum(budget_yen) FROM campaign_budgets WHERE campaign_id = 'BF'`)
	}
	races := []race{
		{"two adds", []func(*live) error{add(30 * coupon), add(50 * coupon)}, func(t *testing.T, l *live, h []campaign.Change) {
			if b := budget(l, t); b != 10_080*coupon {
				t.Errorf("budget %d yen after adding 30 and 50 coupons to 10,000: want %d", b, 10_080*coupon)
			}
		}},
		{"two budgets", []func(*live) error{set(20_000 * coupon), set(30_000 * coupon)}, func(t *testing.T, l *live, h []campaign.Change) {
			last := int64(h[len(h)-1].After["budget_yen"].(float64))
			if b := budget(l, t); b != last {
				t.Errorf("budget %d yen, want the later commit's %d", b, last)
			}
		}},
		{"a pause and a raise", []func(*live) error{
			func(l *live) error { _, err := campaign.Pause(context.Background(), l.admin, "BF", "hold"); return err },
			add(10 * coupon),
		}, func(t *testing.T, l *live, h []campaign.Change) {
			s, err := campaign.Show(context.Background(), l.pool, "BF")
			if err != nil || s.State != campaign.StatePaused || s.BudgetYen != 10_010*coupon {
				t.Errorf("after a pause and a raise: %+v %v, want paused with 10,010 coupons of budget", s, err)
			}
		}},
	}
	for _, broken := range []bool{false, true} {
		for _, r := range races {
			if broken && r.name != "two adds" {
				continue
			}
			t.Run(fmt.Sprintf("%s broken=%v", r.name, broken), func(t *testing.T) {
				t.Parallel()
				l := newLive(t, campaign.Campaign{ID: "BF", DiscountYen: coupon, BudgetYen: 10_000 * coupon, Stripes: 8})
				if broken {
					pgtest.BreakFunction(t, l.pool, "campaign_change_budget", [2]string{
						"SELECT count(*), sum(l.budget_yen), sum(l.issued_yen) INTO v_k, v_budget, v_issued FROM campaign_lock(p_campaign_id) l;",
						`SELECT count(*), sum(budget_yen) INTO v_k, v_budget FROM campaign_budgets WHERE campaign_id = p_campaign_id;
						 SELECT sum(l.issued_yen) INTO v_issued FROM campaign_lock(p_campaign_id) l;`})
				}
				tr := startTraffic(l, "BF")
				l.waitCoupons(t, "BF", 20)
				hold := pgtest.HoldCampaign(t, l.url, "BF", 0)
				errs := make(chan error, len(r.changes))
				for _, change := range r.changes {
					go func() { errs <- change(l) }()
				}
				l.waitChangeBlocked(t, hold, len(r.changes))
				hold.Release()
				for range r.changes {
					if err := <-errs; err != nil {
						t.Fatal(err)
					}
				}
				tr.await(t, 100)
				tr.stop(t)
				h, err := campaign.History(context.Background(), l.pool, "BF")
				if err != nil {
					t.Fatal(err)
				}
				if len(h) != 1+len(r.changes) || h[0].What != "create" {
					t.Fatalf("history %+v, want its creation and %d changes", h, len(r.changes))
				}
				for i := 1; i < len(h); i++ {
					if h[i].At.Before(h[i-1].At) {
						t.Errorf("history out of commit order: change %d at %s before change %d at %s", h[i].ID, h[i].At, h[i-1].ID, h[i-1].At)
					}
				}
				if broken {
					if b := budget(l, t); b == 10_080*coupon {
						t.Error("the broken variant passed: the test would not see a lost add")
					}
					return
				}
				r.check(t, l, h)
				b := budget(l, t)
				for _, v := range l.violations(t, "BF", 8, b) {
					t.Error(v)
				}
			})
		}
	}
}

// stateOnlyByReads is the broken variant of issue_coupons_batch that judges the campaign's state
// only by its reads: the guards on the stripe it writes, the free stripe's and the waited
// stripe's, always true.
var stateOnlyByReads = [][2]string{
	{"campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, greatest(v_at, issue_now())) IS NULL", "true"},
}

// clockBeforeTheWait is the broken variant of issue_coupons_batch_v3 that judges the stripes it
// writes at an instant read before it waited for them: the call's start.
var clockBeforeTheWait = [][2]string{{"greatest(v_at, issue_now())", "v_at"}}

// TestPauseJudgedOnTheStripe: a pause that has not committed yet holds every stripe; a call that
// read the campaign active meanwhile waits for a stripe, and once the pause commits it is refused
// CAMPAIGN_NOT_ACTIVE PAUSED and writes nothing: issue_coupon (the previous release's call, a
// batch of one), and issue_coupons_batch for three members (two new, one twice). The broken
// variant, issue_coupons_batch judging the state only by its reads, commits after the pause
// through either.
func TestPauseJudgedOnTheStripe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	single := `SELECT array[result || ' ' || coalesce(reason, '')] FROM issue_coupon(gen_random_uuid(), 'RUN', 'm1', now(), 2000, NULL)`
	batch := `SELECT array_agg(result || ' ' || coalesce(reason, '') ORDER BY i) FROM issue_coupons_batch('RUN',
		ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid()], ARRAY['m1', 'm2', 'm1'], ARRAY[now(), now(), now()], 2000,
		ARRAY[NULL, NULL, NULL]::text[])`
	for _, c := range []struct{ name, call string }{{"issue_coupon", single}, {"issue_coupons_batch", batch}} {
		for _, broken := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s broken=%v", c.name, broken), func(t *testing.T) {
				t.Parallel()
				l := newLive(t, campaign.Campaign{ID: "RUN", DiscountYen: coupon, BudgetYen: 100 * coupon, Stripes: 2})
				if broken {
					pgtest.BreakFunction(t, l.pool, "issue_coupons_batch_v3", stateOnlyByReads...)
				}
				pause, err := l.pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer pause.Rollback(ctx)
				var pid int
				if err := pause.QueryRow(ctx, `SELECT pg_backend_pid() FROM campaign_change_state('RUN', 'pause', NULL, NULL, false, false, 'test')`).Scan(&pid); err != nil {
					t.Fatal(err)
				}
				got := make(chan []string, 1)
				go func() {
					var answers []string
					if err := l.pool.QueryRow(ctx, c.call).Scan(&answers); err != nil {
						t.Error(err)
					}
					got <- answers
				}()
				pgtest.WaitBlockedBy(t, l.pool, pid, 1)
				if err := pause.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				answers := <-got
				coupons := l.coupons(t, "RUN")
				if broken {
					if coupons == 0 {
						t.Errorf("the broken variant committed nothing (%v): the test would not see it", answers)
					}
					return
				}
				for _, a := range answers {
					if a != "CAMPAIGN_NOT_ACTIVE PAUSED" {
						t.Errorf("answers %v after the pause committed, want CAMPAIGN_NOT_ACTIVE PAUSED", answers)
						break
					}
				}
				if coupons != 0 || l.count(t, `SELECT coalesce(sum(used_yen), 0) FROM member_monthly_usage`) != 0 ||
					l.count(t, `SELECT count(*) FROM notification_outbox`) != 0 || l.count(t, `SELECT sum(issued_yen) FROM campaign_budgets`) != 0 {
					t.Errorf("a refused call left rows behind: %d coupons", coupons)
				}
			})
		}
	}
}

// TestChangeGivesUpBehindAStuckHolder: a change that finds a budget stripe locked for longer than
// campaign.ChangeLockTimeout gives up with ErrBusy and changes nothing, so that the stripes it
// took before it are free again; a session's own lock_timeout is kept (the change waits out the
// holder). The broken variant, the change function called without the timeout, would wait as
// long as the holder holds.
func TestChangeGivesUpBehindAStuckHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLive(t, campaign.Campaign{ID: "HELD", DiscountYen: coupon, BudgetYen: 100 * coupon, Stripes: 16})
	hold := pgtest.HoldCampaign(t, l.url, "HELD", 5)
	admin, err := pgxpool.New(ctx, adminURL(t, l.url))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := campaign.Pause(ctx, admin, "HELD", "runaway"); !errors.Is(err, campaign.ErrBusy) {
		t.Fatalf("a pause behind a held stripe: %v, want ErrBusy", err)
	}
	if h, err := campaign.History(ctx, l.pool, "HELD"); err != nil || len(h) != 1 || h[0].What != "create" {
		t.Errorf("history after the refused pause: %+v %v, want its creation alone", h, err)
	}
	// The stripes before the held one are free: a lock on each is granted at once.
	if n := l.count(t, `SELECT count(*) FROM (SELECT 1 FROM campaign_budgets WHERE campaign_id = 'HELD' AND stripe < 5
		FOR UPDATE NOWAIT) free`); n != 5 {
		t.Errorf("%d of stripes 0-4 free after the refused pause, want 5", n)
	}

	t.Run("broken: without the timeout", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 3*campaign.ChangeLockTimeout)
		defer cancel()
		_, err := admin.Exec(cctx, `SELECT campaign_change_state('HELD', 'pause', NULL, NULL, false, false, 'runaway')`)
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			t.Errorf("the broken variant gave up by itself (%v): the test would not see a change without its timeout", err)
		}
		t.Logf("the broken variant: %v", err)
	})

	t.Run("the session's lock_timeout", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := campaign.Pause(ctx, l.admin, "HELD", "runaway"); done <- err }()
		l.waitChangeBlocked(t, hold, 1)
		hold.Release()
		if err := <-done; err != nil {
			t.Errorf("a pause under the session's lock_timeout: %v", err)
		}
	})
}

// TestRestripeKeepsValidity: a re-stripe gives every stripe it adds the campaign's validity, so
// a rule judged on the stripe an issuance writes (the coupons' fixed expiry) holds on each. The
// broken variant, 00010's body (new stripes without coupon_valid_days or coupons_expire_at),
// leaves three of four stripes without it.
func TestRestripeKeepsValidity(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			expire := time.Now().Add(30 * 24 * time.Hour).Truncate(time.Second)
			l := newLive(t, campaign.Campaign{ID: "VALID", DiscountYen: coupon, BudgetYen: 100 * coupon, CouponsExpireAt: &expire})
			if broken {
				pgtest.BreakFunction(t, l.pool, "campaign_change_budget", [2]string{
					"v_first.coupon_valid_days, v_first.coupons_expire_at)", "NULL, NULL)"})
			}
			if _, err := campaign.Update(ctx, l.admin, "VALID", campaign.Changes{Stripes: ptr(4), Reason: "spread"}); err != nil {
				t.Fatal(err)
			}
			n := l.count(t, `SELECT count(*) FROM campaign_budgets WHERE campaign_id = 'VALID' AND coupons_expire_at = $1`, expire)
			switch {
			case !broken && n != 4:
				t.Errorf("%d of 4 stripes carry the coupons' expiry after a re-stripe, want 4", n)
			case broken && n == 4:
				t.Error("the broken variant passed: the test would not see new stripes without the validity")
			}
		})
	}
}
