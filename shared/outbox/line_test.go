package outbox_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/ops/outboxadmin"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/shared/outbox"
)

// These tests put the relay against the ways the real LINE differs from a well-behaved
// stand-in (issue 12). Each names the broken behaviour it was seen red against.

func exec(t *testing.T, b bundle, sql string, args ...any) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestUnlinkedMembersAreSkipped unlinks 3 of 10 members: the 7 linked ones get their push at
// their LINE user id, the 3 others are skipped (counted, not pushed, not parked, no attempt),
// a second run leaves them alone, and once one of them links an account, requeue sends it.
// Red against pushing to the member id: LINE (the stand-in) answers 400 and all 10 are parked.
func TestUnlinkedMembersAreSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t, 10)
	exec(t, b, `DELETE FROM member_line_accounts WHERE member_id IN ('m000002', 'm000005', 'm000009')`)
	r := newRelay(t, b)

	if got := run(t, r, 0); got != (outbox.Result{Sent: 7, Skipped: 3, SkippedReasons: outbox.SkippedReasons{NoLINEAccount: 3}}) {
		t.Fatalf("run 1: %+v, want 7 sent, 3 skipped", got)
	}
	for _, p := range b.stub.Pushes() {
		var member string
		if err := b.pool.QueryRow(context.Background(),
			`SELECT member_id FROM notification_outbox WHERE coupon_id = $1`, p.RetryKey).Scan(&member); err != nil {
			t.Fatal(err)
		}
		if p.To != lineUser(member) || p.Status != http.StatusOK {
			t.Errorf("push for %s went to %q (answered %d), want %s", member, p.To, p.Status, lineUser(member))
		}
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notification_outbox
		WHERE skipped_at IS NOT NULL AND parked_at IS NULL AND attempts = 0 AND first_pushed_at IS NULL
		  AND last_error LIKE '%no LINE account%' AND member_id IN ('m000002', 'm000005', 'm000009')`); n != 3 {
		t.Errorf("%d unlinked rows skipped with the reason and no attempt, want 3", n)
	}
	if st := b.stub.Stats(); st.Requests != 7 {
		t.Errorf("LINE received %d pushes, want 7", st.Requests)
	}
	if got := run(t, r, 0); got.Rows() != 0 {
		t.Errorf("run 2: %+v, want nothing: skipped rows are not retried", got)
	}
	ctx := context.Background()
	if st, err := outboxadmin.ReadStatus(ctx, b.pool, 10); err != nil || st.Skipped != 3 || st.Sent != 7 || st.Parked != 0 {
		t.Errorf("status %+v, %v; want 7 sent, 3 skipped, 0 parked", st, err)
	}

	if err := outboxadmin.Link(ctx, b.pool, "m000005", lineUser("m000005")); err != nil {
		t.Fatal(err)
	}
	rq, err := outboxadmin.Requeue(ctx, b.pool, outboxadmin.RequeueRequest{All: true})
	if err != nil || len(rq.Requeued) != 1 || len(rq.Unlinked) != 2 {
		t.Fatalf("requeue --all: %+v, %v; want 1 requeued, 2 still unlinked", rq, err)
	}
	if got := run(t, r, 0); got != (outbox.Result{Sent: 1}) {
		t.Errorf("run after linking and requeue: %+v, want 1 sent", got)
	}
	if st := b.stub.Stats(); st.Requests != 8 || st.Accepted != 8 {
		t.Errorf("LINE stats %+v, want 8 pushes all accepted", st)
	}
}

// TestCutBodyIsSent answers 200 and drops the connection halfway through the body (checked:
// the client saw one body break off): LINE has the message, so the row is sent after one push. Red against judging by the SDK's error first:
// the row was parked as a refusal ("HTTP 200").
func TestCutBodyIsSent(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	id := b.coupons[1]
	b.stub.Script(id, linestub.Response{CutBody: true})
	cut := &bodyErrors{next: http.DefaultTransport}
	b.cfg.HTTPClient = &http.Client{Transport: cut}

	if got := run(t, newRelay(t, b), 0); got != (outbox.Result{Sent: 3}) {
		t.Fatalf("run: %+v, want 3 sent", got)
	}
	if n := cut.n.Load(); n != 1 {
		t.Errorf("%d answers' bodies broke off, want 1: the cut body was not seen", n)
	}
	if s := state(t, b.pool, id); !s.sent || s.parked || s.attempts != 1 {
		t.Errorf("cut-body row: %+v, want sent after 1 attempt", s)
	}
	if b.stub.Calls(id) != 1 || b.stub.AcceptedTimes(id) != 1 {
		t.Errorf("LINE saw %d pushes of the row, accepted %d; want 1, 1", b.stub.Calls(id), b.stub.AcceptedTimes(id))
	}
}

// TestRefusedTokenBurnsNothing answers 401 to every push: each of three runs ends at once with
// ErrTokenRefused after at most one batch, and afterwards no row is parked, charged an attempt,
// held by a lease or marked as pushed. Red against treating 401 as a refusal of the message:
// every claimed row was parked in the first run.
func TestRefusedTokenBurnsNothing(t *testing.T) {
	t.Parallel()
	const rows = 30
	b := setup(t, rows)
	b.stub.Default(linestub.Response{Status: http.StatusUnauthorized,
		Message: "Authentication failed. Confirm that the access token in the authorization header is valid."})
	r := newRelay(t, b)

	for i := range 3 {
		res, err := r.Run(context.Background(), 0)
		if !errors.Is(err, outbox.ErrTokenRefused) || res.Rows() != 0 {
			t.Errorf("run %d: %+v, %v; want nothing handled and ErrTokenRefused", i+1, res, err)
		}
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notification_outbox
		WHERE parked_at IS NULL AND sent_at IS NULL AND attempts = 0 AND claimed_by IS NULL
		  AND first_pushed_at IS NULL AND next_attempt_at <= now()`); n != rows {
		t.Errorf("%d of %d rows untouched and due, want all", n, rows)
	}
	st := b.stub.Stats()
	if st.Requests == 0 || st.Requests > 3*b.cfg.BatchSize || st.Accepted != 0 {
		t.Errorf("LINE stats %+v: want some 401s, at most one batch (%d) per run", st, b.cfg.BatchSize)
	}
	t.Logf("three runs: %d pushes answered 401, 0 rows parked, 0 attempts charged", st.Requests)

	// The token renewed, the next run sends everything.
	b.stub.Default(linestub.Response{})
	if got := run(t, r, 0); got != (outbox.Result{Sent: rows}) {
		t.Errorf("run after renewal: %+v, want %d sent", got, rows)
	}
}

