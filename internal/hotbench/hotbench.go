// Package hotbench measures one hot campaign on one PostgreSQL, four ways, at several client
// counts: the product's IssueCoupon over HTTP on a campaign of 1 and of 16 budget stripes, and
// pgbench running the transaction of docs/design.md as first written and the bare one-row UPDATE (the scripts in
// pgbench/). After every cell it checks the rules with package reconcile and that the coupons
// written match the answers. `couponctl bench` is its command line; docs/performance.md holds the
// figures. It is a benchmark: nothing asserts its speed.
package hotbench

import (
	"bufio"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/campaign"
	"github.com/mops/coupon-api/internal/reconcile"
)

//go:embed pgbench/*.sql
var scripts embed.FS

// DefaultPgbench is where Debian's postgresql-15 package installs pgbench.
const DefaultPgbench = "/usr/lib/postgresql/15/bin/pgbench"

// ErrNoPgbench is returned when the pgbench binary cannot be run.
var ErrNoPgbench = errors.New("hotbench: pgbench not found (Debian: apt-get install postgresql-15, or pass --pgbench)")

// The variants of one cell, in the order each client count runs them.
const (
	BareUpdate = "pgbench: bare one-row UPDATE"
	SeedTx     = "pgbench: the write-up's transaction"
	Issue1     = "IssueCoupon, 1 stripe"
	Issue16    = "IssueCoupon, 16 stripes"
)

// variant is how one cell runs: a pgbench script, or IssueCoupon on a campaign of stripes stripes.
type variant struct {
	name    string
	slug    string // names the cell's campaign
	script  string // under pgbench/; empty for IssueCoupon
	stripes int
}

var variants = []variant{
	{name: BareUpdate, slug: "bare", script: "bare-update.sql"},
	{name: SeedTx, slug: "seed", script: "seed.sql", stripes: 1},
	{name: Issue1, slug: "k1", stripes: 1},
	{name: Issue16, slug: "k16", stripes: 16},
}

// Variants are the four variants' names, in run order.
var Variants = []string{BareUpdate, SeedTx, Issue1, Issue16}

// IssueFunc asks IssueCoupon for one coupon and returns its result code; an error is a request
// without one.
type IssueFunc func(ctx context.Context, memberID, campaignID string) (string, error)

// Config is one bench session.
type Config struct {
	// DBURL is a migrated database (a postgres:// URL) that IssueCoupon also serves from.
	DBURL string
	// Issue sends one request to IssueCoupon.
	Issue IssueFunc
	// Pgbench is the pgbench binary; empty is [DefaultPgbench].
	Pgbench string
	// Clients are the client counts; each runs every variant.
	Clients []int
	// Duration is how long each cell runs.
	Duration time.Duration
	// CapYen is R3's monthly cap in yen, for the rule check.
	CapYen int
	// Progress, if not nil, gets one line per cell.
	Progress io.Writer
}

// Result is one cell: a variant at a client count.
type Result struct {
	Variant string `json:"variant"`
	Clients int    `json:"clients"`
	// Done is the transactions (pgbench) or ISSUED answers (IssueCoupon) in the cell.
	Done int64 `json:"done"`
	// TPS is Done per second of the cell's run; P50Ms and P99Ms are per-transaction or
	// per-request latencies in milliseconds.
	TPS   float64 `json:"tps"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	// Failed is requests answered other than ISSUED or without an answer, or pgbench
	// transactions that failed or clients that aborted.
	Failed int64 `json:"failed"`
	// Rules is "held", or the broken rules and mismatches found after the cell.
	Rules string `json:"rules"`
}

// CheckPgbench returns a wrapped [ErrNoPgbench] when path is not a pgbench that can be run.
func CheckPgbench(path string) error {
	if _, err := exec.LookPath(path); err != nil {
		return fmt.Errorf("%w: %v", ErrNoPgbench, err)
	}
	return nil
}

// Run runs every variant at every client count and returns one result per cell, in order. It
// stops at the first error that is not a measured failure.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.Pgbench == "" {
		cfg.Pgbench = DefaultPgbench
	}
	if err := CheckPgbench(cfg.Pgbench); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "hotbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	for _, v := range variants {
		if v.script == "" {
			continue
		}
		b, err := scripts.ReadFile("pgbench/" + v.script)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, v.script), b, 0o644); err != nil {
			return nil, err
		}
	}
	pool, err := pgxpool.New(ctx, cfg.DBURL)
	if err != nil {
		return nil, fmt.Errorf("hotbench: pool: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_hot_row (LIKE campaign_budgets INCLUDING ALL)`); err != nil {
		return nil, fmt.Errorf("hotbench: bench_hot_row: %w", err)
	}

	var rs []Result
	total := len(cfg.Clients) * len(Variants)
	for _, clients := range cfg.Clients {
		for _, v := range variants {
			r, err := runCell(ctx, cfg, pool, dir, v, clients, fmt.Sprintf("HOT-%d-%s", clients, v.slug))
			if err != nil {
				return rs, fmt.Errorf("hotbench: %s, %d clients: %w", v.name, clients, err)
			}
			rs = append(rs, r)
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "bench [%d/%d] %s, %d clients: %.0f/s, p50 %.1f ms, p99 %.1f ms, failed %d, rules %s\n",
					len(rs), total, v.name, clients, r.TPS, r.P50Ms, r.P99Ms, r.Failed, r.Rules)
			}
		}
	}
	return rs, nil
}

