package drill

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/outboxadmin"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/shared/outbox"
)

// relayPeriod is how often the drill calls RelayOutbox while the load runs, as Cloud Scheduler
// does every minute, compressed to the drill's length. Each call that fails pushes charges the
// rows it tried one attempt of RELAY_MAX_ATTEMPTS (10): a LINE outage of a few seconds costs two
// or three.
const relayPeriod = 2 * time.Second

// relayCallTimeout bounds one RelayOutbox call: the run budget the drill gives it
// ([relayEnv], 10 s) and room for the answer.
const relayCallTimeout = 15 * time.Second

// drainTimeout bounds the drain after the load: the rows a killed process had claimed come
// back after the 5 s lease, and the rest take a run or two.
const drainTimeout = 60 * time.Second

// relayEnv are the relay settings of the serving process: failed pushes are retried on the next
// run (RELAY_RETRY_BASE=0s), and a killed run's claimed rows come back after 5 s instead of 30 s
// (RELAY_LEASE), so that both happen within the drill; the batch, mark and run bounds shrink
// with the lease, as the relay requires (batch + mark < lease, batch + 2 x mark < run budget).
// The relay pushes at LINE's own limit (RELAY_RATE_LIMIT=2000, outbox.LINEPushRateLimit) rather
// than a quarter of it: the drill has one relay, and at 500 pushes/s the rows that the failed
// runs left behind make the drain long.
var relayEnv = []string{
	"RELAY_RETRY_BASE=0s", "RELAY_LEASE=5s", "RELAY_PUSH_TIMEOUT=2s", "RELAY_BATCH_TIMEOUT=3s",
	"RELAY_MARK_TIMEOUT=1s", "RELAY_RUN_BUDGET=10s", "RELAY_RATE_LIMIT=2000",
}

// relayer calls RelayOutbox and counts what it answered.
type relayer struct {
	url    string
	client *http.Client

	mu                 sync.Mutex
	runs, failed, sent int
}

func newRelayer(url string) *relayer {
	return &relayer{url: url, client: &http.Client{Timeout: relayCallTimeout}}
}

// call runs RelayOutbox once with an empty body, as Cloud Scheduler does, and returns its counts;
// a run that ended early (502), a database failure (500) or no answer is an error.
func (r *relayer) call(ctx context.Context) (outbox.Result, error) {
	var res outbox.Result
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, nil)
	if err == nil {
		var resp *http.Response
		if resp, err = r.client.Do(req); err == nil {
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("RelayOutbox: HTTP %d", resp.StatusCode)
			} else {
				err = json.NewDecoder(resp.Body).Decode(&res)
			}
			resp.Body.Close()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs++
	r.sent += res.Sent
	if err != nil {
		r.failed++
	}
	return res, err
}

// every calls RelayOutbox every relayPeriod until stop is closed; a call still running when the
// next is due delays it.
func (r *relayer) every(stop <-chan struct{}) {
	tick := time.NewTicker(relayPeriod)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			_, _ = r.call(context.Background()) // counted; failures are expected during faults
		}
	}
}

func (r *relayer) counts() (runs, failed, sent int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs, r.failed, r.sent
}

// drained is how the drain after the load ended.
type drained struct {
	runs    int
	took    time.Duration
	unsent  int64 // rows neither sent, skipped nor parked when it gave up
	parked  int64
	skipped int64
}

// drain calls RelayOutbox until no outbox row is left to send (due, waiting for a retry, or
// claimed under a lease), at most [drainTimeout].
func drain(ctx context.Context, r *relayer, pool *pgxpool.Pool) (drained, error) {
	start := time.Now()
	var d drained
	for {
		res, callErr := r.call(ctx)
		d.runs++
		st, err := outboxadmin.ReadStatus(ctx, pool, 0)
		if err != nil {
			return d, err
		}
		d.unsent, d.parked, d.skipped, d.took = st.Due+st.Waiting+st.InFlight, st.Parked, st.Skipped, time.Since(start)
		if d.unsent == 0 || d.took > drainTimeout {
			return d, nil
		}
		if callErr != nil || res.Sent+res.RetryLater+res.Parked+res.Skipped == 0 {
			// Rows under a dead run's lease, or a failed call: wait before the next run.
			if err := sleep(ctx, 250*time.Millisecond); err != nil {
				return d, err
			}
		}
	}
}

