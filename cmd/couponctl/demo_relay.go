package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/linestub"
	"github.com/mops/coupon-api/internal/outboxadmin"
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

// demoRelay links most members to a LINE user id and leaves every demoAppOnlyEvery-th app-only,
// drains the outbox through RelayOutbox, served at functionsBaseURL, into a local LINE stand-in
// on loopback, and reports from the stand-in and the table: pushes received, distinct retry
// keys, linked members' coupons pushed exactly once, app-only members' coupons skipped, lost
// (outbox rows unsent) and parked. RelayOutbox reads its configuration on its first request,
// so the stand-in is started and LINE_API_BASE_URL, LINE_CHANNEL_ACCESS_TOKEN and
// RELAY_RETRY_BASE=0s are set before it.
//
// It returns errViolations if any linked member's coupon was not accepted by LINE exactly once,
// any app-only member's coupon was pushed or not skipped, or any outbox row is left unsent or
// parked.
func demoRelay(ctx context.Context, w io.Writer, pool *pgxpool.Pool, functionsBaseURL string) error {
	if _, err := pool.Exec(ctx, sqlDemoLink, demoAppOnlyEvery); err != nil {
		return fmt.Errorf("linking members to LINE: %w", err)
	}
	stub := linestub.New()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: stub, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }() // ends with Close below
	defer srv.Close()
	os.Setenv("LINE_API_BASE_URL", "http://"+l.Addr().String())
	os.Setenv("LINE_CHANNEL_ACCESS_TOKEN", "demo-channel-access-token")
	os.Setenv("RELAY_RETRY_BASE", "0s")

	rows, err := pool.Query(ctx, `SELECT coupon_id::text FROM notification_outbox
		JOIN member_line_accounts USING (member_id) ORDER BY coupon_id LIMIT $1`, len(demoInjected))
	if err != nil {
		return err
	}
	victims, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for i, id := range victims {
		stub.Script(id, demoInjected[i])
	}

	fmt.Fprintf(w, "\nRelay (RelayOutbox -> local LINE stand-in at %s; %d first pushes answered with injected 5xx/429):\n",
		l.Addr(), len(victims))
	fmt.Fprintln(w, "  (on purpose: the failed pushes are retried by later runs with the same retry key, and the\n"+
		"  429s carry Retry-After: 1, so the last runs wait about a second, as the relay waits for LINE)")
	client := &http.Client{Timeout: 2 * time.Minute}
	started := time.Now()
	var total outbox.Result
	waited := false
	for run := 1; ; run++ {
		res, err := postRelay(ctx, client, functionsBaseURL+"/RelayOutbox")
		if err != nil {
			return fmt.Errorf("relay run %d: %w", run, err)
		}
		total.Sent += res.Sent
		total.Skipped += res.Skipped
		st, err := outboxadmin.ReadStatus(ctx, pool, 0)
		if err != nil {
			return err
		}
		left := st.Due + st.Waiting + st.InFlight
		fmt.Fprintf(w, "  run %d: sent %d, retry_later %d, parked %d, skipped %d; outbox rows left %d\n",
			run, res.Sent, res.RetryLater, res.Parked, res.Skipped, left)
		if left == 0 || run == demoRelayMaxRuns {
			break
		}
		if res.Rows() == 0 { // the rows left wait for a Retry-After or a lease
			if !waited {
				fmt.Fprintln(w, "  waiting for the injected Retry-After before the next run...")
				waited = true
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	elapsed := time.Since(started)

	st, err := outboxadmin.ReadStatus(ctx, pool, 0)
	if err != nil {
		return err
	}
	type coupon struct {
		id     string
		linked bool
	}
	var coupons []coupon
	if rows, err = pool.Query(ctx, `SELECT coupon_id::text, l.member_id IS NOT NULL FROM issued_coupons
		LEFT JOIN member_line_accounts l USING (member_id)`); err == nil {
		coupons, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (c coupon, err error) {
			return c, row.Scan(&c.id, &c.linked)
		})
	}
	if err != nil {
		return err
	}
	accepted := stub.Accepted()
	linked, once, appOnly, appOnlyPushed := 0, 0, 0, 0
	for _, c := range coupons {
		switch {
		case c.linked:
			linked++
			if accepted[c.id] == 1 {
				once++
			}
		default:
			appOnly++
			appOnlyPushed += stub.Calls(c.id)
		}
	}
	stats := stub.Stats()
	lost := st.Due + st.Waiting + st.InFlight
	fmt.Fprintf(w, "  requests received by LINE    %6d (%d answered with injected failures, %d with 409 already accepted)\n",
		stats.Requests, stats.Failed, stats.Conflicts)
	fmt.Fprintf(w, "  pushes accepted              %6d in %s (%.0f rows/s)\n",
		stats.Accepted, elapsed.Round(time.Millisecond), float64(total.Sent)/elapsed.Seconds())
	fmt.Fprintf(w, "  distinct retry keys          %6d\n", stats.Keys)
	fmt.Fprintf(w, "  coupons pushed exactly once  %6d of %d (members with a LINE account)\n", once, linked)
	fmt.Fprintf(w, "  skipped (app-only members)   %6d of %d (pushes received for them: %d)\n", st.Skipped, appOnly, appOnlyPushed)
	fmt.Fprintf(w, "  lost (outbox rows unsent)    %6d\n", lost)
	fmt.Fprintf(w, "  parked                       %6d\n", st.Parked)

	var failures []string
	if once != linked || stats.Accepted != linked {
		failures = append(failures, fmt.Sprintf("%d of %d linked members' coupons pushed exactly once, %d pushes accepted",
			once, linked, stats.Accepted))
	}
	if int(st.Skipped) != appOnly || int(total.Skipped) != appOnly || appOnlyPushed != 0 {
		failures = append(failures, fmt.Sprintf("%d of %d app-only coupons skipped (runs reported %d), %d pushed",
			st.Skipped, appOnly, total.Skipped, appOnlyPushed))
	}
	if lost > 0 {
		failures = append(failures, fmt.Sprintf("%d outbox rows still unsent after %d runs", lost, demoRelayMaxRuns))
	}
	if st.Parked > 0 {
		failures = append(failures, fmt.Sprintf("%d outbox rows parked (couponctl outbox status lists why)", st.Parked))
	}
	if len(failures) > 0 {
		fmt.Fprintf(w, "  RELAY FAILED:\n    %s\n", strings.Join(failures, "\n    "))
		return errViolations
	}
	fmt.Fprintln(w, "  every linked member's coupon pushed to LINE exactly once, every app-only one skipped; none lost, none parked")
	return nil
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