// benchCampaign is each cell's campaign: 1 yen coupons and a budget no cell can spend, so that
// every request issues.
func benchCampaign(id string, stripes int) campaign.Campaign {
	return campaign.Campaign{ID: id, DiscountYen: 1, BudgetYen: math.MaxInt32, Stripes: stripes}
}

func runCell(ctx context.Context, cfg Config, pool *pgxpool.Pool, dir string, v variant, clients int, id string) (Result, error) {
	r := Result{Variant: v.name, Clients: clients}
	if v.stripes == 0 {
		if _, err := pool.Exec(ctx, `INSERT INTO bench_hot_row (campaign_id, stripe, discount_yen, budget_yen) VALUES ($1, 0, 1, $2)`,
			id, math.MaxInt32); err != nil {
			return r, err
		}
	} else if err := campaign.Create(ctx, pool, benchCampaign(id, v.stripes)); err != nil {
		return r, err
	}
	var lat []time.Duration
	var wall time.Duration
	var err error
	if v.script != "" {
		lat, r.Failed, wall, err = pgbench(ctx, cfg, dir, v.script, clients, id)
	} else {
		lat, r.Failed, wall, err = closedLoop(ctx, cfg.Issue, clients, cfg.Duration, id)
	}
	if err != nil {
		return r, err
	}
	r.Done = int64(len(lat))
	r.TPS = float64(r.Done) / wall.Seconds()
	r.P50Ms, r.P99Ms = percentileMs(lat, 50), percentileMs(lat, 99)
	want := r.Done // one coupon per transaction or ISSUED answer; none for the bare UPDATE
	if v.stripes == 0 {
		want = 0
	}
	r.Rules, err = checkRules(ctx, pool, cfg.CapYen, id, want)
	return r, err
}