// pushed is what the LINE stand-in received, checked against the coupons.
type pushed struct {
	stats      linestub.Stats
	coupons    int
	neverSent  []string // coupons no push was accepted for
	wrongPush  []string // pushes under a key that is no coupon, or to another member, or of another coupon's text
	notLinked  int      // coupons whose member has no LINE account (the drill links every member)
	acceptedOK int      // coupons accepted exactly once
}

// couponPush is a coupon as its push should look.
type couponPush struct {
	campaign, member, lineUser string
	amountYen                  int
	expiresAt                  *time.Time
	voided                     bool // by the drill's voids: pushed before it or never, both right
}

const sqlCouponPushes = `
SELECT i.coupon_id::text, i.campaign_id, i.member_id, COALESCE(l.line_user_id, ''), i.amount_yen, i.expires_at,
       i.voided_at IS NOT NULL
  FROM issued_coupons i LEFT JOIN member_line_accounts l USING (member_id)`

// readCouponPushes reads every coupon of issued_coupons, voided ones included, as its push
// should look, by coupon id.
func readCouponPushes(ctx context.Context, pool *pgxpool.Pool) (map[string]couponPush, error) {
	rows, err := pool.Query(ctx, sqlCouponPushes)
	if err != nil {
		return nil, fmt.Errorf("drill: coupons: %w", err)
	}
	coupons := map[string]couponPush{}
	for rows.Next() {
		var id string
		var c couponPush
		if err := rows.Scan(&id, &c.campaign, &c.member, &c.lineUser, &c.amountYen, &c.expiresAt, &c.voided); err != nil {
			rows.Close()
			return nil, fmt.Errorf("drill: coupons: %w", err)
		}
		coupons[id] = c
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("drill: coupons: %w", err)
	}
	return coupons, nil
}

// checkPushes checks the stand-in's pushes against the coupons: every coupon accepted by LINE
// (at least once: the stand-in, like LINE, accepts a retry key once and answers 409 to a re-send),
// and every push carrying a coupon's id as its X-Line-Retry-Key, to that coupon's member, with
// that coupon's text, so that a re-sent coupon is a duplicate only under its own key.
func checkPushes(ctx context.Context, pool *pgxpool.Pool, stub *linestub.Stub) (pushed, error) {
	coupons, err := readCouponPushes(ctx, pool)
	if err != nil {
		return pushed{}, err
	}
	p := pushed{stats: stub.Stats()}
	accepted := stub.Accepted()
	for id, c := range coupons {
		if c.voided {
			continue // pushed before its void, or never: the relay skips a voided coupon
		}
		p.coupons++
		switch {
		case c.lineUser == "":
			p.notLinked++
		case accepted[id] == 0:
			p.neverSent = append(p.neverSent, fmt.Sprintf("coupon %s (%s, %s) was never pushed", id, c.campaign, c.member))
		case accepted[id] == 1:
			p.acceptedOK++
		}
	}
	for _, push := range stub.Pushes() {
		c, ok := coupons[push.RetryKey]
		switch {
		case !ok:
			p.wrongPush = append(p.wrongPush, fmt.Sprintf("a push under retry key %q, which names no coupon", push.RetryKey))
		case push.To != c.lineUser || push.Text != outbox.Message(c.campaign, c.amountYen, c.expiresAt):
			p.wrongPush = append(p.wrongPush, fmt.Sprintf("a push under coupon %s's retry key to %s with another coupon's text or recipient", push.RetryKey, push.To))
		}
	}
	return p, nil
}
