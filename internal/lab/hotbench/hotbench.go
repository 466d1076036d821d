// Package hotbench measures one hot campaign on one PostgreSQL, at several client counts and at
// several network round trips between the clients and the database: pgbench running the bare
// one-row UPDATE, issue_coupon() in one pipelined round trip, the same writes pipelined without a
// function, and the transaction of docs/design.md as first written (the scripts in pgbench/);
// and the product's IssueCoupon on a campaign of 1 and of 16 budget stripes. Every cell's
// traffic to the database, pgbench's and IssueCoupon's, goes through a latency proxy
// (internal/lab/latencyproxy) that adds the round trip. After every cell it checks the rules with
// package reconcile and that the coupons written match the answers. An optional sold-out cell
// sells a first-come campaign out and counts the rows its refusals wrote. `couponctl bench` is
// its command line; docs/performance.md holds the figures. It is a benchmark: nothing asserts its
// speed.
package hotbench

import (
	"bufio"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/reconcile"
)

//go:embed pgbench/*.sql
var scripts embed.FS

// DefaultPgbench is where Debian's postgresql-15 package installs pgbench.
const DefaultPgbench = "/usr/lib/postgresql/15/bin/pgbench"

// ErrNoPgbench is returned when the pgbench binary cannot be run.
var ErrNoPgbench = errors.New("hotbench: pgbench not found (Debian: apt-get install postgresql-15, or pass --pgbench)")

// The variants of one cell, in the order each round trip and client count runs them.
const (
	BareUpdate = "pgbench: bare one-row UPDATE"
	Function   = "pgbench: issue_coupon(), 1 round trip"
	Pipelined  = "pgbench: same writes pipelined, no function"
	SeedTx     = "pgbench: the write-up's transaction, 9 round trips"
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
	{name: Function, slug: "fn", script: "function.sql", stripes: 1},
	{name: Pipelined, slug: "pipe", script: "pipelined.sql", stripes: 1},
	{name: SeedTx, slug: "seed", script: "seed.sql", stripes: 1},
	{name: Issue1, slug: "k1", stripes: 1},
	{name: Issue16, slug: "k16", stripes: 16},
}

// Variants are the variants' names, in run order.
var Variants = []string{BareUpdate, Function, Pipelined, SeedTx, Issue1, Issue16}

// IssueFunc asks IssueCoupon for one coupon and returns its result code; an error is a request
// without one.
type IssueFunc func(ctx context.Context, memberID, campaignID string) (string, error)

// Config is one bench session.
type Config struct {
	// DBURL is a migrated database, a postgres:// URL with a TCP host. The bench's own queries
	// (campaigns, rule checks, statistics) go to it directly.
	DBURL string
	// Proxy is the latency proxy in front of DBURL's server (see [Through]); IssueCoupon
	// connects through it, and so does pgbench. Run sets its round trip for each of RTTs.
	Proxy Proxy
	// Issue sends one request to IssueCoupon.
	Issue IssueFunc
	// Pgbench is the pgbench binary; empty is [DefaultPgbench].
	Pgbench string
	// RTTs are the round trips the proxy adds (see [CheckRTTs]); each runs every cell. Empty
	// is only 0: the proxy adding nothing.
	RTTs []time.Duration
	// Clients are the client counts; each runs every variant.
	Clients []int
	// Duration is how long each variant's cell runs.
	Duration time.Duration
	// SoldOut, if not nil, adds a sold-out cell after the variants of each round trip and client
	// count.
	SoldOut *SoldOut
	// Changes, if not nil, adds a live-changes cell after those.
	Changes *Changes
	// Release, if not nil, adds a release-herd cell after those.
	Release *ReleaseHerd
	// DryRuns, if not nil, adds a dry-run cell after those; DryRun sends its dry runs.
	DryRuns *DryRunHerd
	DryRun  IssueFunc
	// Store, if not nil, adds a store-opening cell after those; Redeem sends its redemptions.
	Store  *StoreOpening
	Redeem RedeemFunc
	// Progress, if not nil, gets one line per cell.
	Progress io.Writer
	// ServerCPU, if not nil, reads the CPU time the database server has used so far (all its
	// processes, user and system); each cell reports the difference over its load.
	ServerCPU func() (time.Duration, error)
	// ReplicaCPU, if not nil, reads the CPU time of the streaming replica that answers
	// IssueCoupon's dry runs (`bench --dry-runs --read-pool`), as ServerCPU; the dry-run cell
	// reports its part per dry run and a table of its own ([ReadPoolTable]).
	ReplicaCPU func() (time.Duration, error)
}

// SoldOut is the sold-out cell: a first-come campaign of Coupons coupons of 1 yen on Stripes
// budget stripes, and Requests requests, one per new member, more than there are coupons, sent
// through IssueCoupon by the cell's clients.
type SoldOut struct {
	Coupons, Stripes, Requests int
}

