package outbox_test

import (
	"context"
	"crypto/md5"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/outboxadmin"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	pool    *pgxpool.Pool
	stub    *linestub.Stub
	srv     *httptest.Server // serves stub; Close waits for the requests in flight
	cfg     outbox.Config
	coupons []string // the seeded coupon ids, in claim order
}

// setup gives a test its own migrated database holding n unsent outbox rows (with their
// coupons), a LINE stand-in served over real HTTP, and a relay config pointing at it: batches
// of 10, 4 pushes at once, 300 ms per push, 5 attempts, retry on the next run.
func setup(t testing.TB, n int) bundle {
	t.Helper()
	pool := pgtest.Pool(t, 16)
	stub := linestub.New()
	srv := httptest.NewServer(stub)
	t.Cleanup(srv.Close)
	coupons := seed(t, pool, n)
	return bundle{pool: pool, stub: stub, srv: srv, coupons: coupons, cfg: outbox.Config{
		ChannelAccessToken: "test-token",
		BaseURL:            srv.URL,
		BatchSize:          10,
		Parallelism:        4,
		PushTimeout:        300 * time.Millisecond,
		BatchTimeout:       5 * time.Second,
		Lease:              10 * time.Second,
		RunBudget:          30 * time.Second,
		MaxAttempts:        5,
		Logger:             slog.New(slog.DiscardHandler),
	}}
}