// TestHangingLINEEndsRunEarly makes LINE hang: every push takes ten times the push timeout. After five
// timeouts in a row the run ends with ErrLINEUnavailable, the rows it did not push come back
// due and untouched, and the attempts charged equal the pushes LINE received. Red against the
// relay without a breaker: it pushed (and charged) all 30 rows, one timeout each.
func TestHangingLINEEndsRunEarly(t *testing.T) {
	t.Parallel()
	const rows = 30
	b := setup(t, rows)
	b.cfg.BreakerFailures = 5
	b.stub.Default(linestub.Response{Delay: 10 * b.cfg.PushTimeout})
	r := newRelay(t, b)

	res, err := r.Run(context.Background(), 0)
	if !errors.Is(err, outbox.ErrLINEUnavailable) {
		t.Errorf("run: %v, want ErrLINEUnavailable", err)
	}
	if res.Sent != 0 || res.Parked != 0 || res.RetryLater >= rows {
		t.Errorf("run: %+v, want only some rows retried later", res)
	}
	// The stand-in records a push when it gives up on it (after at most its Delay): closing the
	// server waits for the requests in flight.
	b.srv.Close()
	pushes := b.stub.Stats().Requests
	if pushes == 0 {
		t.Fatal("LINE received no push: the hang was never seen")
	}
	attempts := count(t, b.pool, `SELECT coalesce(sum(attempts), 0) FROM notification_outbox`)
	if attempts != pushes || attempts != res.RetryLater {
		t.Errorf("%d attempts charged, %d pushes received, %d rows retried later; want all equal", attempts, pushes, res.RetryLater)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notification_outbox WHERE claimed_by IS NOT NULL`); n != 0 {
		t.Errorf("%d rows still held by the run", n)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notification_outbox
		WHERE attempts = 0 AND first_pushed_at IS NULL AND next_attempt_at <= now()`); n != rows-res.RetryLater {
		t.Errorf("%d rows back due and untouched, want %d", n, rows-res.RetryLater)
	}
	t.Logf("run: %+v; %d pushes sent of %d rows; %d rows given back", res, pushes, rows, rows-res.RetryLater)
}