// BlackFriday is the sold-out cell of `couponctl bench --sold-out`: the size of the isolation
// lab's black-friday scenario (docs/hot-campaigns.md: 1,000 coupons, 20,000 members), on 16
// stripes as that page's stripes-16 strategy.
var BlackFriday = SoldOut{Coupons: 1000, Stripes: 16, Requests: 20000}

// Cells is how many cells [Run] runs with c: every variant and optional cell at every round
// trip (none given: one, 0) and client count.
func (c Config) Cells() int {
	perGroup := len(variants)
	for _, on := range []bool{c.SoldOut != nil, c.Changes != nil, c.Release != nil, c.DryRuns != nil, c.Store != nil} {
		if on {
			perGroup++
		}
	}
	return max(1, len(c.RTTs)) * len(c.Clients) * perGroup
}

// Report is a bench session's results, in run order.
type Report struct {
	// ServerCPU says the cells' PGCPUMs were measured (Config.ServerCPU).
	ServerCPU bool
	// ReadPool says a replica answered the dry runs (Config.ReplicaCPU).
	ReadPool bool
	Cells    []Result
	SoldOut  []SoldOutResult
	Changes  []ChangesResult
	Release  []ReleaseResult
	DryRuns  []DryRunResult
	Store    []StoreResult
}

// Result is one cell: a variant at a round trip and a client count.
type Result struct {
	Variant string `json:"variant"`
	// RTT is the round trip the proxy added.
	RTT     time.Duration `json:"rtt_ns"`
	Clients int           `json:"clients"`
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
	// PGCPUMs is the CPU the database server used during the cell's load, in core-milliseconds
	// (Config.ServerCPU; 0 without it).
	PGCPUMs float64 `json:"pg_cpu_ms"`
	// Rules is "held", or the broken rules and mismatches found after the cell.
	Rules string `json:"rules"`
}

// SoldOutResult is one sold-out cell.
type SoldOutResult struct {
	RTT      time.Duration `json:"rtt_ns"`
	Clients  int           `json:"clients"`
	Coupons  int           `json:"coupons"`
	Requests int           `json:"requests"`
	// Issued, Refused and Failed count the answers: ISSUED, BUDGET_EXCEEDED, and any other or
	// none.
	Issued  int64 `json:"issued"`
	Refused int64 `json:"refused"`
	Failed  int64 `json:"failed"`
	// SoldOutSec is the time from the first request to the last ISSUED answer, in seconds;
	// IssuedPerSec is Issued over it.
	SoldOutSec   float64 `json:"sold_out_s"`
	IssuedPerSec float64 `json:"issued_per_s"`
	// RefusedPerSec is the BUDGET_EXCEEDED answers that came after the last ISSUED one, per
	// second from it to the last answer.
	RefusedPerSec float64 `json:"refused_per_s"`
	// RowsWritten is the rows the cell inserted, updated and deleted in issued_coupons,
	// member_monthly_usage and notification_outbox (pg_stat_user_tables' n_tup_ins + n_tup_upd +
	// n_tup_del, rows of rolled-back transactions and rows a batch deleted again included);
	// RefusalRows is what is left of it after [RowsPerIssue] rows per ISSUED answer: the rows
	// written by refusals, and by attempts rolled back or undone and retried. StripeUpdates is
	// the updates of campaign_budgets rows: one per call and stripe it took room from, so one
	// per coupon without coalescing and fewer with it.
	RowsWritten   int64 `json:"rows_written"`
	RefusalRows   int64 `json:"refusal_rows"`
	StripeUpdates int64 `json:"stripe_updates"`
	// RolledBack is the transactions the database rolled back during the cell
	// (pg_stat_database.xact_rollback).
	RolledBack int64 `json:"rolled_back"`
	// PGCPUMs is the CPU the database server used while the requests were answered, refusals
	// included, in core-milliseconds (Config.ServerCPU; 0 without it).
	PGCPUMs float64 `json:"pg_cpu_ms"`
	// Rules is "held", or the broken rules and mismatches found after the cell.
	Rules string `json:"rules"`
}

// RowsPerIssue is the member rows one issuance writes (schema/current/issue_coupons_batch_v3.sql):
// the coupon insert, the member x month usage row's insert or
// update and the outbox insert. The budget stripe's update is counted apart
// ([SoldOutResult.StripeUpdates]): a coalesced call makes one for all its members on a stripe.
const RowsPerIssue = 3

// CheckPgbench returns a wrapped [ErrNoPgbench] when path is not a pgbench that can be run.
func CheckPgbench(path string) error {
	if _, err := exec.LookPath(path); err != nil {
		return fmt.Errorf("%w: %v", ErrNoPgbench, err)
	}
	return nil
}

