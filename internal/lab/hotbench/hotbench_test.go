package hotbench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/internal/lab/hotbench"
	"github.com/mops/coupon-api/internal/lab/latencyproxy"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
	"github.com/mops/coupon-api/shared/lifecycle"
)

// TestRunChecksEveryCell runs the whole bench for one second a cell at 2 clients and round trips
// of 0 and 1 ms, with a small sold-out cell, IssueCoupon served through the functions framework
// in this process as couponctl bench serves it, its pool through the latency proxy: every
// pgbench script runs on the schema, every cell does work, and the rules and the coupon counts
// hold after each one; the sold-out cell sells its campaign out, and its statistics hold at
// least the rows of its coupons (they were flushed). A request answered other than ISSUED is
// counted as failed. The release-herd cell issues its release whole, none before its instant; the
// dry-run cell's dry runs all answer AVAILABLE (their sender sets dry_run) and write nothing
// (the coupons match the ISSUED answers). Each cell takes the server's CPU (here a clock that advances 1 ms a
// reading) before and after its load, and the tables give it per coupon. Speeds are logged,
// never asserted. -short skips it: the bench's long run, 18 cells of load (30 s).
func TestRunChecksEveryCell(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the whole bench, 18 cells of load; go test without -short runs it")
	}
	if _, err := exec.LookPath(hotbench.DefaultPgbench); err != nil {
		t.Skipf("no pgbench: %v", err)
	}
	ctx := context.Background()
	url := pgtest.URL(t)
	proxy, proxied, err := hotbench.Through(url, func(target string) (hotbench.Proxy, error) {
		return latencyproxy.Start(target, 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	issueCoupon, dryRun := serveIssueCoupon(t, proxied)
	soldOut := hotbench.SoldOut{Coupons: 20, Stripes: 4, Requests: 200}
	release := hotbench.ReleaseHerd{Coupons: 20, Stripes: 4, Lead: time.Second, Window: time.Second}
	dryRuns := hotbench.DryRunHerd{Herd: 2, Rounds: 1, PerIssue: 1}
	var progress bytes.Buffer
	var readings int
	cpu := func() (time.Duration, error) { readings++; return time.Duration(readings) * time.Millisecond, nil }
	rep, err := hotbench.Run(ctx, hotbench.Config{
		DBURL: url, Proxy: proxy, RTTs: []time.Duration{0, time.Millisecond}, Clients: []int{2},
		Duration: time.Second, SoldOut: &soldOut, Release: &release, DryRuns: &dryRuns, DryRun: dryRun, Progress: &progress,
		Issue: issueCoupon, ServerCPU: cpu,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cells) != 2*len(hotbench.Variants) || len(rep.SoldOut) != 2 || len(rep.Release) != 2 || len(rep.DryRuns) != 2 {
		t.Fatalf("%d cells and %d sold-out cells, want one per variant and one sold-out cell per round trip: %+v",
			len(rep.Cells), len(rep.SoldOut), rep)
	}
	for _, r := range rep.Cells {
		if r.Done == 0 || r.TPS <= 0 || r.P99Ms < r.P50Ms || r.Failed != 0 || r.Rules != "held" || r.PGCPUMs != 1 {
			t.Errorf("%+v: want work done, no failure, rules held, the server's CPU 1 ms", r)
		}
	}
	for _, r := range rep.SoldOut {
		t.Logf("sold out at rtt %s: %+v", r.RTT, r)
		if r.Issued != int64(soldOut.Coupons) || r.Issued+r.Refused != int64(soldOut.Requests) || r.Rules != "held" {
			t.Errorf("%+v: want every coupon issued, every other request refused, rules held", r)
		}
		if r.SoldOutSec <= 0 || r.RefusalRows < 0 || r.PGCPUMs != 1 {
			t.Errorf("%+v: want a sell-out time, at least %d rows written per coupon, the server's CPU 1 ms", r, hotbench.RowsPerIssue)
		}
	}
	for _, r := range rep.Release {
		t.Logf("release herd at rtt %s: %+v", r.RTT, r)
		if r.IssuedAll != int64(release.Coupons) || r.Issued < 1 || r.Issued > r.IssuedAll || r.Sent < r.Issued || r.Failed != 0 ||
			r.Before99Ms <= 0 || r.P99Ms < r.P50Ms || r.Rules != "held" {
			t.Errorf("%+v: want every released coupon issued, some in the window, requests before it, no failure, rules held", r)
		}
	}
	for _, r := range rep.DryRuns {
		t.Logf("dry runs at rtt %s: %+v", r.RTT, r)
		if len(r.Alone) != 1 || len(r.Beside) != 1 || r.Ratio <= 0 || r.DryRunsPerSec <= 0 || r.Failed != 0 || r.DryFailed != 0 || r.Rules != "held" {
			t.Errorf("%+v: want one turn alone and one beside the dry runs, both issuing, every dry run AVAILABLE, rules held", r)
		}
	}
	if n, want := strings.Count(progress.String(), "\n"), len(rep.Cells)+len(rep.SoldOut)+len(rep.Release)+len(rep.DryRuns); n != want {
		t.Errorf("%d progress lines, want %d:\n%s", n, want, progress.String())
	}
	var table bytes.Buffer
	if err := hotbench.WriteTable(&table, "markdown", rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	for _, want := range []string{"| 0 (proxy only) | 2 | pgbench: bare one-row UPDATE |", "| 1 ms | 2 | IssueCoupon, 16 stripes |",
		" 1.00x |", "| rtt | clients | coupons |", " | " + hotbench.CPUColumn + " | ", "| rtt | clients | released | issued in window |", "| rtt | clients | dry-run clients |"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}

// TestPgbenchMissing: a pgbench that is not there is a clear error before anything runs.
func TestPgbenchMissing(t *testing.T) {
	_, err := hotbench.Run(context.Background(), hotbench.Config{Pgbench: "/nonexistent/pgbench", Clients: []int{1}, Duration: time.Second})
	if err == nil || !strings.Contains(err.Error(), "pgbench not found") {
		t.Errorf("err %v, want it to say pgbench was not found", err)
	}
}

// serveIssueCoupon serves IssueCoupon through the functions framework in this process at "/"
// of a free port, on dbURL, until the test ends, and returns a client of it and one of its dry
// run.
func serveIssueCoupon(t *testing.T, dbURL string) (hotbench.IssueFunc, hotbench.IssueFunc) {
	t.Helper()
	t.Setenv("DATABASE_URL", dbURL)
	t.Setenv("FUNCTION_TARGET", issue.Function.Name())
	port := proctest.FreePort(t)
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- lifecycle.Serve(ctx, lifecycle.Server{Host: "127.0.0.1", Port: port,
			Functions: []*lifecycle.Function{issue.Function}, Log: slog.New(slog.DiscardHandler)})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("serving IssueCoupon: %v", err)
		}
	})
	proctest.WaitServing(t, port, &syncbuf.Buffer{})
	url := "http://127.0.0.1:" + port + "/"
	client := func(dry bool) hotbench.IssueFunc {
		return func(ctx context.Context, memberID, campaignID string) (string, error) {
			return ask(ctx, url, map[string]any{"member_id": memberID, "campaign_id": campaignID, "dry_run": dry})
		}
	}
	return client(false), client(true)
}

// ask posts body as JSON to url and returns the answer's result.
func ask(ctx context.Context, url string, body map[string]any) (string, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var answer struct{ Result string }
	err = json.NewDecoder(resp.Body).Decode(&answer)
	return answer.Result, err
}
