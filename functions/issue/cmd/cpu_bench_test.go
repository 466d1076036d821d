package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/localpg"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
	"github.com/mops/coupon-api/shared/issuance"
)

var (
	svcProfile = flag.String("svcprofile", "", "BenchmarkIssueCouponCPU: write the serving process's CPU profile of each cell's measured requests to `PREFIX`-<cell>.pprof")
	pgPerf     = flag.String("pgperf", "", "BenchmarkIssueCouponCPU: record PostgreSQL's backends of each cell with perf record -g into `PREFIX`-<cell>.perf.data (as root)")
)

// serveEnv makes this test binary the deployed IssueCoupon (this package's main) instead of
// running tests: [BenchmarkIssueCouponCPU]'s serving process. Its value is "-" or where to write
// a CPU profile, started by SIGUSR1 and stopped once the process is told to end (SIGTERM).
const serveEnv = "ISSUE_CPU_BENCH_SERVE"

// serveForBench runs main as the deployed process does, profiled when profile is not "-".
func serveForBench(profile string) int {
	if profile != "-" {
		f, err := os.Create(profile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer f.Close()
		start := make(chan os.Signal, 1)
		signal.Notify(start, syscall.SIGUSR1)
		go func() {
			<-start
			_ = pprof.StartCPUProfile(f)
		}()
		defer pprof.StopCPUProfile()
	}
	main()
	return 0
}

// BenchmarkIssueCouponCPU is the CPU one coupon costs IssueCoupon's serving process and
// PostgreSQL: this package's main (the deployed binary: lifecycle.Main, telemetry from the
// environment with nothing exporting, the pool and batch size of deploy/issue.env.yaml) served
// in a process of its own, asked over loopback HTTP by new members of one campaign with room for
// all. "lone" sends one request at a time (each a batch of one); "hot" sends from 32 clients at
// once to one campaign of 16 stripes, coalesced. It reports, per ISSUED coupon, the serving
// process's CPU (svc-core-ms/coupon: user and system, the kernel's networking for it included)
// and the server's (pg-core-ms/coupon: the postmaster and all its processes), measured from
// /proc. Run it with a fixed count, each cell starting its own serving process:
//
//	go test -run '^$' -bench IssueCouponCPU -benchtime 3000x ./functions/issue/cmd \
//	    [-svcprofile /tmp/svc] [-pgperf /tmp/pg]
func BenchmarkIssueCouponCPU(b *testing.B) {
	for _, c := range []struct {
		name    string
		clients int
		stripes int
	}{{"lone", 1, 1}, {"hot", 32, 16}} {
		b.Run(c.name, func(b *testing.B) {
			cell := startCPUCell(b, c.name, c.stripes)
			cell.send(b, c.clients, 200) // warm: the pool's connections, the caches
			svc0, pg0 := cell.cpu(b)
			stopPerf := cell.profile(b)
			b.ResetTimer()
			cell.send(b, c.clients, b.N)
			b.StopTimer()
			stopPerf()
			svc1, pg1 := cell.cpu(b)
			perCoupon := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(b.N) }
			b.ReportMetric(perCoupon(svc1-svc0), "svc-core-ms/coupon")
			b.ReportMetric(perCoupon(pg1-pg0), "pg-core-ms/coupon")
			cell.stop(b)
		})
	}
}

// cpuCell is one cell of [BenchmarkIssueCouponCPU]: a serving process on a fresh database.
type cpuCell struct {
	name       string
	url        string
	pool       *pgxpool.Pool
	cmd        *exec.Cmd
	out        *syncbuf.Buffer
	postmaster int
	client     *http.Client
	next       atomic.Int64 // the last member number sent
}

func startCPUCell(b *testing.B, name string, stripes int) *cpuCell {
	ctx := context.Background()
	dbURL := pgtest.URL(b)
	pool := pgtest.PoolAt(b, dbURL, 2)
	if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "BENCH", DiscountYen: 1, BudgetYen: 1 << 30, Stripes: stripes}); err != nil {
		b.Fatal(err)
	}
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		b.Fatal(err)
	}
	postmaster, err := localpg.PostmasterOf(backend)
	if err != nil {
		b.Fatal(err)
	}
	profile := "-"
	if *svcProfile != "" {
		profile = *svcProfile + "-" + name + ".pprof"
	}
	port := proctest.FreePort(b)
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd, out := proctest.Start(b, self, serveEnv+"="+profile, "DATABASE_URL="+dbURL, "PORT="+port,
		"DB_POOL_MAX_CONNS=4", "ISSUE_BATCH_MAX="+strconv.Itoa(issuance.DefaultBatchMax))
	proctest.WaitServing(b, port, out)
	return &cpuCell{name: name, url: "http://127.0.0.1:" + port + "/", pool: pool, cmd: cmd, out: out,
		postmaster: postmaster, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// send issues n coupons to new members from clients goroutines at once, failing b on any answer
// but 201 ISSUED.
func (c *cpuCell) send(b *testing.B, clients, n int) {
	var wg sync.WaitGroup
	var sent atomic.Int64
	errs := make(chan error, clients)
	for range clients {
		wg.Go(func() {
			for sent.Add(1) <= int64(n) {
				if err := c.issue(c.next.Add(1)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("%v\n%s", err, c.out.String())
	}
}

func (c *cpuCell) issue(member int64) error {
	body := fmt.Sprintf(`{"member_id":"m%d","campaign_id":"BENCH"}`, member)
	resp, err := c.client.Post(c.url, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var got bytes.Buffer
	_, _ = got.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("member m%d: %d %s", member, resp.StatusCode, got.String())
	}
	return nil
}

// cpu reads the serving process's CPU and the server's.
func (c *cpuCell) cpu(b *testing.B) (svc, pg time.Duration) {
	svc, err := localpg.ProcessTreeCPU(c.cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	if pg, err = localpg.ProcessTreeCPU(c.postmaster); err != nil {
		b.Fatal(err)
	}
	return svc, pg
}

// profile starts the profiles -svcprofile and -pgperf ask for, and returns what stops them. The
// benchmark's first run, of one request, is not profiled.
func (c *cpuCell) profile(b *testing.B) (stop func()) {
	if b.N == 1 {
		return func() {}
	}
	if *svcProfile != "" {
		if err := c.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			b.Fatal(err)
		}
	}
	if *pgPerf == "" {
		return func() {}
	}
	rows, err := c.pool.Query(context.Background(),
		"SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
	if err != nil {
		b.Fatal(err)
	}
	var pids []string
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			b.Fatal(err)
		}
		pids = append(pids, strconv.Itoa(pid))
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	perf := exec.Command("perf", "record", "-g", "-F", "999", "-o", *pgPerf+"-"+c.name+".perf.data", "-p", strings.Join(pids, ","))
	var out syncbuf.Buffer
	perf.Stdout, perf.Stderr = &out, &out
	if err := perf.Start(); err != nil {
		b.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // perf attaches
	return func() {
		_ = perf.Process.Signal(syscall.SIGINT)
		var exit *exec.ExitError
		if err := perf.Wait(); err != nil && !(errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGINT) {
			b.Errorf("perf record: %v\n%s", err, out.String())
		}
	}
}

// stop ends the serving process as Cloud Run does (SIGTERM), which writes its profile.
func (c *cpuCell) stop(b *testing.B) {
	proctest.Terminate(b, c.cmd, c.out)
}