// CheckRTTs refuses a negative round trip and one given twice (its cells' campaigns would
// collide).
func CheckRTTs(rtts []time.Duration) error {
	for i, d := range rtts {
		if d < 0 {
			return fmt.Errorf("round trip %s: must not be negative", d)
		}
		if slices.Contains(rtts[:i], d) {
			return fmt.Errorf("round trip %s given twice", d)
		}
	}
	return nil
}

// Proxy is a latency proxy: internal/lab/latencyproxy's Proxy in this process, or its Process in
// a child process (what `couponctl bench` uses, so that the measured process's load does not
// delay the proxy).
type Proxy interface {
	Addr() string
	SetRTT(time.Duration) error
	Close()
}

// Through starts a latency proxy with start in front of the server of dbURL (a postgres:// URL
// with a TCP host; a Unix socket cannot be proxied), adding nothing yet, and returns it with
// dbURL pointed at it: the URL that IssueCoupon's pool must use for [Run] to set its round trip.
// The caller closes the proxy.
func Through(dbURL string, start func(target string) (Proxy, error)) (Proxy, string, error) {
	u, err := url.Parse(dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, "", errors.New("hotbench: the latency proxy needs a postgres:// database URL")
	}
	if u.Hostname() == "" || strings.Contains(u.Host, ",") || u.Query().Has("host") {
		return nil, "", fmt.Errorf("hotbench: the latency proxy needs one TCP host in the database URL (postgres://user@host:port/db), not %s", u.Redacted())
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5432") // libpq's default port
	}
	p, err := start(target)
	if err != nil {
		return nil, "", err
	}
	return p, viaProxy(u, p.Addr()), nil
}

// viaProxy is u with its host replaced by the proxy's address.
func viaProxy(u *url.URL, proxyAddr string) string {
	v := *u
	v.Host = proxyAddr
	return v.String()
}

// Run runs every variant, then the sold-out, live-changes, release-herd and dry-run cells if asked, at every round trip and client
// count, and returns the results in order. It stops at the first error that is not a measured
// failure.
func Run(ctx context.Context, cfg Config) (Report, error) {
	rep := Report{ServerCPU: cfg.ServerCPU != nil, ReadPool: cfg.ReplicaCPU != nil}
	s, err := open(ctx, cfg)
	if err != nil {
		return rep, err
	}
	defer s.close()
	for _, rtt := range s.cfg.RTTs {
		if err := s.cfg.Proxy.SetRTT(rtt); err != nil {
			return rep, err
		}
		for _, clients := range s.cfg.Clients {
			for _, v := range variants {
				r, err := s.runCell(ctx, v, rtt, clients)
				if err != nil {
					return rep, fmt.Errorf("hotbench: %s, rtt %s, %d clients: %w", v.name, rttLabel(rtt), clients, err)
				}
				rep.Cells = append(rep.Cells, r)
				s.progress("%s, rtt %s, %d clients: %.0f/s, p50 %.1f ms, p99 %.1f ms, failed %d, rules %s",
					v.name, rttLabel(rtt), clients, r.TPS, r.P50Ms, r.P99Ms, r.Failed, r.Rules)
			}
			if err := s.runExtras(ctx, &rep, rtt, clients); err != nil {
				return rep, err
			}
		}
	}
	return rep, nil
}

