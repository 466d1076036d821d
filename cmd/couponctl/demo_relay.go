package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/outboxadmin"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/shared/outbox"
)

// demoRelayMaxRuns bounds the demo's drain loop, in RelayOutbox calls: one run takes up to
// outbox.DefaultMaxRows rows, and the injected failures need a second run (and a third, for a
// 429 whose Retry-After has not passed yet).
const demoRelayMaxRuns = 20

// demoInjected are the failures the demo's LINE stand-in answers to the first request of a few
// coupons, so that the report shows the retry path: each is retried by a later run with the
// same retry key and must still end up accepted exactly once.
var demoInjected = []linestub.Response{
	{Status: http.StatusInternalServerError, Message: "demo: injected outage"},
	{Status: http.StatusInternalServerError, Message: "demo: injected outage"},
	{Status: http.StatusServiceUnavailable, Message: "demo: injected outage"},
	{Status: http.StatusTooManyRequests, RetryAfter: "1", Message: "demo: injected rate limit"},
	{Status: http.StatusTooManyRequests, RetryAfter: "1", Message: "demo: injected rate limit"},
}

// demoAppOnlyEvery makes every n-th member (in member id order) app-only: no LINE account is
// linked for them, so their coupons are skipped rather than pushed, as for the many members
// who use only the app.
const demoAppOnlyEvery = 10

// sqlDemoLink links every member who holds a coupon, except every demoAppOnlyEvery-th, to a LINE
// user id made from the member id ("U" + md5 in hex: the format LINE uses, unique per member).
const sqlDemoLink = `
INSERT INTO member_line_accounts (member_id, line_user_id)
SELECT member_id, 'U' || md5(member_id)
  FROM (SELECT member_id, row_number() OVER (ORDER BY member_id) AS n
          FROM (SELECT DISTINCT member_id FROM issued_coupons) m) m
 WHERE n % $1 <> 0
ON CONFLICT (member_id) DO NOTHING`

// lineStandIn is the local LINE Messaging API the demo's RelayOutbox pushes to.
type lineStandIn struct {
	stub *linestub.Stub
	srv  *http.Server
	addr string
	url  string
}

// startLineStandIn serves a LINE stand-in on a free loopback port.
func startLineStandIn() (*lineStandIn, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &lineStandIn{stub: linestub.New(), addr: l.Addr().String(), url: "http://" + l.Addr().String()}
	s.srv = &http.Server{Handler: s.stub, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(l) }() // ends with close
	return s, nil
}

func (s *lineStandIn) close() { _ = s.srv.Close() }

// relayStage is the demo's relay stage: what it drained and what it then found.
type relayStage struct {
	runs    outbox.Result // summed over the runs: Sent and Skipped
	elapsed time.Duration
	status  outboxadmin.Status
	// linked and appOnly count the coupons of members with and without a LINE account; once
	// those pushed exactly once, appOnlyPushed the pushes received for app-only ones.
	linked, once, appOnly, appOnlyPushed int
	line                                 linestub.Stats
}

// demoRelay links most members to a LINE user id and leaves every demoAppOnlyEvery-th app-only,
// drains the outbox through RelayOutbox, served at functionsBaseURL, into line, and reports
// from the stand-in and the table: pushes received, distinct retry keys, linked members'
// coupons pushed exactly once, app-only members' coupons skipped, lost (outbox rows unsent) and
// parked. It reports false if any linked member's coupon was not accepted by LINE exactly once,
// any app-only member's coupon was pushed or not skipped, or any outbox row is left unsent or
// parked.
func demoRelay(ctx context.Context, w io.Writer, pool *pgxpool.Pool, line *lineStandIn, functionsBaseURL string) (bool, error) {
	victims, err := prepareRelay(ctx, pool, line)
	if err != nil {
		return false, err
	}
	fmt.Fprintf(w, "\nRelay (RelayOutbox -> local LINE stand-in at %s; %d first pushes answered with injected 5xx/429):\n",
		line.addr, victims)
	fmt.Fprintln(w, "  (on purpose: the failed pushes are retried by later runs with the same retry key, and the\n"+
		"  429s carry Retry-After: 1, so the last runs wait about a second, as the relay waits for LINE)")
	var st relayStage
	if err := st.drain(ctx, w, pool, functionsBaseURL+"/RelayOutbox"); err != nil {
		return false, err
	}
	if err := st.count(ctx, pool, line.stub); err != nil {
		return false, err
	}
	st.write(w)
	return st.verdict(w), nil
}