// TestExpiredRetryKeyIsNotResent gives one row a first push 25 hours ago and another one an
// hour ago: the run re-sends only the second and parks the first with the reason; requeue
// refuses the first without force and sends it with force. Red against the relay without the
// window: both rows were re-sent.
func TestExpiredRetryKeyIsNotResent(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	old, recent := b.coupons[0], b.coupons[1]
	exec(t, b, `UPDATE notification_outbox SET attempts = 3, last_error = 'LINE push: HTTP 500',
		first_pushed_at = now() - CASE coupon_id WHEN $1::uuid THEN interval '25 hours' ELSE interval '1 hour' END`, old)
	r := newRelay(t, b)

	if got := run(t, r, 0); got != (outbox.Result{Sent: 1, Parked: 1}) {
		t.Fatalf("run: %+v, want 1 sent, 1 parked", got)
	}
	if s := state(t, b.pool, old); !s.parked || s.attempts != 3 || !strings.Contains(s.lastError, "24 hours") {
		t.Errorf("old row: %+v, want parked, no new attempt, the 24-hour reason", s)
	}
	if b.stub.Calls(old) != 0 || b.stub.Calls(recent) != 1 {
		t.Errorf("LINE saw %d pushes of the old row and %d of the recent one, want 0 and 1", b.stub.Calls(old), b.stub.Calls(recent))
	}

	ctx := context.Background()
	rq, err := outboxadmin.Requeue(ctx, b.pool, outboxadmin.RequeueRequest{CouponIDs: []string{old}})
	if err != nil || len(rq.Requeued) != 0 || len(rq.KeyExpired) != 1 || !state(t, b.pool, old).parked {
		t.Fatalf("requeue without force: %+v, %v; want refused as key expired, still parked", rq, err)
	}
	if rq, err = outboxadmin.Requeue(ctx, b.pool, outboxadmin.RequeueRequest{CouponIDs: []string{old}, Force: true}); err != nil || len(rq.Requeued) != 1 {
		t.Fatalf("requeue --force: %+v, %v; want requeued", rq, err)
	}
	if got := run(t, r, 0); got != (outbox.Result{Sent: 1}) || b.stub.Calls(old) != 1 {
		t.Errorf("run after forced requeue: %+v, LINE saw %d pushes; want 1 sent, 1 push", got, b.stub.Calls(old))
	}
}