// runExtras runs the optional cells of round trip rtt and clients clients after the variants, in
// order, into rep.
func (s *session) runExtras(ctx context.Context, rep *Report, rtt time.Duration, clients int) error {
	if s.cfg.SoldOut != nil {
		r, err := s.runSoldOut(ctx, rtt, clients)
		if err != nil {
			return fmt.Errorf("hotbench: sold-out cell, rtt %s, %d clients: %w", rttLabel(rtt), clients, err)
		}
		rep.SoldOut = append(rep.SoldOut, r)
		s.progress("sold out (%d coupons, %d stripes), rtt %s, %d clients: in %.2f s, %.0f issued/s, %.0f refused/s after, refusals wrote %d rows, %d rolled back, failed %d, rules %s",
			r.Coupons, s.cfg.SoldOut.Stripes, rttLabel(rtt), clients, r.SoldOutSec, r.IssuedPerSec, r.RefusedPerSec,
			r.RefusalRows, r.RolledBack, r.Failed, r.Rules)
	}
	if s.cfg.Changes != nil {
		r, err := s.runChanges(ctx, rtt, clients)
		if err != nil {
			return fmt.Errorf("hotbench: live-changes cell, rtt %s, %d clients: %w", rttLabel(rtt), clients, err)
		}
		rep.Changes = append(rep.Changes, r)
		s.progress("live changes every %s, rtt %s, %d clients: rules %s", s.cfg.Changes.Every, rttLabel(rtt), clients, r.Rules)
	}
	if s.cfg.Release != nil {
		r, err := s.runRelease(ctx, rtt, clients)
		if err != nil {
			return fmt.Errorf("hotbench: release-herd cell, rtt %s, %d clients: %w", rttLabel(rtt), clients, err)
		}
		rep.Release = append(rep.Release, r)
		s.progress("release herd (%d coupons, %d stripes), rtt %s, %d clients: %d issued in the first %s, %d refused, p99 %.1f ms, failed %d, rules %s",
			r.Coupons, s.cfg.Release.Stripes, rttLabel(rtt), clients, r.Issued, s.cfg.Release.Window, r.Refused, r.P99Ms, r.Failed, r.Rules)
	}
	if s.cfg.DryRuns != nil {
		r, err := s.runDryRuns(ctx, rtt, clients)
		if err != nil {
			return fmt.Errorf("hotbench: dry-run cell, rtt %s, %d clients: %w", rttLabel(rtt), clients, err)
		}
		rep.DryRuns = append(rep.DryRuns, r)
		s.progress("dry runs (%d clients) beside the load, rtt %s, %d clients: issued/s %s alone, %s beside (%.2fx), %.0f dry runs/s, failed %d, rules %s",
			r.Herd, rttLabel(rtt), clients, rateList(r.Alone), rateList(r.Beside), r.Ratio, r.DryRunsPerSec, r.Failed+r.DryFailed, r.Rules)
	}
	if s.cfg.Store != nil {
		r, err := s.runStore(ctx, rtt, clients)
		if err != nil {
			return fmt.Errorf("hotbench: store-opening cell, rtt %s, %d clients: %w", rttLabel(rtt), clients, err)
		}
		rep.Store = append(rep.Store, r)
		s.progress("store opening (%d clients redeeming) beside the load, rtt %s, %d clients: issued/s %s alone, %s beside (%.2fx), p99 %s alone, %s beside, %.0f redeemed/s, failed %d, rules %s",
			r.Herd, rttLabel(rtt), clients, rateList(r.Alone), rateList(r.Beside), r.Ratio, msList(r.AloneP99), msList(r.BesideP99),
			r.RedeemedPerSec, r.Failed+r.RedeemFailed, r.Rules)
	}
	return nil
}

// session is one Run's state.
type session struct {
	cfg        Config
	pool       *pgxpool.Pool // the bench's own, straight to cfg.DBURL
	pgbenchURL string        // cfg.DBURL through the proxy
	dir        string        // the pgbench scripts
	done       int           // cells reported
	total      int           // cells to run
}