// prepareRelay links the members and scripts the injected failures on the first coupons of
// linked members; it returns how many it scripted.
func prepareRelay(ctx context.Context, pool *pgxpool.Pool, line *lineStandIn) (int, error) {
	if _, err := pool.Exec(ctx, sqlDemoLink, demoAppOnlyEvery); err != nil {
		return 0, fmt.Errorf("linking members to LINE: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT coupon_id::text FROM notification_outbox
		JOIN member_line_accounts USING (member_id) ORDER BY coupon_id LIMIT $1`, len(demoInjected))
	if err != nil {
		return 0, err
	}
	victims, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, err
	}
	for i, id := range victims {
		line.stub.Script(id, demoInjected[i])
	}
	return len(victims), nil
}

// drain calls RelayOutbox, as Cloud Scheduler would, until no outbox row is left to relay or
// [demoRelayMaxRuns] runs, one line per run, waiting a moment when a run found nothing due.
func (st *relayStage) drain(ctx context.Context, w io.Writer, pool *pgxpool.Pool, url string) error {
	client := &http.Client{Timeout: 2 * time.Minute}
	started := time.Now()
	defer func() { st.elapsed = time.Since(started) }()
	waited := false
	for run := 1; run <= demoRelayMaxRuns; run++ {
		res, err := postRelay(ctx, client, url)
		if err != nil {
			return fmt.Errorf("relay run %d: %w", run, err)
		}
		st.runs.Sent += res.Sent
		st.runs.Skipped += res.Skipped
		left, err := rowsLeft(ctx, pool)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  run %d: sent %d, retry_later %d, parked %d, skipped %d; outbox rows left %d\n",
			run, res.Sent, res.RetryLater, res.Parked, res.Skipped, left)
		if left == 0 {
			return nil
		}
		if res.Rows() > 0 {
			continue
		}
		if !waited { // the rows left wait for a Retry-After or a lease
			fmt.Fprintln(w, "  waiting for the injected Retry-After before the next run...")
			waited = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return nil
}

// rowsLeft counts the outbox rows still to relay: due, waiting for a retry, or leased.
func rowsLeft(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	st, err := outboxadmin.ReadStatus(ctx, pool, 0)
	return st.Due + st.Waiting + st.InFlight, err
}

// count reads what the relay left in the table and what the stand-in received, per coupon.
func (st *relayStage) count(ctx context.Context, pool *pgxpool.Pool, stub *linestub.Stub) error {
	var err error
	if st.status, err = outboxadmin.ReadStatus(ctx, pool, 0); err != nil {
		return err
	}
	type coupon struct {
		id     string
		linked bool
	}
	rows, err := pool.Query(ctx, `SELECT coupon_id::text, l.member_id IS NOT NULL FROM issued_coupons
		LEFT JOIN member_line_accounts l USING (member_id)`)
	if err != nil {
		return err
	}
	coupons, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (c coupon, err error) {
		return c, row.Scan(&c.id, &c.linked)
	})
	if err != nil {
		return err
	}
	accepted := stub.Accepted()
	for _, c := range coupons {
		if !c.linked {
			st.appOnly++
			st.appOnlyPushed += stub.Calls(c.id)
			continue
		}
		st.linked++
		if accepted[c.id] == 1 {
			st.once++
		}
	}
	st.line = stub.Stats()
	return nil
}

func (st *relayStage) lost() int64 { return st.status.Due + st.status.Waiting + st.status.InFlight }

// write prints the stage's figures.
func (st *relayStage) write(w io.Writer) {
	fmt.Fprintf(w, "  requests received by LINE    %6d (%d answered with injected failures, %d with 409 already accepted)\n",
		st.line.Requests, st.line.Failed, st.line.Conflicts)
	fmt.Fprintf(w, "  pushes accepted              %6d in %s (%.0f rows/s)\n",
		st.line.Accepted, st.elapsed.Round(time.Millisecond), float64(st.runs.Sent)/st.elapsed.Seconds())
	fmt.Fprintf(w, "  distinct retry keys          %6d\n", st.line.Keys)
	fmt.Fprintf(w, "  coupons pushed exactly once  %6d of %d (members with a LINE account)\n", st.once, st.linked)
	fmt.Fprintf(w, "  skipped (app-only members)   %6d of %d (pushes received for them: %d)\n",
		st.status.Skipped, st.appOnly, st.appOnlyPushed)
	fmt.Fprintf(w, "  lost (outbox rows unsent)    %6d\n", st.lost())
	fmt.Fprintf(w, "  parked                       %6d\n", st.status.Parked)
}

// verdict prints and reports whether every linked coupon was accepted exactly once, every
// app-only one skipped and never pushed, and no row is left unsent or parked.
func (st *relayStage) verdict(w io.Writer) bool {
	var failures []string
	if st.once != st.linked || st.line.Accepted != st.linked {
		failures = append(failures, fmt.Sprintf("%d of %d linked members' coupons pushed exactly once, %d pushes accepted",
			st.once, st.linked, st.line.Accepted))
	}
	if int(st.status.Skipped) != st.appOnly || int(st.runs.Skipped) != st.appOnly || st.appOnlyPushed != 0 {
		failures = append(failures, fmt.Sprintf("%d of %d app-only coupons skipped (runs reported %d), %d pushed",
			st.status.Skipped, st.appOnly, st.runs.Skipped, st.appOnlyPushed))
	}
	if n := st.lost(); n > 0 {
		failures = append(failures, fmt.Sprintf("%d outbox rows still unsent after %d runs", n, demoRelayMaxRuns))
	}
	if st.status.Parked > 0 {
		failures = append(failures, fmt.Sprintf("%d outbox rows parked (couponctl outbox status lists why)", st.status.Parked))
	}
	if len(failures) > 0 {
		fmt.Fprintf(w, "  RELAY FAILED:\n    %s\n", strings.Join(failures, "\n    "))
		return false
	}
	fmt.Fprintln(w, "  every linked member's coupon pushed to LINE exactly once, every app-only one skipped; none lost, none parked")
	return true
}

// postRelay calls RelayOutbox once with an empty body, as Cloud Scheduler does, and returns its
// counts.
func postRelay(ctx context.Context, client *http.Client, url string) (outbox.Result, error) {
	var res outbox.Result
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return res, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return res, fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return res, errors.Join(errors.New("RelayOutbox answer is not JSON"), err)
	}
	return res, nil
}