// checkRules runs package reconcile over the whole database and checks that campaign id holds
// exactly want coupons.
func checkRules(ctx context.Context, pool *pgxpool.Pool, capYen int, id string, want int64) (string, error) {
	rep, err := reconcile.Check(ctx, pool, reconcile.Config{CapYen: capYen})
	if err != nil {
		return "", err
	}
	wrong := rep.Violations()
	var coupons int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM issued_coupons WHERE campaign_id = $1`, id).Scan(&coupons); err != nil {
		return "", err
	}
	if coupons != want {
		wrong = append(wrong, fmt.Sprintf("%s: %d coupons for %d issued", id, coupons, want))
	}
	if len(wrong) == 0 {
		return "held", nil
	}
	return strings.Join(wrong, "; "), nil
}

// closedLoop keeps clients requests in flight for d, each for a new member, and returns the
// latencies of the ISSUED answers, the other answers and failures, and the wall time.
func closedLoop(ctx context.Context, issue IssueFunc, clients int, d time.Duration, campaignID string) ([]time.Duration, int64, time.Duration, error) {
	var (
		mu      sync.Mutex
		lat     []time.Duration
		failed  atomic.Int64
		members atomic.Int64
		wg      sync.WaitGroup
	)
	start := time.Now()
	stop := start.Add(d)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(stop) && ctx.Err() == nil {
				member := fmt.Sprintf("h%s-%d", campaignID, members.Add(1))
				t0 := time.Now()
				res, err := issue(ctx, member, campaignID)
				if err != nil || res != "ISSUED" {
					failed.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return lat, failed.Load(), time.Since(start), ctx.Err()
}

var (
	tpsLine     = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)
	failedLine  = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	abortedLine = regexp.MustCompile(`(?m)client \d+ aborted`)
)

// pgbench runs script with clients clients for cfg.Duration against cfg.DBURL (prepared
// statements, campaign set to campaignID, one thread per core at most) and returns the
// per-transaction latencies from its log, failures (failed transactions plus aborted clients)
// and the run's length. pgbench exits 2 when a client aborted; that is a measured failure.
func pgbench(ctx context.Context, cfg Config, dir, script string, clients int, campaignID string) ([]time.Duration, int64, time.Duration, error) {
	logDir, err := os.MkdirTemp(dir, "log-")
	if err != nil {
		return nil, 0, 0, err
	}
	defer os.RemoveAll(logDir)
	secs := max(1, int(cfg.Duration.Round(time.Second).Seconds()))
	cmd := exec.CommandContext(ctx, cfg.Pgbench, "-n", "-M", "prepared",
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, runtime.NumCPU())),
		"-T", strconv.Itoa(secs), "-D", "campaign="+campaignID, "-f", filepath.Join(dir, script),
		"-l", "--log-prefix", filepath.Join(logDir, "tx"), cfg.DBURL)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 2) {
		return nil, 0, 0, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	if !tpsLine.Match(out) {
		return nil, 0, 0, fmt.Errorf("pgbench: no tps line in its output:\n%s", out)
	}
	var failed int64
	if m := failedLine.FindSubmatch(out); m != nil {
		failed, _ = strconv.ParseInt(string(m[1]), 10, 64)
	}
	failed += int64(len(abortedLine.FindAll(out, -1)))
	lat, err := readLogs(logDir)
	return lat, failed, time.Duration(secs) * time.Second, err
}

// readLogs reads pgbench's per-transaction logs: "client_id transaction_no time script_no
// time_epoch time_us ...", time in microseconds, or a failure word instead of a number (pgbench
// docs, "Per-Transaction Logging"), which is skipped.
func readLogs(dir string) ([]time.Duration, error) {
	files, err := filepath.Glob(filepath.Join(dir, "tx*"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("pgbench: no transaction log in %s: %v", dir, err)
	}
	var lat []time.Duration
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 3 {
				continue
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil {
				continue
			}
			lat = append(lat, time.Duration(us)*time.Microsecond)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return lat, nil
}

func percentileMs(l []time.Duration, p float64) float64 {
	if len(l) == 0 {
		return 0
	}
	slices.Sort(l)
	rank := int(math.Ceil(float64(len(l))*p/100)) - 1
	return float64(l[min(max(rank, 0), len(l)-1)].Microseconds()) / 1000
}

// Formats are the table formats [WriteTable] knows.
var Formats = []string{"text", "markdown"}

// WriteTable writes rs as a table, one row per cell, with each cell's throughput as a ratio of
// the same client count's pgbench runs of the first-written transaction (docs/design.md) and of the bare one-row UPDATE.
func WriteTable(w io.Writer, format string, rs []Result) error {
	if !slices.Contains(Formats, format) {
		return fmt.Errorf("hotbench: format %q: want one of %s", format, strings.Join(Formats, ", "))
	}
	ratio := func(r Result, base string) string {
		i := slices.IndexFunc(rs, func(b Result) bool { return b.Variant == base && b.Clients == r.Clients })
		if i < 0 || rs[i].TPS == 0 {
			return ""
		}
		return strconv.FormatFloat(r.TPS/rs[i].TPS, 'f', 2, 64) + "x"
	}
	rows := [][]string{{"clients", "variant", "per s", "p50 ms", "p99 ms", "vs seed tx", "vs bare UPDATE", "failed", "rules"}}
	for _, r := range rs {
		rows = append(rows, []string{strconv.Itoa(r.Clients), r.Variant, strconv.FormatFloat(r.TPS, 'f', 0, 64),
			strconv.FormatFloat(r.P50Ms, 'f', 1, 64), strconv.FormatFloat(r.P99Ms, 'f', 1, 64),
			ratio(r, SeedTx), ratio(r, BareUpdate), strconv.FormatInt(r.Failed, 10), r.Rules})
	}
	if format == "text" {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, r := range rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
		return tw.Flush()
	}
	for i, r := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
		if i == 0 {
			fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---|")
		}
	}
	return nil
}
