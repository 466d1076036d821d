package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/functions/relay"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/bodywait"
	"github.com/mops/coupon-api/internal/testkit/localpg"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/lifecycle"
)

// TestServeChecksThenServesThenStops: serve refuses to start against a closed port and against
// an unmigrated database (naming couponctl migrate), never saying "serving"; against a migrated
// one it prints the effective settings once, serves, and on its context's end (SIGTERM) stops
// and returns nil.
func TestServeChecksThenServesThenStops(t *testing.T) {
	ctx := context.Background()
	srv, err := localpg.Start(ctx, localpg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	t.Setenv("FUNCTION_TARGET", "IssueCoupon")
	t.Setenv("DB_POOL_MAX_CONNS", "6")

	for _, tc := range []struct{ name, url, want string }{
		{"closed port", "postgres://postgres@127.0.0.1:" + proctest.FreePort(t) + "/postgres?sslmode=disable", "database unreachable"},
		{"unmigrated", srv.URL(), "couponctl migrate"},
	} {
		t.Setenv("DATABASE_URL", tc.url)
		t.Setenv("PORT", proctest.FreePort(t))
		var out bytes.Buffer
		cmd := rootCmd()
		cmd.SetArgs([]string{"serve"})
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		err := cmd.ExecuteContext(ctx)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(out.String(), "serving") {
			t.Errorf("%s: %v, output %q; want an error saying %q and no serving", tc.name, err, out.String(), tc.want)
		}
	}

	if _, err := schema.MigrateURL(ctx, srv.URL()); err != nil {
		t.Fatal(err)
	}
	pool, closePool, err := db.Open(ctx, db.Config{DatabaseURL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer closePool()
	if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "SERVE", DiscountYen: 500, BudgetYen: 10_000}); err != nil {
		t.Fatal(err)
	}
	port := proctest.FreePort(t)
	t.Setenv("DATABASE_URL", srv.URL())
	t.Setenv("PORT", port)
	var out syncbuf.Buffer
	cmd := rootCmd()
	cmd.SetArgs([]string{"serve"})
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	serveCtx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- cmd.ExecuteContext(serveCtx) }()
	proctest.WaitServing(t, port, &out)
	resp, err := http.Post("http://127.0.0.1:"+port+"/", "application/json",
		strings.NewReader(`{"member_id": "m1", "campaign_id": "SERVE"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("POST: %s, want 201", resp.Status)
	}
	stop()
	if err := <-served; err != nil {
		t.Errorf("serve after its context ended: %v, want nil", err)
	}
	for _, want := range []string{"pool_max_conns=6", "budget=2.5s", "IssueCoupon: serving", "shut down cleanly"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output does not say %q:\n%s", want, out.String())
		}
	}
}

// TestServeBothAnswersJSONEverywhere: with FUNCTION_TARGET unset, serve serves every function
// at /IssueCoupon, /RelayOutbox and /RedeemCoupon, and any other path answers 404 in the
// functions' JSON (INVALID_REQUEST, saying where they are), not Go's plain text.
func TestServeBothAnswersJSONEverywhere(t *testing.T) {
	port := serveBoth(t)
	for _, c := range []struct {
		method, path string
		status       int
		result       string
	}{
		{http.MethodPost, "/IssueCoupon", http.StatusBadRequest, "INVALID_REQUEST"},  // an empty object
		{http.MethodPost, "/RedeemCoupon", http.StatusBadRequest, "INVALID_REQUEST"}, // an empty object
		{http.MethodGet, "/", http.StatusNotFound, "INVALID_REQUEST"},
		{http.MethodPost, "/issuecoupon", http.StatusNotFound, "INVALID_REQUEST"},
		{http.MethodPost, "/IssueCoupon/x", http.StatusNotFound, "INVALID_REQUEST"},
	} {
		req, _ := http.NewRequest(c.method, "http://127.0.0.1:"+port+c.path, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Result, Message string }
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != c.status || body.Result != c.result || body.Message == "" {
			t.Errorf("%s %s: %s %+v (%v), want %d %s in JSON with a message", c.method, c.path, resp.Status, body, err, c.status, c.result)
		}
		if c.status == http.StatusNotFound && !strings.Contains(body.Message, "/RedeemCoupon") {
			t.Errorf("%s %s: %q does not say where the functions are", c.method, c.path, body.Message)
		}
	}
}

// TestStuckClientDoesNotHoldTheShutdown: a client sends IssueCoupon its headers and part of its
// body, then nothing. Serve is stopped while that request is in flight: the body's read timeout
// ends it inside the drain (the client gets 400 saying so), and serve returns nil, as a clean
// SIGTERM exits 0.
func TestStuckClientDoesNotHoldTheShutdown(t *testing.T) {
	port, stop := serveBothStoppable(t)
	c, err := net.Dial("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST /IssueCoupon HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Content-Length: 100\r\n\r\n{\"member_id\": "); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if n := issue.Function.InFlight(); n != 1 {
			return fmt.Errorf("IssueCoupon serves %d requests, want the stuck one", n)
		}
		return nil
	})
	if err := stop(); err != nil {
		t.Errorf("serve, stopped with a stuck client: %v, want nil", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(pgtest.PollTimeout)) // no answer fails the test, never hangs it
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the stuck client got no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "did not arrive") {
		t.Errorf("the stuck client got %s %s, want 400 saying the body did not arrive", resp.Status, b)
	}
}

// serveBoth runs serve for the test with FUNCTION_TARGET unset, on a migrated database, and
// returns its port once it accepts connections; it is stopped when the test ends.
func serveBoth(t *testing.T) string {
	t.Helper()
	port, stop := serveBothStoppable(t)
	t.Cleanup(func() { _ = stop() })
	return port
}

// serveBothStoppable is serveBoth with the function that stops serve and returns its error.
func serveBothStoppable(t *testing.T) (string, func() error) {
	t.Helper()
	t.Setenv("DATABASE_URL", pgtest.URL(t))
	t.Setenv("FUNCTION_TARGET", "")
	t.Setenv("LINE_CHANNEL_ACCESS_TOKEN", "test-token")
	t.Setenv("LINE_API_BASE_URL", "http://127.0.0.1:9")
	port := proctest.FreePort(t)
	t.Setenv("PORT", port)
	var out syncbuf.Buffer
	cmd := rootCmd()
	cmd.SetArgs([]string{"serve"})
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- cmd.ExecuteContext(ctx) }()
	proctest.WaitServing(t, port, &out)
	var once sync.Once
	var err error
	return port, func() error {
		once.Do(func() {
			cancel()
			err = <-served
		})
		return err
	}
}

// TestHeaderDecidedAnswersDoNotWaitForTheBody: clients send serve their headers, announcing a
// body, and then nothing. Each answer decided by the headers (405, 415, 413 by Content-Length),
// of either function, reaches its client while it still stalls, says Connection: close, and
// the server closes the connection. With those clients still connected, serve stops cleanly
// (nil: SIGTERM exits 0). The broken variant, the answers without reqbody.SkipBody
// (answersAfterTheBody), holds each answer until the body it never gets, and with them the
// drain: the check finds both.
func TestHeaderDecidedAnswersDoNotWaitForTheBody(t *testing.T) {
	checkAndBreak(t, headerDecidedCheck, answersAfterTheBody)
}

// headerDecidedCheck is TestHeaderDecidedAnswersDoNotWaitForTheBody's check: it records in v
// each stalled client that gets no answer, or one not closed after it, and a serve that does not
// stop cleanly. Every client is connected and stalled before any answer is read.
func headerDecidedCheck(t *testing.T, v *verdict) {
	port, stop := serveBothStoppable(t)
	type stall struct {
		fn, method, headers string
		status              int
		s                   *proctest.Stalled
	}
	stalls := []stall{
		{"IssueCoupon", "GET", "Content-Type: application/json\r\nContent-Length: 100", http.StatusMethodNotAllowed, nil},
		{"IssueCoupon", "POST", "Content-Type: text/plain\r\nContent-Length: 100", http.StatusUnsupportedMediaType, nil},
		{"IssueCoupon", "POST", "Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: 100", http.StatusUnsupportedMediaType, nil},
		{"IssueCoupon", "POST", "Content-Type: application/json\r\nContent-Length: 5000", http.StatusRequestEntityTooLarge, nil},
		{"RelayOutbox", "PUT", "Content-Type: application/json\r\nContent-Length: 100", http.StatusMethodNotAllowed, nil},
		{"RelayOutbox", "POST", "Content-Type: text/plain\r\nContent-Length: 100", http.StatusUnsupportedMediaType, nil},
		{"RelayOutbox", "POST", "Content-Type: application/json\r\nContent-Length: 5000", http.StatusRequestEntityTooLarge, nil},
	}
	for i, c := range stalls {
		stalls[i].s = proctest.Stall(t, "127.0.0.1:"+port, c.method+" /"+c.fn+" HTTP/1.1\r\nHost: x\r\n"+c.headers+"\r\n\r\n")
	}
	for _, c := range stalls {
		resp, body, err := c.s.Answered()
		if err != nil {
			v.Errorf("%s %s with %q, its body never sent: %v", c.method, c.fn, c.headers, err)
			continue
		}
		if resp.StatusCode != c.status || !resp.Close || !strings.Contains(body, "message") {
			v.Errorf("%s %s with %q, its body never sent: %s %s (close %t), want %d in JSON, Connection: close",
				c.method, c.fn, c.headers, resp.Status, body, resp.Close, c.status)
		}
		if !c.s.Closed() {
			v.Errorf("%s %s with %q: the connection stays open after the answer", c.method, c.fn, c.headers)
		}
	}
	if err := stop(); err != nil {
		v.Errorf("serve, stopped with stalled clients connected: %v, want nil", err)
	}
}

// answersAfterTheBody swaps [servable] for both functions answering as before 333c614, without
// reqbody.SkipBody (bodywait.Function): a client that stalls before its body gets no
// answer, and its request, in flight, holds the drain (issue 29). The check finds it only once
// pgtest.PollTimeout has passed without an answer, so -short skips it (the fixed check still runs).
var answersAfterTheBody = brokenVariant{"the answers decided by the headers without SkipBody", func(t *testing.T) {
	if testing.Short() {
		t.Skipf("-short: this broken variant is found only after %s without an answer; go test without -short runs it", pgtest.PollTimeout)
	}
	swap(t, &servable, []*lifecycle.Function{
		bodywait.Function(issue.Function.Name(), issue.Open),
		bodywait.Function(relay.Function.Name(), relay.Open),
	})
}}

// TestDemoServerBoundsStalledClients: the demo's and bench's server (serveLocal) is the same
// path: a 415 decided by the headers reaches a client that stalls before its body, closing the
// connection; a connection whose headers never end is closed; the server then stops cleanly.
// The broken variant (answersAfterTheBody) holds the 415 and the drain: the check finds them.
func TestDemoServerBoundsStalledClients(t *testing.T) {
	checkAndBreak(t, demoStalledCheck, answersAfterTheBody)
}

// demoStalledCheck is TestDemoServerBoundsStalledClients's check: it records in v what the
// demo's server does wrong with stalled clients.
func demoStalledCheck(t *testing.T, v *verdict) {
	t.Setenv("DATABASE_URL", pgtest.URL(t))
	t.Setenv("LINE_CHANNEL_ACCESS_TOKEN", "test-token")
	t.Setenv("LINE_API_BASE_URL", "http://127.0.0.1:9")
	s, err := serveLocal(context.Background(), slog.New(slog.DiscardHandler), servable...)
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(s.url, "http://")
	body := proctest.Stall(t, addr, "POST /IssueCoupon HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n")
	if resp, b, err := body.Answered(); err != nil {
		v.Errorf("a stalled body: %v", err)
	} else if resp.StatusCode != http.StatusUnsupportedMediaType || !resp.Close || !body.Closed() {
		v.Errorf("a stalled body: %s %s (close %t), want 415, Connection: close, the connection closed", resp.Status, b, resp.Close)
	}
	if !proctest.Stall(t, addr, "POST /RelayOutbox HTTP/1.1\r\nHost: x\r\n").Closed() {
		v.Errorf("unended headers: the server sent something instead of closing the connection")
	}
	if err := s.close(); err != nil {
		v.Errorf("the demo's server, stopped: %v, want nil", err)
	}
}