// seed inserts n coupons of campaign T, 1,000 yen each, for members m000001, m000002, ...,
// each linked to the LINE user [lineUser] of its member id, with their outbox rows due one
// millisecond apart (so the claim order is the seeding order), and returns their ids.
func seed(t testing.TB, pool *pgxpool.Pool, n int) []string {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('T', 1000, 1000000) ON CONFLICT DO NOTHING;`)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `
WITH c AS (
  INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
  SELECT 'T', 'm' || lpad(g::text, 6, '0'), '2026-11', 1000 FROM generate_series(1, $1) g
  RETURNING coupon_id, member_id
), l AS (
  INSERT INTO member_line_accounts (member_id, line_user_id) SELECT member_id, 'U' || md5(member_id) FROM c
), o AS (
  INSERT INTO notification_outbox (coupon_id, member_id, next_attempt_at)
  SELECT coupon_id, member_id, now() - interval '1 hour' + substr(member_id, 2)::int * interval '1 ms' FROM c
  RETURNING coupon_id, member_id
)
SELECT coupon_id::text FROM o ORDER BY member_id`, n)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// lineUser is the LINE user id [seed] links memberID to: "U" + md5 of the member id in hex.
func lineUser(memberID string) string {
	return fmt.Sprintf("U%x", md5.Sum([]byte(memberID)))
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func newRelay(t testing.TB, b bundle) *outbox.Relay {
	t.Helper()
	r, err := outbox.New(b.pool, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func run(t testing.TB, r *outbox.Relay, maxRows int) outbox.Result {
	t.Helper()
	res, err := r.Run(context.Background(), maxRows)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

// TestConcurrentRelaysClaimDisjointBatches runs four relays at once, released from a barrier,
// each asking for 10 rows per run until the outbox is drained: no run handles more than 10
// rows, no coupon is claimed or pushed by two runs, what the runs report sent equals the rows
// marked sent and the pushes LINE accepted, and every row is sent exactly once. Every claim is
// logged by a trigger (claim_log). Red with the claim's lease removed (next_attempt_at left as
// it was): rows claimed 2 to 4 times, pushed again and answered 409.
func TestConcurrentRelaysClaimDisjointBatches(t *testing.T) {
	t.Parallel()
	const rows, relays, maxRows = 1000, 4, 10
	b := setup(t, rows)
	exec(t, b, `
CREATE TABLE claim_log (coupon_id uuid NOT NULL, run uuid NOT NULL);
CREATE FUNCTION log_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO claim_log VALUES (NEW.coupon_id, NEW.claimed_by);
  RETURN NULL;
END $$;
CREATE TRIGGER log_claim AFTER UPDATE OF claimed_by ON notification_outbox
  FOR EACH ROW WHEN (NEW.claimed_by IS NOT NULL) EXECUTE FUNCTION log_claim();`)

	start := make(chan struct{})
	var wg sync.WaitGroup
	results := make([][]outbox.Result, relays)
	errs := make([]error, relays)
	for i := range relays {
		r := newRelay(t, b) // one Relay per "instance"
		wg.Go(func() {
			<-start
			for {
				res, err := r.Run(context.Background(), maxRows)
				if err != nil {
					errs[i] = err
					return
				}
				if res.Rows() == 0 {
					return
				}
				results[i] = append(results[i], res)
			}
		})
	}
	close(start)
	wg.Wait()

	sent, runs := 0, 0
	for i := range relays {
		if errs[i] != nil {
			t.Fatalf("relay %d: %v", i, errs[i])
		}
		for _, res := range results[i] {
			runs++
			if res.Rows() > maxRows {
				t.Errorf("relay %d: a run handled %d rows, more than the %d asked", i, res.Rows(), maxRows)
			}
			if res.RetryLater != 0 || res.Parked != 0 {
				t.Errorf("relay %d: %+v, want only sent rows", i, res)
			}
			sent += res.Sent
		}
	}
	t.Logf("%d runs over %d relays", runs, relays)

	marked := count(t, b.pool, `SELECT count(*) FROM notification_outbox WHERE sent_at IS NOT NULL`)
	st := b.stub.Stats()
	if sent != marked || marked != st.Accepted {
		t.Errorf("runs reported %d sent, table has %d marked sent, LINE accepted %d; want all equal", sent, marked, st.Accepted)
	}
	if marked != rows || st.Keys != rows || st.Requests != rows || st.Conflicts != 0 {
		t.Errorf("marked %d, LINE saw %d keys in %d requests with %d conflicts; want %d, %d, %d, 0",
			marked, st.Keys, st.Requests, st.Conflicts, rows, rows, rows)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM claim_log`); n < rows {
		t.Fatalf("claim_log holds %d claims for %d rows: the trigger did not fire for every claim", n, rows)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM (SELECT coupon_id FROM claim_log GROUP BY coupon_id HAVING count(*) > 1) x`); n != 0 {
		t.Errorf("%d rows were claimed more than once", n)
	}
	for _, id := range b.coupons {
		if n := b.stub.AcceptedTimes(id); n != 1 {
			t.Fatalf("coupon %s accepted by LINE %d times, want 1", id, n)
		}
	}
}

// injectMarkFailure makes the first attempt to mark couponID sent fail inside PostgreSQL, after
// LINE has accepted its push: the crash window between push and mark. The sequence
// mark_attempts counts the attempts outside the failing statement's transaction ([firings]).
func injectMarkFailure(t *testing.T, pool *pgxpool.Pool, couponID string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), fmt.Sprintf(`
CREATE SEQUENCE mark_attempts;
CREATE FUNCTION fail_first_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF nextval('mark_attempts') = 1 THEN
    RAISE EXCEPTION 'injected: marking coupon %% sent fails', OLD.coupon_id;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER fail_first_mark BEFORE UPDATE OF sent_at ON notification_outbox
  FOR EACH ROW WHEN (NEW.sent_at IS NOT NULL AND OLD.coupon_id = '%s')
  EXECUTE FUNCTION fail_first_mark();`, couponID))
	if err != nil {
		t.Fatal(err)
	}
}

// firings is how often the trigger counting with seq fired: seq's last value, 0 before its
// first nextval.
func firings(t *testing.T, pool *pgxpool.Pool, seq string) int {
	t.Helper()
	return count(t, pool, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM `+pgx.Identifier{seq}.Sanitize())
}

type rowState struct {
	sent, parked bool
	attempts     int
	lastError    string
}