// open checks cfg, fills in its defaults, and prepares a session: the scripts on disk, the
// bench's pool, the table of the bare UPDATE. Close it.
func open(ctx context.Context, cfg Config) (*session, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.DBURL)
	if err != nil {
		return nil, fmt.Errorf("hotbench: database URL: %w", err)
	}
	s := &session{cfg: cfg, pgbenchURL: viaProxy(u, cfg.Proxy.Addr()), total: cfg.Cells()}
	if s.dir, err = writeScripts(); err != nil {
		return nil, err
	}
	if s.pool, err = pgxpool.New(ctx, cfg.DBURL); err != nil {
		os.RemoveAll(s.dir)
		return nil, fmt.Errorf("hotbench: pool: %w", err)
	}
	if _, err := s.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_hot_row (LIKE campaign_budgets INCLUDING ALL)`); err != nil {
		s.close()
		return nil, fmt.Errorf("hotbench: bench_hot_row: %w", err)
	}
	return s, nil
}

// check fills in c's defaults (pgbench, the round trip 0) and refuses what Run cannot run with.
func (c *Config) check() error {
	if c.Pgbench == "" {
		c.Pgbench = DefaultPgbench
	}
	if err := CheckPgbench(c.Pgbench); err != nil {
		return err
	}
	if len(c.RTTs) == 0 {
		c.RTTs = []time.Duration{0}
	}
	if err := CheckRTTs(c.RTTs); err != nil {
		return fmt.Errorf("hotbench: %w", err)
	}
	if c.Proxy == nil {
		return errors.New("hotbench: no latency proxy (see Through)")
	}
	if c.DryRuns != nil && (c.DryRun == nil || c.DryRuns.Herd < 1 || c.DryRuns.Rounds < 1) {
		return errors.New("hotbench: the dry-run cell needs Config.DryRun, a herd and rounds")
	}
	if c.Store != nil && (c.Redeem == nil || c.Store.Herd < 1 || c.Store.Rounds < 1 || c.Store.Rate <= 0) {
		return errors.New("hotbench: the store-opening cell needs Config.Redeem, a herd, rounds and a rate")
	}
	return nil
}

func (s *session) close() {
	s.pool.Close()
	os.RemoveAll(s.dir)
}

// progress writes one line about the cell just done to cfg.Progress, if set.
func (s *session) progress(format string, args ...any) {
	s.done++
	if s.cfg.Progress != nil {
		fmt.Fprintf(s.cfg.Progress, "bench [%d/%d] "+format+"\n", append([]any{s.done, s.total}, args...)...)
	}
}

// writeScripts copies the pgbench scripts into a new temporary directory, which the caller
// removes.
func writeScripts() (string, error) {
	dir, err := os.MkdirTemp("", "hotbench-")
	if err != nil {
		return "", err
	}
	for _, v := range variants {
		if v.script == "" {
			continue
		}
		b, err := scripts.ReadFile("pgbench/" + v.script)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, v.script), b, 0o644)
		}
		if err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// benchCampaign is each cell's campaign: 1 yen coupons and a budget no cell can spend, so that
// every request issues.
func benchCampaign(id string, stripes int) campaign.Campaign {
	return campaign.Campaign{ID: id, DiscountYen: 1, BudgetYen: math.MaxInt32, Stripes: stripes}
}

// runCell runs variant v with clients clients on a campaign of its own at round trip rtt (set
// on the proxy), and checks the rules afterwards.
func (s *session) runCell(ctx context.Context, v variant, rtt time.Duration, clients int) (Result, error) {
	r := Result{Variant: v.name, RTT: rtt, Clients: clients}
	id := fmt.Sprintf("HOT-%dns-%d-%s", rtt.Nanoseconds(), clients, v.slug)
	if v.stripes == 0 {
		if _, err := s.pool.Exec(ctx, `INSERT INTO bench_hot_row (campaign_id, stripe, discount_yen, budget_yen) VALUES ($1, 0, 1, $2)`,
			id, math.MaxInt32); err != nil {
			return r, err
		}
	} else if err := campaign.Create(ctx, s.pool, benchCampaign(id, v.stripes)); err != nil {
		return r, err
	}
	var lat []time.Duration
	var wall time.Duration
	cpu, err := s.serverCPU(func() error {
		var err error
		if v.script != "" {
			lat, r.Failed, wall, err = pgbench(ctx, s.cfg, s.pgbenchURL, s.dir, v.script, clients, id)
		} else {
			lat, r.Failed, wall, err = closedLoop(ctx, s.cfg.Issue, clients, s.cfg.Duration, id)
		}
		return err
	})
	if err != nil {
		return r, err
	}
	r.PGCPUMs = cpu
	r.Done = int64(len(lat))
	r.TPS = float64(r.Done) / wall.Seconds()
	r.P50Ms, r.P99Ms = percentileMs(lat, 50), percentileMs(lat, 99)
	want := r.Done // one coupon per transaction or ISSUED answer; none for the bare UPDATE
	if v.stripes == 0 {
		want = 0
	}
	r.Rules, err = checkRules(ctx, s.pool, id, want)
	return r, err
}

// serverCPU runs load and returns the CPU the database server used meanwhile, in
// core-milliseconds (0 without Config.ServerCPU), or the first error.
func (s *session) serverCPU(load func() error) (float64, error) {
	if s.cfg.ServerCPU == nil {
		return 0, load()
	}
	before, err := s.cfg.ServerCPU()
	if err != nil {
		return 0, err
	}
	if err := load(); err != nil {
		return 0, err
	}
	after, err := s.cfg.ServerCPU()
	return float64(after-before) / float64(time.Millisecond), err
}

// checkRules runs package reconcile over the whole database and checks that campaign id holds
// exactly want coupons; it returns "held", or what broke joined with the caller's own findings,
// wrong.
func checkRules(ctx context.Context, pool *pgxpool.Pool, id string, want int64, wrong ...string) (string, error) {
	rep, err := reconcile.Check(ctx, pool)
	if err != nil {
		return "", err
	}
	wrong = append(rep.Violations(), wrong...)
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
	var members atomic.Int64
	return clientLoop(ctx, clients, d, func(ctx context.Context) bool {
		res, err := issue(ctx, fmt.Sprintf("h%s-%d", campaignID, members.Add(1)), campaignID)
		return err == nil && res == "ISSUED"
	})
}

// clientLoop runs clients goroutines for d, each calling one request after another until then
// (or until ctx ends), and returns the latencies of the requests one answered true (issued), the
// count of the others (other answers and failures), the wall time and ctx's error.
func clientLoop(ctx context.Context, clients int, d time.Duration, one func(context.Context) bool) ([]time.Duration, int64, time.Duration, error) {
	var (
		mu     sync.Mutex
		lat    []time.Duration
		failed atomic.Int64
		wg     sync.WaitGroup
	)
	start := time.Now()
	stop := start.Add(d)
	for range clients {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(stop) && ctx.Err() == nil {
				t0 := time.Now()
				if !one(ctx) {
					failed.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return lat, failed.Load(), time.Since(start), ctx.Err()
}

var (
	tpsLine     = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)
	failedLine  = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	abortedLine = regexp.MustCompile(`(?m)client \d+ aborted`)
)

// pgbench runs script with clients clients for cfg.Duration against dbURL (prepared statements,
// which pipelines need, campaign set to campaignID, one thread per core at most) and returns the
// per-transaction latencies from its log, failures (failed transactions plus aborted clients)
// and the run's length. pgbench exits 2 when a client aborted; that is a measured failure.
func pgbench(ctx context.Context, cfg Config, dbURL, dir, script string, clients int, campaignID string) ([]time.Duration, int64, time.Duration, error) {
	logDir, err := os.MkdirTemp(dir, "log-")
	if err != nil {
		return nil, 0, 0, err
	}
	defer os.RemoveAll(logDir)
	secs := max(1, int(cfg.Duration.Round(time.Second).Seconds()))
	cmd := exec.CommandContext(ctx, cfg.Pgbench, "-n", "-M", "prepared",
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, runtime.NumCPU())),
		"-T", strconv.Itoa(secs), "-D", "campaign="+campaignID, "-f", filepath.Join(dir, script),
		"-l", "--log-prefix", filepath.Join(logDir, "tx"), dbURL)
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

// runSoldOut runs the sold-out cell on a campaign of its own at round trip rtt (set on the
// proxy): cfg.SoldOut's requests through IssueCoupon from clients clients, the answers timed,
// the rows the cell wrote counted from the statistics, and the rules checked afterwards.
func (s *session) runSoldOut(ctx context.Context, rtt time.Duration, clients int) (SoldOutResult, error) {
	so := s.cfg.SoldOut
	r := SoldOutResult{RTT: rtt, Clients: clients, Coupons: so.Coupons, Requests: so.Requests}
	id := fmt.Sprintf("SOLD-%dns-%d", rtt.Nanoseconds(), clients)
	if err := campaign.Create(ctx, s.pool, campaign.Campaign{ID: id, DiscountYen: 1, BudgetYen: so.Coupons, Stripes: so.Stripes}); err != nil {
		return r, err
	}
	conn, err := pgx.Connect(ctx, s.cfg.DBURL)
	if err != nil {
		return r, err
	}
	defer conn.Close(ctx)
	before, err := settledStats(ctx, s.pool, conn)
	if err != nil {
		return r, err
	}
	var answers []answer
	r.PGCPUMs, err = s.serverCPU(func() error {
		var err error
		answers, err = burst(ctx, s.cfg.Issue, clients, so.Requests, id)
		return err
	})
	if err != nil {
		return r, err
	}
	after, err := settledStats(ctx, s.pool, conn)
	if err != nil {
		return r, err
	}
	tally(&r, answers)
	r.RowsWritten = after.rows - before.rows
	r.StripeUpdates = after.stripeUpdates - before.stripeUpdates
	r.RefusalRows = r.RowsWritten - RowsPerIssue*r.Issued
	r.RolledBack = after.rolledBack - before.rolledBack
	var short []string
	if r.Issued != int64(so.Coupons) {
		short = append(short, fmt.Sprintf("sold %d of %d coupons", r.Issued, so.Coupons))
	}
	r.Rules, err = checkRules(ctx, s.pool, id, r.Issued, short...)
	return r, err
}

// answer is one request's result code ("" when none came) and when it came, since the first
// request was sent.
type answer struct {
	result string
	at     time.Duration
}

// burst sends requests requests for campaignID, one per new member, from clients clients, each
// sending its next as soon as the last is answered, and returns the answers.
func burst(ctx context.Context, issue IssueFunc, clients, requests int, campaignID string) ([]answer, error) {
	answers := make([]answer, requests)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(requests) && ctx.Err() == nil; i = next.Add(1) - 1 {
				res, err := issue(ctx, fmt.Sprintf("s%s-%d", campaignID, i), campaignID)
				if err != nil {
					res = ""
				}
				answers[i] = answer{result: res, at: time.Since(start)}
			}
		})
	}
	wg.Wait()
	return answers, ctx.Err()
}

// tally counts answers into r: the outcomes, the sell-out time and the rates before and after it.
func tally(r *SoldOutResult, answers []answer) {
	var soldOut, last time.Duration
	for _, a := range answers {
		last = max(last, a.at)
		switch a.result {
		case "ISSUED":
			r.Issued++
			soldOut = max(soldOut, a.at)
		case "BUDGET_EXCEEDED":
			r.Refused++
		default:
			r.Failed++
		}
	}
	var after int64
	for _, a := range answers {
		if a.result == "BUDGET_EXCEEDED" && a.at > soldOut {
			after++
		}
	}
	r.SoldOutSec = soldOut.Seconds()
	if soldOut > 0 {
		r.IssuedPerSec = float64(r.Issued) / soldOut.Seconds()
	}
	if last > soldOut {
		r.RefusedPerSec = float64(after) / (last - soldOut).Seconds()
	}
}

// writeStats are the cumulative statistics the sold-out cell reads: the rows inserted, updated
// and deleted in the three member tables an issuance writes, the updates of the budget stripes,
// and the database's rolled-back transactions.
type writeStats struct{ rows, stripeUpdates, rolledBack int64 }

const sqlWriteStats = `
SELECT (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint FROM pg_stat_user_tables
         WHERE schemaname = 'public'
           AND relname IN ('issued_coupons', 'member_monthly_usage', 'notification_outbox')),
       (SELECT coalesce(sum(n_tup_upd), 0)::bigint FROM pg_stat_user_tables
         WHERE schemaname = 'public' AND relname = 'campaign_budgets'),
       (SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database())`

// sqlEndSessions terminates every other client session of this database and role and returns
// their pids.
const sqlEndSessions = `
SELECT coalesce(array_agg(pid), '{}') FROM (
  SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity
   WHERE datname = current_database() AND usename = current_user
     AND backend_type = 'client backend' AND pid <> pg_backend_pid()) s`

// sqlSessionsLeft counts the sessions of pids $1 still running.
const sqlSessionsLeft = `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`

// sessionsEndTimeout bounds the wait for the terminated sessions to exit.
const sessionsEndTimeout = 10 * time.Second

// pgxpoolPingIdle is how long a pooled connection must have been idle for pgxpool to ping it
// before handing it out, and replace it when the ping fails: pgxpool's default ShouldPing
// (pgx v5, pgxpool/pool.go: IdleDuration > time.Second), plus a margin.
const pgxpoolPingIdle = time.Second + 50*time.Millisecond

// settledStats reads writeStats on conn once every other session of the database and role has
// ended, so that the counters hold all those sessions did. A PostgreSQL 15 backend keeps its
// counters to itself and flushes them to shared memory as it goes idle, at most once a second
// (PostgreSQL 15 docs, 28.2.2 "Viewing Statistics"), and when that flush finds the shared
// entries locked it retries 10 s later, or holds them up to 60 s (pgstat.c: PGSTAT_MIN_INTERVAL,
// PGSTAT_IDLE_INTERVAL, PGSTAT_MAX_INTERVAL): a pooled connection idle after the cell may hold
// its last rows back that long, so waiting for the counters to stop moving is not exact. As it
// exits, a backend flushes whatever is pending, unconditionally: so settledStats ends the
// sessions (see [endSessions]). The sessions are the served IssueCoupon's pooled connections
// through the proxy, pgbench's last, and pool's, which is reset first so that it never hands out
// a dead connection. conn writes nothing and rolls nothing back. IssueCoupon's pool replaces
// a dead connection by itself: pgxpool pings a connection idle for over a second before handing
// it out, so settledStats returns only once that second has passed since the sessions ended.
// The bench's database must have no other writer of the role.
func settledStats(ctx context.Context, pool *pgxpool.Pool, conn *pgx.Conn) (writeStats, error) {
	pool.Reset()
	ended := time.Now()
	if err := endSessions(ctx, conn); err != nil {
		return writeStats{}, err
	}
	var s writeStats
	if err := conn.QueryRow(ctx, sqlWriteStats).Scan(&s.rows, &s.stripeUpdates, &s.rolledBack); err != nil {
		return s, fmt.Errorf("reading statistics: %w", err)
	}
	time.Sleep(time.Until(ended.Add(pgxpoolPingIdle)))
	return s, nil
}

// endSessions terminates every other client session of conn's database and role and waits,
// at most [sessionsEndTimeout], until they have left pg_stat_activity. A backend leaving it has
// flushed its statistics: the flush is a before_shmem_exit callback (pgstat_shutdown_hook),
// the removal an on_shmem_exit one (pgstat_beshutdown_hook), and PostgreSQL runs every callback
// of the first kind before any of the second (storage/ipc/ipc.c, shmem_exit).
func endSessions(ctx context.Context, conn *pgx.Conn) error {
	var pids []int32
	if err := conn.QueryRow(ctx, sqlEndSessions).Scan(&pids); err != nil {
		return fmt.Errorf("ending sessions for their statistics: %w", err)
	}
	deadline := time.Now().Add(sessionsEndTimeout)
	for {
		var left int
		if err := conn.QueryRow(ctx, sqlSessionsLeft, pids).Scan(&left); err != nil {
			return err
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d terminated sessions still running after %s", left, sessionsEndTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Formats are the table formats [WriteTable] knows.
var Formats = []string{"text", "markdown"}

// WriteTable writes rep's cells as a table, one row per cell, with each cell's throughput as a
// ratio of the bare one-row UPDATE's at the same round trip and client count, and of its own at
// round trip 0 (the proxy adding nothing); then the sold-out, live-changes, release-herd and
// dry-run cells, if any, each as a table of its own.
func WriteTable(w io.Writer, format string, rep Report) error {
	if !slices.Contains(Formats, format) {
		return fmt.Errorf("hotbench: format %q: want one of %s", format, strings.Join(Formats, ", "))
	}
	ratio := func(r Result, variant string, rtt time.Duration) string {
		i := slices.IndexFunc(rep.Cells, func(b Result) bool {
			return b.Variant == variant && b.RTT == rtt && b.Clients == r.Clients
		})
		if i < 0 || rep.Cells[i].TPS == 0 {
			return ""
		}
		return strconv.FormatFloat(r.TPS/rep.Cells[i].TPS, 'f', 2, 64) + "x"
	}
	rows := [][]string{{"rtt", "clients", "variant", "per s", "p50 ms", "p99 ms", "vs bare UPDATE", "vs rtt 0", "failed", "rules"}}
	align := "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"
	if rep.ServerCPU {
		rows[0] = slices.Insert(rows[0], 8, CPUColumn)
		align = "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"
	}
	for _, r := range rep.Cells {
		row := []string{rttLabel(r.RTT), strconv.Itoa(r.Clients), r.Variant, fmtFloat(r.TPS, 0),
			fmtFloat(r.P50Ms, 1), fmtFloat(r.P99Ms, 1), ratio(r, BareUpdate, r.RTT), ratio(r, r.Variant, 0),
			strconv.FormatInt(r.Failed, 10), r.Rules}
		if rep.ServerCPU {
			row = slices.Insert(row, 8, perCoupon(r.PGCPUMs, r.Done))
		}
		rows = append(rows, row)
	}
	if err := writeRows(w, format, rows, align); err != nil {
		return err
	}
	return writeExtras(w, format, rep)
}

// writeExtras writes rep's optional cells, each kind as a table of its own after a blank line.
func writeExtras(w io.Writer, format string, rep Report) error {
	if err := writeSoldOut(w, format, rep.ServerCPU, rep.SoldOut); err != nil {
		return err
	}
	if len(rep.Changes) > 0 {
		fmt.Fprintln(w)
		if err := writeChanges(w, format, rep.Changes); err != nil {
			return err
		}
	}
	if err := writeRelease(w, format, rep.Release); err != nil {
		return err
	}
	if err := writeDryRuns(w, format, rep.ServerCPU, rep.DryRuns); err != nil {
		return err
	}
	if err := writeReadPool(w, format, rep); err != nil {
		return err
	}
	return writeStore(w, format, rep.ServerCPU, rep.Store)
}

// CPUColumn heads the column of the database server's CPU per coupon: the core-milliseconds
// its processes used during the cell's load (Config.ServerCPU) over the coupons issued, or
// over the transactions for the bare UPDATE, which issues none; in the sold-out table, over the
// coupons issued, the refusals' CPU included.
const CPUColumn = "PG core-ms per coupon"

// perCoupon formats cpuMs over n, two decimals; empty when n is 0.
func perCoupon(cpuMs float64, n int64) string {
	if n == 0 {
		return ""
	}
	return fmtFloat(cpuMs/float64(n), 2)
}

// writeSoldOut writes the sold-out cells, if any, as a table after a blank line, with the
// server's CPU per coupon when cpu is set.
func writeSoldOut(w io.Writer, format string, cpu bool, cells []SoldOutResult) error {
	if len(cells) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	rows := [][]string{{"rtt", "clients", "coupons", "requests", "issued", "refused", "failed", "sold out s", "issued/s",
		"refused/s after", "member rows written", "by refusals", "stripe updates", "rolled back", "rules"}}
	align := "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
	if cpu {
		rows[0] = slices.Insert(rows[0], 14, CPUColumn)
		align = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
	}
	for _, r := range cells {
		row := []string{rttLabel(r.RTT), strconv.Itoa(r.Clients), strconv.Itoa(r.Coupons),
			strconv.Itoa(r.Requests), strconv.FormatInt(r.Issued, 10), strconv.FormatInt(r.Refused, 10),
			strconv.FormatInt(r.Failed, 10), fmtFloat(r.SoldOutSec, 2), fmtFloat(r.IssuedPerSec, 0),
			fmtFloat(r.RefusedPerSec, 0), strconv.FormatInt(r.RowsWritten, 10), strconv.FormatInt(r.RefusalRows, 10),
			strconv.FormatInt(r.StripeUpdates, 10), strconv.FormatInt(r.RolledBack, 10), r.Rules}
		if cpu {
			row = slices.Insert(row, 14, perCoupon(r.PGCPUMs, r.Issued))
		}
		rows = append(rows, row)
	}
	return writeRows(w, format, rows, align)
}

// writeRows writes rows, the first one the header, aligned in columns (text) or as a markdown
// table with alignment row align under the header.
func writeRows(w io.Writer, format string, rows [][]string, align string) error {
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
			fmt.Fprintln(w, align)
		}
	}
	return nil
}

// rttLabel names a round trip in the tables, in milliseconds; 0 is the proxy adding nothing.
func rttLabel(d time.Duration) string {
	if d == 0 {
		return "0 (proxy only)"
	}
	return fmtFloat(float64(d)/float64(time.Millisecond), -1) + " ms"
}

func fmtFloat(f float64, decimals int) string { return strconv.FormatFloat(f, 'f', decimals, 64) }
