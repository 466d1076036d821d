package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/functions/redeem"
	"github.com/mops/coupon-api/internal/lab/hotbench"
	"github.com/mops/coupon-api/internal/lab/isolationlab"
	"github.com/mops/coupon-api/internal/lab/latencyproxy"
	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/shared/envconf"
	"github.com/mops/coupon-api/shared/issuance"
)

func benchCmd() *cobra.Command {
	var (
		clients  []int
		rtts     []time.Duration
		duration time.Duration
		pgbench  string
		format   string
		soldOut  bool
		changes  bool
		release  bool
		dryRuns  bool
		store    bool
		redeemAt float64
		standby  time.Duration
		readPool bool
		inst     instancesOptions
		history  historyFlags
	)
	c := &cobra.Command{
		Use:   "bench",
		Short: "One hot campaign on one PostgreSQL at added network round trips: IssueCoupon over HTTP (1 and 16 stripes) against pgbench (bare UPDATE, issue_coupon(), the same writes pipelined, the write-up's transaction)",
		Long: `bench measures one hot campaign six ways on one durable PostgreSQL, at each --rtt round trip
and each --clients count, each cell for --duration (pgbench runs -M prepared, the scripts are in
internal/lab/hotbench/pgbench/):

  pgbench: bare one-row UPDATE      the ceiling of one hot row (bare-update.sql)
  pgbench: issue_coupon(), 1 round trip
                                    the timeouts and issue_coupon() in one pipeline, as IssueCoupon
                                    calls it (function.sql), 1 stripe
  pgbench: same writes pipelined, no function
                                    the same writes as plain statements in one pipeline, each guard
                                    aborting it on a miss (pipelined.sql), 1 stripe: the alternative
                                    to the function
  pgbench: the write-up's transaction, 9 round trips
                                    the design write-up's first transaction (docs/design.md,
                                    seed.sql), 1 stripe: a reference
  IssueCoupon, 1 stripe             the product over HTTP: the functions framework on loopback, as
                                    ` + "`couponctl demo`" + ` serves it, pool of max(--clients) connections
  IssueCoupon, 16 stripes           the same on a campaign of 16 budget stripes

Every request is a new member of a campaign with room for all, so every answer should be ISSUED.
Every cell's traffic to PostgreSQL, pgbench's and IssueCoupon's pool's, goes through a latency
proxy on 127.0.0.1 that adds the --rtt round trip, half each way (internal/lab/latencyproxy; 0 is the
proxy adding nothing, the table's "0 (proxy only)"). After each cell the rules are checked from
the tables (package reconcile) and the cell's coupons counted against its ISSUED answers or
pgbench transactions. The table gives throughput, p50/p99 latency and each cell's ratio to the
bare UPDATE at the same round trip and client count, and to its own rate at round trip 0.

--sold-out adds one cell per round trip and client count: a first-come campaign of 1,000 coupons
of 1 yen on 16 stripes and 20,000 requests, each from a new member, through IssueCoupon. Its own table
gives the time to sell out (first request to last ISSUED answer), issued/s until then,
BUDGET_EXCEEDED refusals/s after it, the rows the cell wrote to issued_coupons,
member_monthly_usage and notification_outbox minus 3 per coupon issued (the rows written by
refusals, and by attempts undone), the updates of its budget stripes (one per call and stripe:
fewer than coupons when calls are coalesced) and the transactions it rolled back
(pg_stat_user_tables, pg_stat_database). To count exactly, bench ends the database's other sessions of its role before and
after the cell (a session flushes its statistics as it exits; pools replace the connections).

--changes adds one cell per round trip and client count: IssueCoupon on a campaign of 16 stripes
for --duration while an operator, through the same proxy, changes it every 500 ms, in turn: a
budget raise, a re-stripe (16 to 17 stripes and back), a pause followed at once by a resume (the
couponctl campaign verbs' code). Its table gives, per kind, how long a change took from the
operator's call to its answer (an upper bound on how long it held the stripes: it commits in the
server as its pipeline ends), and the p99 of the requests in flight during those changes, beside
the p99 of the requests during none. Answers CAMPAIGN_NOT_ACTIVE during a pause are counted too.

--release-herd adds one cell per round trip and client count: the herd at a release's second. A
campaign of 300 coupons of 1 yen on 16 stripes, all released at one instant 2 s after it is made
(the database's clock), and the clients sending through IssueCoupon from then on, each request a
new member, until 1 s after the release. Its table gives, for that first second: the coupons issued
(issued_at in it, by SQL), the requests sent in it, those refused (BUDGET_EXCEEDED once sold out,
CAMPAIGN_NOT_ACTIVE from a read just before the instant) and failed, their p50 and p99, and the p99
of the NOT_STARTED answers before the release; a coupon issued before the release breaks the rules.

--dry-runs adds one cell per round trip and client count: what a herd of dry runs (the app's
button, "dry_run": true) costs a hot campaign's load. IssueCoupon on a campaign of 16 stripes
for --duration, alone, then beside 64 more clients asking dry runs of the same campaign, each for
a new member, together one dry run for each coupon the load issued a second alone (each member
looks at the button before tapping); three turns of each, alternating, each on a campaign of its
own. Its table gives the issued/s of each turn, the median beside over the median alone (issue 33
asks at least 0.90), and the dry runs' rate and p99; on the throwaway server also where the CPU
went: the server's core-ms per coupon alone, per dry run (its CPU beside, less the coupons beside
at the cost alone) and the herd's share of its CPU beside, and the same per coupon and per dry run
for bench's own process (the clients, the latency proxy and IssueCoupon, which share the machine's
cores with the server here; deployed, only the database is shared).

--read-pool, with --dry-runs, starts a streaming (asynchronous) replica of the throwaway server
and serves IssueCoupon with DATABASE_READ_URL on it: the dry runs go there, back to the primary
past ISSUE_DRY_RUN_MAX_LAG (issue 42). A table of its own gives the primary's core-ms per coupon
in each turn alone and beside the herd and their medians' ratio (issue 42 asks within 10%), the
primary's core-ms per dry run (near 0) and the replica's; a last line how many dry runs the
replica answered and its lag as it measured it in each answer (median, p99, largest).

--store-opening adds one cell per round trip and client count: a store opening beside a hot
campaign (issue 41). IssueCoupon on a campaign of 16 stripes for --duration, alone, then beside
32 more clients redeeming through RedeemCoupon, at most --redeem-rate a second (2,000), coupons of another
campaign issued before the cell (one statement, as the issuance writes them), each coupon once;
three turns of each, alternating, each on a hot campaign of its own. Its table gives the issued/s
and p99 of each turn, the median beside over the median alone, the redemptions' rate and p99,
and on the throwaway server the server's core-ms per coupon alone and per redemption. After the
cell, the coupons redeemed (SQL) must equal the REDEEMED answers.

--standby DUR gives the throwaway server a synchronous streaming standby (pg_basebackup, on the same
machine) whose replication connection goes through a latency proxy of its own adding the DUR
round trip: synchronous_standby_names '*', so every commit waits until the standby has flushed
it, as a regional HA database's does (Cloud SQL HA writes to a disk in a second zone). Every cell
runs with it. It needs the throwaway server: refused with DATABASE_URL set.

--history N runs other cells instead: the issuance over a year of history against an empty
database on the same server (internal/lab/hotbench, History and HistoryBench). It first builds
N coupons over 12 months, 100 campaigns a month and N/4 members (about 1% voided; counters
exact; the outbox as a daily prune leaves it: the last month's rows sent, the older ones pruned)
with set-based INSERT ... SELECT generate_series in chunks of 250,000, printing coupons/s and the
time left, then vacuums it; checks it with package reconcile; prints its indexes' bytes per coupon and the time of
a no-op migrate, campaign show and campaign list on it. Then --turns turns, alternating the empty
and the history database (both ANALYZEd before each turn, so that neither runs on the plans of
tables it has since outgrown), each turn a hot campaign of 16 stripes and a cold mix of 200 campaigns,
--duration each, with the largest --clients in a closed loop through issuance.Service (no HTTP,
no proxy; ISSUE_BATCH_MAX as serving), each request a distinct member of the history. Per cell:
issued/s, p50, p99, and per issue_coupons_batch_v3 call the blocks read from outside
shared_buffers and dirtied (pg_stat_statements, when the server loads it; the throwaway server
does). --history 0 measures an empty database against another (the A/A spread). The history
lives in database bench_history_N_IDS (--history-ids v4 or v7); --keep-history leaves it for the
next run, which measures it again without building it.

--history N --jobs measures the two daily jobs on that history instead (issue 42, "the daily
jobs keep up"), --turns turns each. Reconcile, through package reconcile as ` + "`couponctl reconcile`" + `
runs it: one clean full run recorded as the base; then --changed coupons changed since (default
1% of N, at least 1,000): that many issued now to new members of new campaigns, set-based with
their usage rows, outbox rows and counters, and a tenth as many of the history's old coupons
voided with their yen given back; then turns of a full run and an incremental one, each
incremental continuing from the base (the runs a turn records are deleted after it), every run
clean or bench fails. Its table gives each run's seconds and load, the medians and spreads, the
incremental seconds per changed coupon and, from it, a run at 10x N with 1% changed against the
60 s goal. Then the outbox prune: a warm-up, then --turns rounds of three --duration turns:
the hot campaign of the history cells alone, beside
` + "`outbox prune`" + `'s own loop with its defaults (1,000 rows a statement, 100ms pause) on a
connection of its own, and alone again (beside's ratio is over the mean of the two, so that a
rate drifting through the round counts for neither; the second alone over the first is the A/A
pair). The backlog is the history's last month of sent outbox rows, N/12, with
--older-than set so that all are prunable; bench fails if it runs out within a turn (at the
5,000-7,000 rows/s measured, the 25,000 rows of N = 300,000 give three beside turns of 1s). Its
table gives per turn the issued/s and p99 and those ratios, the rows pruned a second, the WAL bytes a pruned row of the prune's own statements
(pg_stat_statements wal_bytes before and after the turn) and of the whole server in the turn
(pg_current_wal_lsn, the issuance's included), the load, and the goal lines (2,048 bytes a row;
the issuance beside at 0.9x or better). With --keep-history the
history is kept as the jobs left it: changed, and its backlog pruned.

The tables' "` + hotbench.CPUColumn + `" is the CPU of the throwaway PostgreSQL, user and system
(procfs utime+stime of the postmaster and all its processes, the backends that exited included),
used during the cell's load, over the coupons issued: over the transactions for the bare UPDATE,
which issues none; in the sold-out table over the coupons, the refusals' CPU included. The
standby's CPU is not in it. Not measured on DATABASE_URL's server.

IssueCoupon coalesces as ISSUE_BATCH_MAX says (its environment, as serving does; 1 is off); the
first line of the output gives the value.

Progress goes to stderr. Database: DATABASE_URL, a postgres:// URL with a TCP host (its user must
be allowed to CREATE DATABASE: bench works in a database of its own, dropped at the end), or a
throwaway durable PostgreSQL (fsync and synchronous_commit on) when unset. Needs pgbench (Debian:
postgresql-15) and Linux (the proxy waits on timerfd). A benchmark, not a test: the machine
decides the figures; compare them only within one table.` + instancesHelp,
		Example: `  couponctl bench
  couponctl bench --rtt 0,0.5ms,1ms --clients 32 --duration 5s --sold-out
  couponctl bench --rtt 1ms --clients 32 --duration 20s --changes
  couponctl bench --clients 64 --duration 5s --release-herd
  couponctl bench --clients 32 --duration 5s --dry-runs
  couponctl bench --clients 32 --duration 5s --store-opening
  couponctl bench --clients 32 --duration 5s --format markdown
  couponctl bench --standby 1ms --rtt 1ms --clients 1,32,256 --sold-out --format markdown
  couponctl bench --instances 1,4,8,16 --clients 32,128 --duration 5s --loads hot-16
  couponctl bench --history 20000000 --clients 32 --duration 20s --turns 3 --keep-history
  couponctl bench --history 300000 --jobs --clients 32 --duration 1s --turns 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkModes(cmd.Flags(), format); err != nil {
				return err
			}
			if err := checkClients(clients); err != nil {
				return err
			}
			if cmd.Flags().Changed("history") {
				history.changedGiven = cmd.Flags().Changed("changed")
				return historyBench(cmd, history, clients, duration)
			}
			if len(inst.instances) > 0 {
				return runInstancesBench(cmd, inst, clients, duration, format)
			}
			if err := checkRTTFlag(rtts); err != nil {
				return err
			}
			if duration < time.Second {
				return flagError("--duration %s: want at least 1s (pgbench runs whole seconds)", duration)
			}
			if err := checkStandby(standby); err != nil {
				return err
			}
			if err := cmp.Or(checkReadPool(readPool, dryRuns, standby), hotbench.CheckPgbench(pgbench)); err != nil {
				return err
			}
			cfg := hotbench.Config{Pgbench: pgbench, RTTs: rtts, Clients: clients, Duration: duration}
			cfg.SoldOut, cfg.Changes = optional(soldOut, hotbench.BlackFriday), optional(changes, hotbench.LiveChanges)
			cfg.Release, cfg.DryRuns = optional(release, hotbench.TenOClock), optional(dryRuns, hotbench.ButtonHerd)
			var err error
			if cfg.Store, err = storeCell(store, redeemAt); err != nil {
				return err
			}
			return runBench(cmd, cfg, format, standby, readPool)
		},
	}
	f := c.Flags()
	f.IntSliceVar(&clients, "clients", []int{8, 32, 64}, "concurrent clients of each cell")
	f.DurationSliceVar(&rtts, "rtt", []time.Duration{0}, "round trips the proxy adds to every cell's traffic, Go durations such as 0,0.5ms,1ms")
	f.DurationVar(&duration, "duration", 10*time.Second, "length of each cell (whole seconds); the sold-out cell runs until its requests are answered")
	f.StringVar(&pgbench, "pgbench", hotbench.DefaultPgbench, "the pgbench binary")
	f.StringVar(&format, "format", "text", "table format: "+strings.Join(hotbench.Formats, ", "))
	f.BoolVar(&soldOut, "sold-out", false, "add a sold-out cell per round trip and client count (1,000 coupons, 16 stripes, 20,000 requests)")
	f.DurationVar(&standby, "standby", 0, "a synchronous standby of the throwaway server behind a proxy adding this round trip (0: none)")
	f.BoolVar(&release, "release-herd", false, "add a release-herd cell per round trip and client count (300 coupons on 16 stripes released 2 s into the herd; its first second)")
	f.BoolVar(&dryRuns, "dry-runs", false, "add a dry-run cell per round trip and client count (16 stripes, alone and beside 64 clients asking a dry run per coupon issued, 3 turns each)")
	f.BoolVar(&readPool, "read-pool", false, "with --dry-runs: a streaming replica of the throwaway server answers IssueCoupon's dry runs (DATABASE_READ_URL); adds the primary's CPU per coupon alone and beside, per dry run, and the replica's lag")
	f.BoolVar(&store, "store-opening", false, "add a store-opening cell per round trip and client count (16 stripes, alone and beside 32 clients redeeming up to 2,000 coupons/s, 3 turns each)")
	f.Float64Var(&redeemAt, "redeem-rate", hotbench.StoreRush.Rate, "with --store-opening: redemptions a second at most")
	f.Int64Var(&history.coupons, "history", 0, "measure the issuance over a history of this many coupons, built first, against an empty database (see above)")
	f.StringVar(&history.ids, "history-ids", "v7", "with --history: the history's coupon ids, v4 (releases before issue 42) or v7")
	f.IntVar(&history.turns, "turns", 3, "with --history: turns on each database, alternating (0: build and describe the history only)")
	f.BoolVar(&history.keep, "keep-history", false, "with --history: leave the history database for the next run")
	f.BoolVar(&history.jobs, "jobs", false, "with --history: measure the daily jobs (reconcile, outbox prune) on the history instead of the issuance cells (see above)")
	f.Int64Var(&history.changed, "changed", 0, "with --jobs: coupons issued after reconcile's base run (a tenth as many old ones voided); 0: 1% of the history, at least 1,000")
	f.BoolVar(&changes, "changes", false, "add a live-changes cell per round trip and client count (16 stripes; a raise, a re-stripe or a pause and resume every 500 ms)")
	addInstancesFlags(f, &inst)
	return c
}

// The flags that belong to one mode of bench only: the default cells, --instances or --history.
var (
	cellsFlags     = []string{"rtt", "pgbench", "sold-out", "changes", "release-herd", "dry-runs", "read-pool", "store-opening", "redeem-rate", "standby"}
	instancesFlags = []string{"loads", "serve-exe"}
	historyOnly    = []string{"history-ids", "turns", "keep-history", "jobs", "changed"}
)

// checkModes refuses a --format bench does not know, and flags given (f.Changed) that belong to
// another mode than the one bench runs (--history, else --instances, else the default cells),
// which that mode would ignore: usage errors naming the flags that do not go together.
func checkModes(f *pflag.FlagSet, format string) error {
	if !slices.Contains(hotbench.Formats, format) {
		return flagError("--format %q: want one of %s", format, strings.Join(hotbench.Formats, ", "))
	}
	mode, foreign := "", slices.Concat(instancesFlags, historyOnly)
	switch {
	case f.Changed("history"):
		// The history table has one format, text.
		mode, foreign = "--history", slices.Concat(cellsFlags, instancesFlags, []string{"instances", "format"})
	case f.Changed("instances"):
		mode, foreign = "--instances", slices.Concat(cellsFlags, historyOnly)
	}
	var given []string
	for _, name := range foreign {
		if f.Changed(name) {
			given = append(given, "--"+name)
		}
	}
	switch {
	case len(given) == 0:
		return nil
	case mode == "" && slices.Contains(historyOnly, strings.TrimPrefix(given[0], "--")):
		return flagError("%s: only with --history", given[0])
	case mode == "":
		return flagError("%s: only with --instances", given[0])
	}
	return flagError("%s does not go with %s: %s runs only its own cells", mode, strings.Join(given, ", "), mode)
}

// checkClients refuses --clients when empty, with a count under 1, or with a count given twice
// (pgbench's cells of one count would be run twice and collide): usage errors.
func checkClients(clients []int) error {
	if len(clients) == 0 || slices.Min(clients) < 1 {
		return flagError("--clients: give one or more client counts, each at least 1")
	}
	sorted := slices.Sorted(slices.Values(clients))
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return flagError("--clients: %d given twice; give each client count once", sorted[i])
		}
	}
	return nil
}

// checkRTTFlag refuses --rtt rtts when empty or not [hotbench.CheckRTTs]' (a usage error).
func checkRTTFlag(rtts []time.Duration) error {
	if len(rtts) == 0 {
		return flagError("--rtt: give one or more round trips, such as 0,0.5ms,1ms")
	}
	if err := hotbench.CheckRTTs(rtts); err != nil {
		return flagError("--rtt: %w", err)
	}
	return nil
}

// checkStandby refuses a negative --standby, and one with DATABASE_URL set.
func checkStandby(standby time.Duration) error {
	if standby < 0 {
		return flagError("--standby %s: must not be negative", standby)
	}
	if standby > 0 && os.Getenv("DATABASE_URL") != "" {
		return flagError("--standby: bench adds a standby only to its throwaway server; unset DATABASE_URL")
	}
	return nil
}

// storeCell is the store-opening cell when on (nil when not), its redemptions at rate a second:
// a usage error for a rate that is not a finite number above 0.
func storeCell(on bool, rate float64) (*hotbench.StoreOpening, error) {
	if !(rate > 0) || math.IsInf(rate, 1) {
		return nil, flagError("--redeem-rate %g: want a finite number of redemptions a second, above 0", rate)
	}
	return optional(on, hotbench.StoreOpening{Herd: hotbench.StoreRush.Herd, Rounds: hotbench.StoreRush.Rounds, Rate: rate}), nil
}

// optional is a copy of cell when on, else nil: an optional cell of the bench.
func optional[T any](on bool, cell T) *T {
	if !on {
		return nil
	}
	return &cell
}

// runBench runs the bench of cfg (its flags) on DATABASE_URL or a throwaway server (with a
// synchronous standby standby away, if not 0): a fresh database, the latency proxy in front of
// it, IssueCoupon served through the proxy, and the table to stdout.
func runBench(cmd *cobra.Command, cfg hotbench.Config, format string, standby time.Duration, readPool bool) error {
	ctx := cmd.Context()
	errOut := cmd.ErrOrStderr()
	batchMax, err := envconf.IntIn("ISSUE_BATCH_MAX", issuance.DefaultBatchMax, 1, issuance.MaxBatchMax)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	serverURL, serverCPU, stop, rp, err := benchServers(ctx, cmd, exe, standby, readPool)
	if err != nil {
		return err
	}
	defer stop()
	fresh, err := isolationlab.OnServer(serverURL)
	if err != nil {
		return err
	}
	dbURL, drop, err := fresh(ctx)
	if err != nil {
		return err
	}
	defer drop()
	proxy, proxied, err := hotbench.Through(dbURL, func(target string) (hotbench.Proxy, error) {
		return latencyproxy.StartProcess(exe, latencyProxyVerb, target)
	})
	if err != nil {
		return err
	}
	defer proxy.Close()
	out := cmd.OutOrStdout() // taken before the functions' log lines go to a file
	logs, err := captureLogs()
	if err != nil {
		return err
	}
	defer func() {
		logs.restore()
		logs.finish(errOut, "")
	}()
	top := slices.Max(cfg.Clients)
	srv, err := rp.serveBenched(ctx, proxied, dbURL, top) // one connection per client, as pgbench has
	if err != nil {
		return err
	}
	defer srv.close()
	baseURL := srv.url
	fmt.Fprintf(errOut, "IssueCoupon on %s/IssueCoupon (pool of %d), it and pgbench through the latency proxy on %s; %d cells\n",
		baseURL, top, proxy.Addr(), cfg.Cells())
	if err := writeMachine(ctx, out, dbURL, standby, batchMax); err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: top}, Timeout: issuance.AppTimeout}
	send := httpIssuer(client, baseURL+"/IssueCoupon")
	cfg.DBURL, cfg.Proxy, cfg.Progress, cfg.ServerCPU = dbURL, proxy, errOut, serverCPU
	cfg.Issue = func(ctx context.Context, memberID, campaignID string) (string, error) {
		return send(ctx, silverweek.Request{MemberID: memberID, CampaignID: campaignID})
	}
	cfg.DryRun = httpDryRun(client, baseURL+"/IssueCoupon")
	cfg.Redeem = httpRedeem(client, baseURL+"/RedeemCoupon")
	rp.instrument(&cfg, client, baseURL+"/IssueCoupon")
	rep, err := hotbench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	return rp.writeTable(out, format, rep)
}

// httpDryRun asks IssueCoupon at url for a dry run ("dry_run": true) of one member and campaign
// and returns its result code.
func httpDryRun(client *http.Client, url string) hotbench.IssueFunc {
	return func(ctx context.Context, memberID, campaignID string) (string, error) {
		_, result, err := postForResult(ctx, client, url, map[string]any{"member_id": memberID, "campaign_id": campaignID, "dry_run": true})
		return result, err
	}
}

// httpRedeem asks RedeemCoupon at url to redeem one coupon of a member for an order and returns
// its result code.
func httpRedeem(client *http.Client, url string) hotbench.RedeemFunc {
	return func(ctx context.Context, couponID, memberID, orderID string) (string, error) {
		_, result, err := postForResult(ctx, client, url, map[string]any{"action": "redeem", "coupon_id": couponID,
			"member_id": memberID, "order_id": orderID})
		return result, err
	}
}

// benchServer returns the server bench works on: DATABASE_URL's, or a throwaway durable one
// whose CPU it can read, with a synchronous standby behind a latency proxy (a process of its
// own, exe's latency-proxy verb) adding the round trip standby when that is not 0. Call stop
// when done: it stops the standby before the server.
func benchServer(ctx context.Context, cmd *cobra.Command, exe string, standby time.Duration) (url string, cpu func() (time.Duration, error), stop func(), err error) {
	if os.Getenv("DATABASE_URL") != "" {
		url, stop, err := databaseOrThrowaway(ctx, cmd)
		return url, nil, stop, err
	}
	srv, err := startThrowaway(ctx, cmd)
	if err != nil {
		return "", nil, nil, err
	}
	stops := []func(){func() { _ = srv.Stop() }}
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if standby > 0 {
		repl, err := latencyproxy.StartProcess(exe, latencyProxyVerb, fmt.Sprintf("127.0.0.1:%d", srv.Port()))
		if err != nil {
			stop()
			return "", nil, nil, err
		}
		stops = append(stops, repl.Close)
		if err := repl.SetRTT(standby); err != nil {
			stop()
			return "", nil, nil, err
		}
		sb, err := srv.StartStandby(ctx, repl.Addr())
		if err != nil {
			stop()
			return "", nil, nil, err
		}
		stops = append(stops, func() { _ = sb.Stop() })
		if err := srv.RequireSyncStandby(ctx); err != nil {
			stop()
			return "", nil, nil, err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "synchronous standby on 127.0.0.1:%d, replicating through the proxy on %s (+%s round trip)\n",
			sb.Port(), repl.Addr(), standby)
	}
	return srv.URL(), srv.CPUTime, stop, nil
}

// serveBenchedIssueCoupon serves IssueCoupon and RedeemCoupon in this process as the demo does
// (see [serveLocal]), each with its pool of poolSize connections on dbURL.
func serveBenchedIssueCoupon(ctx context.Context, dbURL string, poolSize int) (*localServer, error) {
	poolURL, err := withPoolSize(dbURL, poolSize)
	if err != nil {
		return nil, err
	}
	os.Setenv("DATABASE_URL", poolURL)
	return serveLocal(ctx, nil, issue.Function, redeem.Function)
}

// latencyProxyVerb is the hidden verb that runs bench's latency proxy in a process of its own
// (latencyproxy.Serve on its standard streams).
const latencyProxyVerb = "latency-proxy"

// latencyProxyCmd is bench's latency proxy process: `couponctl latency-proxy HOST:PORT`.
func latencyProxyCmd() *cobra.Command {
	return &cobra.Command{
		Use:    latencyProxyVerb + " HOST:PORT",
		Short:  "bench's latency proxy, run by bench in a process of its own",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return latencyproxy.Serve(args[0], cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
}

// writeMachine prints what the figures were measured on: date, cores, Go, the PostgreSQL
// server's version, durability settings and synchronous standbys (pg_stat_replication, with the
// round trip standby the bench added), and IssueCoupon's ISSUE_BATCH_MAX.
func writeMachine(ctx context.Context, w io.Writer, dbURL string, standby time.Duration, batchMax int) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var version, fsync, syncCommit string
	var syncStandbys int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
current_setting('synchronous_commit'), (SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync')`).Scan(
		&version, &fsync, &syncCommit, &syncStandbys); err != nil {
		return err
	}
	standbys := "no synchronous standby"
	if syncStandbys > 0 {
		standbys = fmt.Sprintf("%d synchronous standby", syncStandbys)
		if standby > 0 {
			standbys += fmt.Sprintf(" %s away", standby)
		}
	}
	fmt.Fprintf(w, "%s, %d cores, %s, PostgreSQL %s (fsync %s, synchronous_commit %s, %s), ISSUE_BATCH_MAX %d\n",
		time.Now().In(issuance.Tokyo).Format("2006-01-02 15:04 -07:00"), runtime.NumCPU(), runtime.Version(), version, fsync, syncCommit,
		standbys, batchMax)
	return nil
}
