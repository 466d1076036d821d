package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/envconf"
	"github.com/mops/coupon-api/shared/issuance"
)

type demoOptions struct {
	members int
	workers int
	seed    uint64
	tapGap  time.Duration
	yes     bool // write into the database DATABASE_URL names
	// telemetry is show, export or off (see demoTelemetryModes).
	telemetry string
	console   bool // keep the console open on the demo's data after the run
}

func demoCmd() *cobra.Command {
	var o demoOptions
	c := &cobra.Command{
		Use:   "demo",
		Short: "Replay the Silver Week traffic through IssueCoupon, relay the outbox to a LINE stand-in, prove the rules from the tables",
		Long: `The main job, end to end on this machine:

  1. with no DATABASE_URL, start a throwaway PostgreSQL (removed on exit or Ctrl-C);
  2. apply the schema migrations and create SW-A (100,000 yen), SW-B and SW-C (300,000 yen),
     1,000 yen coupons;
  3. serve IssueCoupon, RelayOutbox and RedeemCoupon through the functions framework on
     loopback, as deployed;
  4. replay the Silver Week traffic over HTTP: every member asks for every campaign twice
     (a double tap within --tap-gap), shuffled, from --workers concurrent clients;
  5. print the outcomes, the latency percentiles, and an invariant report counted with SQL
     from the tables;
  6. link every member but every tenth (app-only) to a LINE user id, drain the outbox
     through RelayOutbox (served beside IssueCoupon) into a local LINE stand-in that fails a
     few first pushes on purpose, and report pushes per coupon (by X-Line-Retry-Key), rows
     skipped (app-only members), lost and parked;
  7. check out: redeem every third live coupon through RedeemCoupon (each redeem sent twice by
     its order, a second order refused for every tenth, every fifth order rolled back), and
     count the redemptions and their history with SQL;
  8. print the span tree of the slowest issuance (each statement's time) and the push that
     links to it, and the metric totals (--telemetry=show; spans and metrics are also exported
     as the OTEL_* environment says, e.g. OTEL_EXPORTER_OTLP_ENDPOINT);
  9. exit 1 if any rule is broken, any linked member's coupon was not pushed exactly once,
     any app-only member's coupon was pushed, or a redemption answered off the contract or
     disagrees with the tables.

With the defaults (300 members) the right outcome is exactly 600 coupons, every member
holding two, SW-A issuing exactly 100,000 yen.

The functions' own log lines (JSON, and the framework's) go to a file named at the end, so
that the report reads top to bottom, with its lines counted by level.

With --console the demo then keeps the console (docs/console.md) open on its data, on
loopback, as the demo's operator (an approver), prints its URL and waits for Ctrl-C.

Ctrl-C stops the demo at any step: it says "interrupted", stops and removes the throwaway
server and the log file, and exits 130. With DATABASE_URL set the demo writes its campaigns,
coupons and outbox rows into that database, so it asks for --yes first.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDemo(cmd, o) },
	}
	f := c.Flags()
	f.IntVar(&o.members, "members", silverweek.DefaultMembers, "members in the traffic (each asks for each campaign twice)")
	f.IntVar(&o.workers, "workers", 32, "concurrent HTTP clients")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the shuffle and the tap delays (same seed, same traffic)")
	f.DurationVar(&o.tapGap, "tap-gap", silverweek.DefaultTapGap, "longest delay of a member's second tap")
	f.BoolVar(&o.yes, "yes", false, "with DATABASE_URL set: migrate that database and write the demo's campaigns, coupons and outbox rows into it")
	f.StringVar(&o.telemetry, "telemetry", telemetryShow, "show: record traces and metrics in memory and print them after the report, and export them as OTEL_* says; "+
		"export: only export as OTEL_* says, as deployed; off: no telemetry (to measure its overhead)")
	f.BoolVar(&o.console, "console", false, "after the run, keep the console open on the demo's data (loopback, as "+demoOperator+") until Ctrl-C")
	return c
}

// validate refuses flags the demo cannot run with, before it starts anything.
func (o demoOptions) validate() error {
	var errs []error
	if o.members < 1 || o.workers < 1 {
		errs = append(errs, errors.New("--members and --workers must be at least 1"))
	}
	if o.tapGap < 0 {
		errs = append(errs, fmt.Errorf("--tap-gap %s: must not be negative", o.tapGap))
	}
	if err := checkDemoTelemetryMode(o.telemetry); err != nil {
		errs = append(errs, err)
	}
	if u := os.Getenv("DATABASE_URL"); u != "" && !o.yes {
		errs = append(errs, fmt.Errorf("DATABASE_URL is set (%s): the demo would migrate that database and write the Silver Week "+
			"campaigns, coupons and outbox rows into it. Run again with --yes to allow it, or unset DATABASE_URL "+
			"to use a throwaway server", redactURL(u)))
	}
	if err := errors.Join(errs...); err != nil {
		return usageError{err}
	}
	return nil
}

// demo is one run's state; close releases what setUp made, in reverse.
type demo struct {
	o           demoOptions
	cmd         *cobra.Command
	out, errOut io.Writer // taken before the functions' log lines go to a file
	pool        *pgxpool.Pool
	logs        *functionLogs
	tel         *demoTelemetry
	line        *lineStandIn
	srv         *localServer
	cleanups    []func()
}

func runDemo(cmd *cobra.Command, o demoOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	d := &demo{o: o, cmd: cmd, out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr()}
	defer d.close()
	ctx := cmd.Context()
	if err := d.setUp(ctx); err != nil {
		return err
	}
	stats, err := d.replay(ctx)
	if err != nil {
		return err
	}
	failures, err := d.check(ctx, stats)
	if err != nil {
		return err
	}
	relayed, err := demoRelay(ctx, d.out, d.pool, d.line, d.srv.url)
	if err != nil {
		return err
	}
	if !relayed {
		failures = append(failures, "relay: not every linked member's coupon was pushed to LINE exactly once, an app-only one was not skipped, or rows were lost or parked")
	}
	checkout, err := demoCheckout(ctx, d.out, d.pool, d.srv.url+"/RedeemCoupon")
	if err != nil {
		return err
	}
	failures = append(failures, checkout...)
	err = d.report(ctx, failures)
	if o.console && ctx.Err() == nil {
		return errors.Join(err, serveDemoConsole(ctx, d.errOut, d.pool))
	}
	return err
}

// setUp checks the functions' settings, then starts or opens the database, migrates it,
// creates the Silver Week campaigns, starts the LINE stand-in and the telemetry, and serves
// the functions through the functions framework on loopback.
func (d *demo) setUp(ctx context.Context) error {
	// The functions' settings come from the environment: refuse bad ones before starting
	// anything, as the deployable mains and serve do.
	if _, err := issuance.ConfigFromEnv(); err != nil {
		return err
	}
	if os.Getenv("DB_POOL_MAX_CONNS") != "" {
		if _, err := envconf.IntIn("DB_POOL_MAX_CONNS", 0, 1, db.MaxPoolConns); err != nil {
			return err
		}
	}
	if err := checkDemoTelemetry(ctx, d.o.telemetry); err != nil {
		return err
	}
	dbURL, err := d.openDatabase(ctx)
	if err != nil {
		return err
	}
	if d.line, err = startLineStandIn(); err != nil {
		return err
	}
	d.cleanups = append(d.cleanups, d.line.close)
	if err := d.startTelemetry(); err != nil {
		return err
	}
	poolSize := min(d.o.workers, demoPoolMax)
	if d.srv, err = serveDemoFunctions(ctx, dbURL, poolSize, d.line); err != nil {
		return err
	}
	fmt.Fprintf(d.errOut, "functions framework serving on %s (/IssueCoupon, /RelayOutbox, /RedeemCoupon), a pool of %d connections each\n",
		d.srv.url, poolSize)
	return nil
}

// openDatabase starts a throwaway server or takes DATABASE_URL (refused if it holds coupons or
// outbox rows), migrates it, and creates the campaigns. It returns the database's URL.
func (d *demo) openDatabase(ctx context.Context) (string, error) {
	dbURL, cleanup, err := databaseOrThrowaway(ctx, d.cmd)
	if err != nil {
		return "", err
	}
	d.cleanups = append(d.cleanups, cleanup)
	if os.Getenv("DATABASE_URL") != "" {
		if err := refuseDataInUse(ctx, dbURL, demoConsequence); err != nil {
			return "", err
		}
	}
	if _, err := schema.MigrateURL(ctx, dbURL); err != nil {
		return "", err
	}
	if d.pool, err = pgxpool.New(ctx, dbURL); err != nil {
		return "", err
	}
	d.cleanups = append(d.cleanups, d.pool.Close)
	if err := silverweek.CreateCampaigns(ctx, d.pool, silverweek.Campaigns); err != nil {
		return "", fmt.Errorf("%w (the demo needs a database without the Silver Week campaigns)", err)
	}
	fmt.Fprintln(d.errOut, "migrated; created SW-A (100,000 yen), SW-B and SW-C (300,000 yen each), 1,000 yen coupons")
	return dbURL, nil
}

// startTelemetry points the process's standard streams at the log file and sets up telemetry
// as --telemetry says.
func (d *demo) startTelemetry() error {
	var err error
	if d.logs, err = captureLogs(); err != nil {
		return err
	}
	if d.tel, err = startDemoTelemetry(d.cmd, d.o.telemetry, d.logs.f); err != nil {
		d.logs.discard()
		d.logs = nil
	}
	return err
}

// replay sends the Silver Week traffic to IssueCoupon over HTTP, with a progress line.
func (d *demo) replay(ctx context.Context) (silverweek.Stats, error) {
	reqs := silverweek.Requests(d.o.members, silverweek.Campaigns, d.o.tapGap, d.o.seed)
	fmt.Fprintf(d.errOut, "replaying %d requests (%d members x %d campaigns x 2 taps) with %d clients\n",
		len(reqs), d.o.members, len(silverweek.Campaigns), d.o.workers)
	step, endProgress := newProgress(d.errOut, len(reqs), "IssueCoupon")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: d.o.workers}, Timeout: issuance.AppTimeout}
	stats := silverweek.Run(ctx, reqs, d.o.workers, httpIssuer(client, d.srv.url+"/IssueCoupon"), step)
	endProgress(ctx.Err() == nil)
	if err := ctx.Err(); err != nil {
		return stats, fmt.Errorf("interrupted after %d of %d requests: %w", len(stats.Latencies), len(reqs), err)
	}
	writeOutcomes(d.out, stats)
	return stats, nil
}

// check counts the rules from the tables and prints the invariant report; it returns what
// broke, the scenario's own expectations included.
func (d *demo) check(ctx context.Context, stats silverweek.Stats) ([]string, error) {
	rep, err := reconcile.Check(ctx, d.pool)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(d.out, "\nInvariant report (SQL on the tables):")
	rep.Write(d.out)
	failures := rep.Violations()
	if stats.Errors > 0 {
		failures = append(failures, fmt.Sprintf("%d requests got no result (first: %v)", stats.Errors, stats.FirstErr))
	}
	return append(failures, scenarioExpectations(ctx, d.pool, d.o.members, rep)...), nil
}

// report prints the telemetry and the verdict: errViolations if anything failed.
func (d *demo) report(ctx context.Context, failures []string) error {
	if err := d.tel.report(ctx, d.out); err != nil {
		return err
	}
	if len(failures) > 0 {
		fmt.Fprintf(d.out, "\nFAILED (%d):\n", len(failures))
		for _, f := range failures {
			fmt.Fprintln(d.out, "  "+f)
		}
		return errViolations
	}
	fmt.Fprintln(d.out, "\nOK: every rule held.")
	return nil
}

// close flushes the telemetry while the functions' pools still serve its gauges, stops the
// functions, names the log file (or removes it, when interrupted), and releases the rest.
func (d *demo) close() {
	d.tel.close(d.cmd)
	if d.srv != nil {
		if err := d.srv.close(); err != nil {
			fmt.Fprintf(d.errOut, "stopping the functions: %v\n", err)
		}
	}
	if d.logs != nil {
		d.logs.restore()
		if d.cmd.Context().Err() != nil { // interrupted: main says so; nothing is left behind
			d.logs.discard()
		} else {
			d.logs.finish(d.out, "; the relay's lines about the injected failures are expected")
		}
	}
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		d.cleanups[i]()
	}
}

// newProgress reports progress through total steps: a bar on a terminal, a plain line per 10%
// elsewhere (a log file or a pipe would otherwise collect every redrawn frame). It returns the
// callback for each step done and a function to call at the end.
func newProgress(w io.Writer, total int, what string) (step func(done int), end func(completed bool)) {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar := progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(what),
			progressbar.OptionShowCount(), progressbar.OptionThrottle(100*time.Millisecond))
		return func(int) { _ = bar.Add(1) }, func(completed bool) {
			if completed {
				_ = bar.Finish()
			} else {
			}
			fmt.Fprintln(w)
		}
	}
	every := max(1, total/10)
	var mu sync.Mutex
	return func(done int) {
		if done%every == 0 || done == total {
			mu.Lock()
			fmt.Fprintf(w, "%s: %d/%d\n", what, done, total)
			mu.Unlock()
		}
	}, func(bool) {}
}

// serveDemoFunctions serves the functions in this process (see [serveLocal]), configured
// through the environment as Cloud Run configures them: DATABASE_URL with a pool of poolSize
// connections each, and RelayOutbox pushing to the LINE stand-in, retrying on its next run.
func serveDemoFunctions(ctx context.Context, dbURL string, poolSize int, line *lineStandIn) (*localServer, error) {
	poolURL, err := withPoolSize(dbURL, poolSize)
	if err != nil {
		return nil, err
	}
	os.Setenv("DATABASE_URL", poolURL)
	os.Setenv("LINE_API_BASE_URL", line.url)
	os.Setenv("LINE_CHANNEL_ACCESS_TOKEN", "demo-channel-access-token")
	os.Setenv("RELAY_RETRY_BASE", "0s")
	return serveLocal(ctx, nil, servable...)
}

// demoPoolMax caps each served function's pool, in connections. The pool is sized for the
// database, not for the callers: past a few backends per core the extra ones only queue on the
// CPU and on the hot campaign rows (docs/performance.md), and 300 workers with a pool each
// would pass the throwaway server's max_connections of 300 (two functions' pools, the demo's
// own and the relay's come to about 2 x 16 + 5 here).
const demoPoolMax = 16

// withPoolSize sets pgxpool's pool_max_conns in a database URL or keyword/value string.
func withPoolSize(dbURL string, n int) (string, error) {
	if !strings.HasPrefix(dbURL, "postgres://") && !strings.HasPrefix(dbURL, "postgresql://") {
		return fmt.Sprintf("%s pool_max_conns=%d", dbURL, n), nil
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("database URL: %w", err)
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(n))
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// httpIssuer sends one request to IssueCoupon and returns the result code it answered.
func httpIssuer(client *http.Client, url string) silverweek.IssueFunc {
	return func(ctx context.Context, r silverweek.Request) (string, error) {
		status, result, err := postForResult(ctx, client, url, map[string]any{"member_id": r.MemberID, "campaign_id": r.CampaignID})
		if err != nil {
			return "", err
		}
		if status >= 500 && result != string(issuance.ResultRetryExhausted) {
			return "", fmt.Errorf("HTTP %d %s", status, result)
		}
		return result, nil
	}
}

// postForResult POSTs body as JSON to IssueCoupon at url and returns the HTTP status and the
// answer's result code; an answer without one is an error.
func postForResult(ctx context.Context, client *http.Client, url string, body map[string]any) (int, string, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var answer struct {
		Result string `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil || answer.Result == "" {
		return resp.StatusCode, "", fmt.Errorf("HTTP %d without a result: %v", resp.StatusCode, err)
	}
	return resp.StatusCode, answer.Result, nil
}

func writeOutcomes(w io.Writer, s silverweek.Stats) {
	fmt.Fprintln(w, "Outcomes (as answered):")
	codes := make([]string, 0, len(s.Results))
	for c := range s.Results {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	for _, c := range codes {
		fmt.Fprintf(w, "  %-20s %6d\n", c, s.Results[c])
	}
	if s.Errors > 0 {
		fmt.Fprintf(w, "  %-20s %6d\n", "(no result)", s.Errors)
	}
	fmt.Fprintf(w, "Latency: p50 %s  p95 %s  p99 %s  max %s; %d requests in %s (%.0f req/s)\n",
		ms(s.Percentile(50)), ms(s.Percentile(95)), ms(s.Percentile(99)), ms(s.Percentile(100)),
		len(s.Latencies), s.Wall.Round(time.Millisecond), s.Throughput())
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// scenarioExpectations checks the right outcome of the Silver Week traffic beyond the rules:
// while SW-B and SW-C alone can give every member two coupons (300 members or fewer), every
// member must hold exactly two, and with 100 or more members SW-A must be spent to the yen.
func scenarioExpectations(ctx context.Context, pool *pgxpool.Pool, members int, rep reconcile.Report) []string {
	var f []string
	if members > 300 {
		return nil
	}
	if want := int64(2 * members); rep.Coupons != want {
		f = append(f, fmt.Sprintf("coupons: %d, want %d (two per member)", rep.Coupons, want))
	}
	var short int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT member_id FROM issued_coupons
		GROUP BY member_id HAVING count(*) <> 2) x`).Scan(&short); err != nil {
		return append(f, err.Error())
	}
	if short > 0 {
		f = append(f, fmt.Sprintf("%d members do not hold exactly two coupons", short))
	}
	if members >= 100 {
		for _, c := range rep.Campaigns {
			if c.CampaignID == "SW-A" && c.ActualYen != c.BudgetYen {
				f = append(f, fmt.Sprintf("SW-A issued %d yen, want exactly its %d yen budget", c.ActualYen, c.BudgetYen))
			}
		}
	}
	return f
}

// redactURL is u without its password, for messages; a keyword/value string is not shown.
func redactURL(u string) string {
	if p, err := url.Parse(u); err == nil && p.Scheme != "" {
		return p.Redacted()
	}
	return "a keyword/value connection string"
}

// countIfExists counts the rows of table, or returns 0 when the table does not exist (an
// unmigrated database). Two statements: PostgreSQL resolves every table a statement names when
// it parses it, so one that names a missing table fails even in a branch that would not run.
func countIfExists(ctx context.Context, conn *pgx.Conn, table string) (int64, error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var n int64
	err := conn.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&n)
	return n, err
}

// demoConsequence is what the demo would do to a database in use.
const demoConsequence = "the demo would drain that outbox into its local LINE stand-in and mark other members' notifications sent"

// refuseDataInUse refuses a database that holds coupons or outbox rows, saying what the verb would
// do to them (consequence): the demo and the drill drain the whole outbox into a local LINE
// stand-in, marking other members' pending notifications sent. Only an empty (or unmigrated)
// database is safe.
func refuseDataInUse(ctx context.Context, dbURL, consequence string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	coupons, err := countIfExists(ctx, conn, "issued_coupons")
	if err != nil {
		return err
	}
	outboxRows, err := countIfExists(ctx, conn, "notification_outbox")
	if err != nil {
		return err
	}
	if coupons > 0 || outboxRows > 0 {
		return fmt.Errorf("the database DATABASE_URL names holds %d coupons and %d outbox rows: %s. Give it an empty "+
			"database, or unset DATABASE_URL to use a throwaway server", coupons, outboxRows, consequence)
	}
	return nil
}