func state(t *testing.T, pool *pgxpool.Pool, couponID string) rowState {
	t.Helper()
	var s rowState
	err := pool.QueryRow(context.Background(), `
SELECT sent_at IS NOT NULL, parked_at IS NOT NULL, attempts, COALESCE(last_error, '')
  FROM notification_outbox WHERE coupon_id = $1`, couponID).Scan(&s.sent, &s.parked, &s.attempts, &s.lastError)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBatchSurvivesSlowFailingAndUnmarkedRows runs one batch of 10 with three faults: LINE
// answers the 3rd push after 10 push timeouts, answers the 5th with 500 every time, and marking
// the 7th sent fails once inside PostgreSQL after LINE accepted it; then four more runs. Each
// fault is checked to have fired: the 3rd row's timeout and the 5th's 500 as their last errors,
// the mark failure by its trigger's count.
func TestBatchSurvivesSlowFailingAndUnmarkedRows(t *testing.T) {
	t.Parallel()
	b := setup(t, 10)
	slow, failing, unmarked := b.coupons[2], b.coupons[4], b.coupons[6]
	b.stub.Script(slow, linestub.Response{Delay: 10 * b.cfg.PushTimeout})
	b.stub.Always(failing, linestub.Response{Status: http.StatusInternalServerError, Message: "injected outage"})
	injectMarkFailure(t, b.pool, unmarked)
	r := newRelay(t, b)

	// Run 1: the seven others are sent; the slow one timed out without holding them up.
	first := run(t, r, 0)
	if want := (outbox.Result{Sent: 7, RetryLater: 3}); first != want {
		t.Errorf("run 1: %+v, want %+v", first, want)
	}
	if n := firings(t, b.pool, "mark_attempts"); n != 1 {
		t.Fatalf("the injected mark failure fired %d times in run 1, want 1", n)
	}
	for i, id := range b.coupons {
		s := state(t, b.pool, id)
		switch id {
		case slow:
			if s.sent || !strings.Contains(s.lastError, "no answer") {
				t.Errorf("slow row after run 1: %+v, want unsent with a timeout as last error", s)
			}
		case failing:
			if s.sent || !strings.Contains(s.lastError, "HTTP 500") {
				t.Errorf("failing row after run 1: %+v, want unsent with HTTP 500", s)
			}
		case unmarked:
			if s.sent || !strings.Contains(s.lastError, "marking it sent failed") || b.stub.AcceptedTimes(id) != 1 {
				t.Errorf("unmarked row after run 1: %+v, accepted %d; want unsent, accepted once",
					s, b.stub.AcceptedTimes(id))
			}
		default:
			if !s.sent {
				t.Errorf("row %d not sent in run 1: %+v", i+1, s)
			}
		}
	}

	// Runs 2-5: the slow and the unmarked rows go in run 2; the failing one is parked in run 5.
	want := []outbox.Result{{Sent: 2, RetryLater: 1}, {RetryLater: 1}, {RetryLater: 1}, {Parked: 1}}
	for i, w := range want {
		if got := run(t, r, 0); got != w {
			t.Errorf("run %d: %+v, want %+v", i+2, got, w)
		}
	}

	if s := state(t, b.pool, failing); !s.parked || s.attempts != 5 ||
		!strings.Contains(s.lastError, "attempt limit 5 reached") || !strings.Contains(s.lastError, "HTTP 500") {
		t.Errorf("failing row: %+v, want parked after 5 attempts with the 500 as last error", s)
	}
	// The unmarked row was re-sent with the same retry key; LINE answered 409, counted as sent.
	var statuses []int
	for _, p := range b.stub.Pushes() {
		if p.RetryKey == unmarked {
			statuses = append(statuses, p.Status)
		}
	}
	if fmt.Sprint(statuses) != fmt.Sprint([]int{200, 409}) || !state(t, b.pool, unmarked).sent {
		t.Errorf("unmarked row: LINE answered %v and sent=%v; want [200 409] and sent", statuses, state(t, b.pool, unmarked).sent)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notification_outbox WHERE sent_at IS NOT NULL`); n != 9 {
		t.Errorf("%d rows sent, want 9", n)
	}
	for _, id := range b.coupons {
		if id != failing && b.stub.AcceptedTimes(id) != 1 {
			t.Errorf("coupon %s accepted %d times, want 1", id, b.stub.AcceptedTimes(id))
		}
	}
}

// TestRetryAfterIsRespected answers 429 with Retry-After: 120 to one row and Retry-After of
// a day to another: the first is not tried again before 120 s, even with a zero backoff; the
// second waits the retry cap (5 minutes here), not a day.
func TestRetryAfterIsRespected(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.cfg.RetryCap = 5 * time.Minute
	id, long := b.coupons[0], b.coupons[1]
	b.stub.Script(id, linestub.Response{Status: http.StatusTooManyRequests, RetryAfter: "120"})
	b.stub.Script(long, linestub.Response{Status: http.StatusTooManyRequests, RetryAfter: "86400"})
	r := newRelay(t, b)

	if got := run(t, r, 0); got != (outbox.Result{RetryLater: 2}) {
		t.Fatalf("run 1: %+v, want two retry later", got)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notification_outbox
		WHERE coupon_id = $1 AND next_attempt_at >= now() + interval '110 seconds' AND last_error LIKE '%HTTP 429%'`, id); n != 1 {
		t.Errorf("row not held back by Retry-After: %d rows due in >= 110 s with the 429 kept", n)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notification_outbox
		WHERE coupon_id = $1 AND next_attempt_at BETWEEN now() + interval '4 minutes' AND now() + interval '5 minutes'`, long); n != 1 {
		t.Errorf("a day's Retry-After not capped at the 5-minute retry cap")
	}
	if _, err := b.pool.Exec(context.Background(), `DELETE FROM notification_outbox WHERE coupon_id = $1`, long); err != nil {
		t.Fatal(err)
	}
	if got := run(t, r, 0); got.Rows() != 0 || b.stub.Calls(id) != 1 {
		t.Errorf("run 2 inside Retry-After: %+v, LINE saw %d calls; want nothing", got, b.stub.Calls(id))
	}

	// Once Retry-After has passed (moved by SQL, not by waiting), the next run sends it.
	if _, err := b.pool.Exec(context.Background(), `UPDATE notification_outbox SET next_attempt_at = now()`); err != nil {
		t.Fatal(err)
	}
	if got := run(t, r, 0); got != (outbox.Result{Sent: 1}) {
		t.Errorf("run after Retry-After: %+v, want one sent", got)
	}
}

// TestRejectedPushIsParkedAndRequeued answers 400 (a member who blocked the account): the row
// is parked at once with LINE's reason, no run retries it, and an operator's requeue sends it.
func TestRejectedPushIsParkedAndRequeued(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	id := b.coupons[0]
	const reason = "Failed to send messages"
	b.stub.Script(id, linestub.Response{Status: http.StatusBadRequest, Message: reason})
	r := newRelay(t, b)

	if got := run(t, r, 0); got != (outbox.Result{Parked: 1}) {
		t.Fatalf("run 1: %+v, want one parked", got)
	}
	if s := state(t, b.pool, id); !s.parked || s.attempts != 1 ||
		!strings.Contains(s.lastError, "HTTP 400") || !strings.Contains(s.lastError, reason) {
		t.Errorf("row: %+v, want parked after 1 attempt with LINE's reason", s)
	}
	if got := run(t, r, 0); got.Rows() != 0 || b.stub.Calls(id) != 1 {
		t.Errorf("run 2: %+v, LINE saw %d calls; a parked row must not be retried", got, b.stub.Calls(id))
	}

	ctx := context.Background()
	st, err := outboxadmin.ReadStatus(ctx, b.pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	if st.Parked != 1 || len(st.ParkedRows) != 1 || st.ParkedRows[0].CouponID != id ||
		!strings.Contains(st.ParkedRows[0].LastError, reason) {
		t.Errorf("status: %+v, want the one parked row with its reason", st)
	}
	rq, err := outboxadmin.Requeue(ctx, b.pool, outboxadmin.RequeueRequest{CouponIDs: []string{id}})
	if err != nil || len(rq.Requeued) != 1 {
		t.Fatalf("Requeue: %+v, %v; want the one row", rq, err)
	}
	if got := run(t, r, 0); got != (outbox.Result{Sent: 1}) {
		t.Errorf("run after requeue: %+v, want one sent", got)
	}
}

// TestMessageNamesCouponAndValue checks the push LINE receives: addressed to the member's LINE
// user id, in Japanese, naming the campaign and the value, with the coupon id as retry key.
func TestMessageNamesCouponAndValue(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	run(t, newRelay(t, b), 0)
	pushes := b.stub.Pushes()
	if len(pushes) != 1 {
		t.Fatalf("%d pushes, want 1", len(pushes))
	}
	p := pushes[0]
	if p.RetryKey != b.coupons[0] || p.To != lineUser("m000001") ||
		!strings.Contains(p.Text, "「T」") || !strings.Contains(p.Text, "1,000円") {
		t.Errorf("push %+v: want retry key %s, to %s, campaign T and 1,000円", p, b.coupons[0], lineUser("m000001"))
	}
}

// TestMessageNeverNamesAnEarlierEnd: the push text's "有効期限：... HH:MMまで" names the last
// minute in which the coupon is valid; the end of that minute is never before the stored expiry,
// nor a minute or more after it. An expiry on the minute (00:00) names the minute before (23:59);
// one inside a minute (12:30:30, 12:30:00.5) names that minute. The broken variant, the minute
// before the expiry's own (the text before 00015), names 12:29 for 12:30:30: the check sees that.
func TestMessageNeverNamesAnEarlierEnd(t *testing.T) {
	t.Parallel()
	tokyo := issuance.Tokyo
	broken := func(exp time.Time) string {
		last := exp.Add(-time.Minute).In(tokyo)
		return fmt.Sprintf("有効期限：%d年%d月%d日 %02d:%02dまで", last.Year(), int(last.Month()), last.Day(), last.Hour(), last.Minute())
	}
	re := regexp.MustCompile(`有効期限：(\d+)年(\d+)月(\d+)日 (\d\d):(\d\d)まで`)
	// namedEnd is the end of the minute text names as the last one of validity.
	namedEnd := func(text string) time.Time {
		m := re.FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no expiry in %q", text)
		}
		n := make([]int, 5)
		for i := range n {
			n[i], _ = strconv.Atoi(m[i+1])
		}
		return time.Date(n[0], time.Month(n[1]), n[2], n[3], n[4], 0, 0, tokyo).Add(time.Minute)
	}
	for _, c := range []struct {
		exp  time.Time
		want string
	}{
		{time.Date(2026, 10, 8, 0, 0, 0, 0, tokyo), "2026年10月7日 23:59まで"},
		{time.Date(2026, 10, 8, 12, 30, 30, 0, tokyo), "2026年10月8日 12:30まで"},
		{time.Date(2026, 10, 8, 12, 30, 0, 500_000_000, tokyo), "2026年10月8日 12:30まで"},
		{time.Date(2026, 10, 8, 12, 30, 59, 999_999_000, tokyo), "2026年10月8日 12:30まで"},
	} {
		text := outbox.Message("T", 1000, &c.exp)
		end := namedEnd(text)
		if !strings.Contains(text, c.want) || end.Before(c.exp) || end.Sub(c.exp) >= time.Minute {
			t.Errorf("expiry %s: %q (valid to %s), want %q, never before the expiry nor a minute after", c.exp, text, end, c.want)
		}
		if !c.exp.Equal(c.exp.Truncate(time.Minute)) && !namedEnd(broken(c.exp)).Before(c.exp) {
			t.Errorf("expiry %s: the broken variant %q does not name an earlier end: the check would not see it", c.exp, broken(c.exp))
		}
	}
}