// TestRetentionDeletesOnlyOldClosedRows closes rows at various ages and prunes them with the
// default 30-day retention, one row per statement: only sent and skipped rows closed more than
// 30 days ago go; open, parked and recent rows stay. A relay run deletes nothing: the prune is
// the operator's daily job (coupon_relay may not delete). Red while the run pruned: 4 rows left.
func TestRetentionDeletesOnlyOldClosedRows(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	c := b.coupons
	exec(t, b, `UPDATE notification_outbox SET sent_at = now() - interval '31 days' WHERE coupon_id IN ($1, $2)`, c[0], c[1])
	exec(t, b, `UPDATE notification_outbox SET sent_at = now() - interval '29 days' WHERE coupon_id = $1`, c[2])
	exec(t, b, `UPDATE notification_outbox SET skipped_at = now() - interval '40 days' WHERE coupon_id = $1`, c[3])
	exec(t, b, `UPDATE notification_outbox SET skipped_at = now() - interval '1 day' WHERE coupon_id = $1`, c[4])
	exec(t, b, `UPDATE notification_outbox SET parked_at = now() - interval '90 days' WHERE coupon_id = $1`, c[5])
	exec(t, b, `UPDATE notification_outbox SET created_at = now() - interval '90 days',
		next_attempt_at = now() + interval '1 hour' WHERE coupon_id IN ($1, $2)`, c[6], c[7])

	ctx := context.Background()
	var deleted []int64
	for {
		n, err := outbox.Prune(ctx, b.pool, outbox.DefaultRetention, 1)
		if err != nil {
			t.Fatal(err)
		}
		if deleted = append(deleted, n); n == 0 {
			break
		}
	}
	if len(deleted) != 4 {
		t.Errorf("prune batches deleted %v, want 1, 1, 1, 0", deleted)
	}
	var left []string
	rows, err := b.pool.Query(ctx, `SELECT coupon_id::text FROM notification_outbox ORDER BY member_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if want := []string{c[2], c[4], c[5], c[6], c[7]}; strings.Join(left, " ") != strings.Join(want, " ") {
		t.Errorf("rows left %v, want %v (rows 3, 5, 6, 7, 8)", left, want)
	}

	// A run does not prune: the recent sent row, aged, stays through the next run.
	exec(t, b, `UPDATE notification_outbox SET sent_at = now() - interval '31 days' WHERE coupon_id = $1`, c[2])
	if got := run(t, newRelay(t, b), 0); got.Rows() != 0 {
		t.Errorf("run: %+v, want nothing due", got)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notification_outbox`); n != 5 {
		t.Errorf("%d rows after the run, want 5 (a run deletes nothing)", n)
	}
}

// TestBatchEndsWithinItsBound makes every mark statement take 400 ms inside PostgreSQL (a
// trigger, whose firings are counted) and
// pushes 10 rows one at a time with a 1 s batch timeout and a 1 s mark timeout: the marks share
// the batch's deadline (start + 2 s), so the run gives up on the rows it cannot record in
// time and leaves them to their lease, and the rows it never pushed are given back without an
// attempt. Red against a fresh mark timeout per row: all 10 rows were marked, the last ones
// charged an attempt without a push, the batch lasting about 4 s.
func TestBatchEndsWithinItsBound(t *testing.T) {
	t.Parallel()
	const rows = 10
	b := setup(t, rows)
	b.cfg.Parallelism = 1
	b.cfg.BatchTimeout = time.Second
	b.cfg.MarkTimeout = time.Second
	exec(t, b, `
CREATE SEQUENCE slow_marks;
CREATE FUNCTION slow_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('slow_marks');
  PERFORM pg_sleep(0.4);
  RETURN NEW;
END $$;
CREATE TRIGGER slow_mark BEFORE UPDATE ON notification_outbox
  FOR EACH ROW WHEN (OLD.claimed_by IS NOT NULL AND NEW.claimed_by IS NULL)
  EXECUTE FUNCTION slow_mark();`)

	res := run(t, newRelay(t, b), rows)
	if firings(t, b.pool, "slow_marks") == 0 {
		t.Fatal("no mark was slowed: the injected fault did not fire")
	}
	held := count(t, b.pool, `SELECT count(*) FROM notification_outbox WHERE claimed_by IS NOT NULL`)
	if held == 0 {
		t.Errorf("every row was recorded: the marks outlived the batch's deadline")
	}
	pushed := b.stub.Stats().Requests
	if attempts := count(t, b.pool, `SELECT coalesce(sum(attempts), 0) FROM notification_outbox`); attempts > pushed {
		t.Errorf("%d attempts charged for %d pushes", attempts, pushed)
	}
	t.Logf("run %+v; %d pushes; %d rows left to their lease", res, pushed, held)
}

// bodyErrors is a transport that counts the answers whose body broke off (a read error other
// than EOF), once per answer.
type bodyErrors struct {
	next http.RoundTripper
	n    atomic.Int32
}

func (c *bodyErrors) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := c.next.RoundTrip(req)
	if err == nil {
		res.Body = &countedBody{ReadCloser: res.Body, n: &c.n}
	}
	return res, err
}

type countedBody struct {
	io.ReadCloser
	n       *atomic.Int32
	counted bool
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && !b.counted {
		b.counted = true
		b.n.Add(1)
	}
	return n, err
}
