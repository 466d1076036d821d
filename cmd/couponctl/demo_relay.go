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

// demoRelay drains the outbox through RelayOutbox, served at functionsBaseURL, into a local
// LINE stand-in on loopback, and reports from the stand-in and the table: pushes received,
// distinct retry keys, coupons pushed exactly once, lost (outbox rows unsent) and parked.
// RelayOutbox reads its configuration on its first request, so the stand-in is started and
// LINE_API_BASE_URL, LINE_CHANNEL_ACCESS_TOKEN and RELAY_RETRY_BASE=0s are set before it.
//
// It returns errViolations if any coupon was not accepted by LINE exactly once, or any outbox
// row is left unsent or parked.
func demoRelay(ctx context.Context, w io.Writer, pool *pgxpool.Pool, functionsBaseURL string) error {
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

	rows, err := pool.Query(ctx, `SELECT coupon_id::text FROM notification_outbox ORDER BY coupon_id LIMIT $1`, len(demoInjected))
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
		st, err := outbox.Status(ctx, pool, 0)
		if err != nil {
			return err
		}
		left := st.Due + st.Waiting + st.InFlight
		fmt.Fprintf(w, "  run %d: sent %d, retry_later %d, parked %d; outbox rows left %d\n",
			run, res.Sent, res.RetryLater, res.Parked, left)
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

	st, err := outbox.Status(ctx, pool, 0)
	if err != nil {
		return err
	}
	var coupons []string
	if rows, err = pool.Query(ctx, `SELECT coupon_id::text FROM issued_coupons`); err == nil {
		coupons, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return err
	}
	accepted := stub.Accepted()
	once := 0
	for _, id := range coupons {
		if accepted[id] == 1 {
			once++
		}
	}
	stats := stub.Stats()
	lost := st.Due + st.Waiting + st.InFlight
	fmt.Fprintf(w, "  requests received by LINE    %6d (%d answered with injected failures, %d with 409 already accepted)\n",
		stats.Requests, stats.Failed, stats.Conflicts)
	fmt.Fprintf(w, "  pushes accepted              %6d in %s (%.0f rows/s)\n",
		stats.Accepted, elapsed.Round(time.Millisecond), float64(total.Sent)/elapsed.Seconds())
	fmt.Fprintf(w, "  distinct retry keys          %6d\n", stats.Keys)
	fmt.Fprintf(w, "  coupons pushed exactly once  %6d of %d\n", once, len(coupons))
	fmt.Fprintf(w, "  lost (outbox rows unsent)    %6d\n", lost)
	fmt.Fprintf(w, "  parked                       %6d\n", st.Parked)

	var failures []string
	if once != len(coupons) || stats.Accepted != len(coupons) {
		failures = append(failures, fmt.Sprintf("%d of %d coupons pushed exactly once, %d pushes accepted",
			once, len(coupons), stats.Accepted))
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
	fmt.Fprintln(w, "  every coupon pushed to LINE exactly once; none lost, none parked")
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
