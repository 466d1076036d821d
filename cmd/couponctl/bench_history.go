package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/lab/hotbench"
	"github.com/mops/coupon-api/internal/lab/isolationlab"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/localpg"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/envconf"
	"github.com/mops/coupon-api/shared/issuance"
)

// historyFlags are bench's --history flags.
type historyFlags struct {
	coupons int64
	ids     string
	turns   int
	keep    bool
	// jobs measures the daily jobs instead of the issuance cells; changed is the coupons they
	// change after the base run (0: 1% of the history, at least minChanged), changedGiven
	// whether --changed was given.
	jobs         bool
	changed      int64
	changedGiven bool
}

// minChanged is --changed's least default, in coupons.
const minChanged = 1000

// historyRun is the flags of one `bench --history` run.
type historyRun struct {
	historyFlags
	clients  int
	duration time.Duration
}

// historyBench runs `bench --history` with the bench's --clients (the largest) and --duration.
func historyBench(cmd *cobra.Command, f historyFlags, clients []int, duration time.Duration) error {
	if len(clients) == 0 || slices.Min(clients) < 1 || duration < time.Second {
		return flagError("--history: give --clients of at least 1 and a --duration of at least 1s")
	}
	h := historyRun{historyFlags: f, clients: slices.Max(clients), duration: duration}
	if err := h.check(); err != nil {
		return err
	}
	return runHistoryBench(cmd, h)
}

// check refuses what the history bench cannot run.
func (h historyRun) check() error {
	if h.coupons < 0 {
		return flagError("--history %d: want a number of coupons, 0 or more", h.coupons)
	}
	if h.ids != "v4" && h.ids != "v7" {
		return flagError("--history-ids %q: want v4 or v7", h.ids)
	}
	if h.keep && os.Getenv("DATABASE_URL") == "" {
		return flagError("--keep-history: the throwaway server is removed at the end; set DATABASE_URL to keep the history there")
	}
	if h.turns < 0 {
		return flagError("--turns %d: want 0 (build and describe the history only) or more", h.turns)
	}
	return h.checkJobs()
}

// checkJobs refuses --jobs and --changed where the jobs cannot run.
func (h historyRun) checkJobs() error {
	switch {
	case h.changedGiven && !h.jobs:
		return flagError("--changed: only with --jobs")
	case h.changed < 0:
		return flagError("--changed %d: want a number of coupons, 1 or more (0: 1%% of the history, at least %d)", h.changed, minChanged)
	case h.jobs && h.coupons == 0:
		return flagError("--jobs: give a history to run the jobs on, --history N with N above 0")
	case h.jobs && h.turns == 0:
		return flagError("--jobs: give --turns 1 or more")
	}
	return nil
}

// historyDBName is the database a history of h's size and ids lives in on the server: found
// there, it is measured again without being built (--keep-history left it).
func (h historyRun) historyDBName() string {
	return fmt.Sprintf("bench_history_%d_%s", h.coupons, h.ids)
}

// runHistoryBench builds the history (or finds it built), checks it with package reconcile,
// reports its indexes' bytes per coupon and the verbs' times on it, then runs the alternating
// turns of [hotbench.HistoryBench] against an empty database on the same server and writes the
// table to stdout.
func runHistoryBench(cmd *cobra.Command, h historyRun) error {
	ctx := cmd.Context()
	errOut, out := cmd.ErrOrStderr(), cmd.OutOrStdout()
	serverURL, stop, err := historyServer(ctx, cmd)
	if err != nil {
		return err
	}
	defer stop()
	fresh, err := isolationlab.OnServer(serverURL)
	if err != nil {
		return err
	}
	emptyURL, dropEmpty, err := fresh(ctx)
	if err != nil {
		return err
	}
	defer dropEmpty()
	if err := writeHistoryMachine(ctx, out, emptyURL); err != nil {
		return err
	}
	fullURL, dropFull, err := historyDatabase(ctx, errOut, serverURL, h)
	if err != nil {
		return err
	}
	if !h.keep {
		defer dropFull()
	}
	if err := describeHistory(ctx, out, fullURL); err != nil {
		return err
	}
	if h.turns == 0 {
		return nil
	}
	if h.jobs {
		return runHistoryJobs(ctx, out, errOut, fullURL, h)
	}
	members := hotbench.History{Coupons: h.coupons}
	if h.coupons == 0 {
		members.Coupons = 1_000_000 // as many members as a history of a million would have
	}
	b := hotbench.HistoryBench{Empty: emptyURL, Full: fullURL, Clients: h.clients, Duration: h.duration, Turns: h.turns,
		Progress: errOut, History: members}
	fmt.Fprintf(out, "%d turns, %d clients, %s a cell, members drawn from %d\n", h.turns, h.clients, h.duration, b.History.Members())
	turns, err := b.Run(ctx)
	if err != nil {
		return err
	}
	return hotbench.WriteHistoryTable(out, turns)
}

// runHistoryJobs measures the daily jobs on the history database of fullURL
// ([hotbench.HistoryJobs]): reconcile, then the outbox prune beside the hot campaign, each
// table written to out as soon as measured.
func runHistoryJobs(ctx context.Context, out, progress io.Writer, fullURL string, h historyRun) error {
	k := h.changed
	if k == 0 {
		k = max(minChanged, h.coupons/100)
	}
	j := hotbench.HistoryJobs{URL: fullURL, History: hotbench.History{Coupons: h.coupons}, Changed: k, Turns: h.turns,
		Clients: h.clients, Duration: h.duration, Progress: progress}
	fmt.Fprintf(out, "jobs: %d turns each; reconcile after %d coupons issued and %d voided; the prune beside the hot campaign, %d clients, %s a turn\n",
		h.turns, k, k/10, h.clients, h.duration)
	r, err := j.Reconcile(ctx)
	if err != nil {
		return err
	}
	if err := hotbench.WriteReconcileTable(out, h.coupons, r); err != nil {
		return err
	}
	p, err := j.Prune(ctx)
	if errors.Is(err, hotbench.ErrBacklogGone) {
		return fmt.Errorf("%w\nhint: give a larger --history, a shorter --duration or fewer --turns (the backlog is N/12 rows, "+
			"pruned at 5,000-9,000 rows/s here); a history kept by --keep-history holds only what an earlier --jobs run left: "+
			"DROP DATABASE %s to build it again", err, h.historyDBName())
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	return hotbench.WritePruneTable(out, p)
}

// writeHistoryMachine is [writeMachine] for the history bench: no standby, ISSUE_BATCH_MAX as
// its issuance.Service reads it.
func writeHistoryMachine(ctx context.Context, w io.Writer, dbURL string) error {
	batchMax, err := envconf.IntIn("ISSUE_BATCH_MAX", issuance.DefaultBatchMax, 1, issuance.MaxBatchMax)
	if err != nil {
		return err
	}
	return writeMachine(ctx, w, dbURL, 0, batchMax)
}

// historyServer is DATABASE_URL's server, or a throwaway durable one that loads
// pg_stat_statements and may write much WAL between checkpoints (the build).
func historyServer(ctx context.Context, cmd *cobra.Command) (string, func(), error) {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), "using DATABASE_URL's server")
		return u, func() {}, nil
	}
	fmt.Fprintln(cmd.ErrOrStderr(), "DATABASE_URL not set: starting a throwaway PostgreSQL...")
	srv, err := localpg.Start(ctx, localpg.Options{Durable: true, Settings: map[string]string{
		"shared_preload_libraries": "pg_stat_statements", "max_wal_size": "8GB"}})
	if err != nil {
		return "", nil, err
	}
	return srv.URL(), func() { _ = srv.Stop() }, nil
}

// historyDatabase returns h's history database on the server, building it when it is not
// there (a database left by an interrupted build is dropped and built again), and a func that
// drops it.
func historyDatabase(ctx context.Context, progress io.Writer, serverURL string, h historyRun) (string, func(), error) {
	name := h.historyDBName()
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	admin, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", nil, err
	}
	defer admin.Close(ctx)
	ident := pgx.Identifier{name}.Sanitize()
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if c, err := pgx.Connect(ctx, serverURL); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	}
	if built, err := historyBuilt(ctx, admin, u.String(), name); err != nil || built {
		if built {
			fmt.Fprintf(progress, "history: database %s already holds the history; measured again\n", name)
		}
		return u.String(), drop, err
	}
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return "", nil, err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", nil, err
	}
	if err := buildHistory(ctx, progress, u.String(), h); err != nil {
		drop()
		return "", nil, err
	}
	return u.String(), drop, nil
}

// historyBuilt says whether database name exists and its build finished (the table
// bench_history_built, written last).
func historyBuilt(ctx context.Context, admin *pgx.Conn, dbURL, name string) (bool, error) {
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil || !exists {
		return false, err
	}
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return false, err
	}
	defer c.Close(ctx)
	var built bool
	err = c.QueryRow(ctx, `SELECT to_regclass('bench_history_built') IS NOT NULL`).Scan(&built)
	return built, err
}

// buildHistory migrates the database of dbURL, writes h's history, checks it with package
// reconcile (refusing a history that does not reconcile) and marks it built.
func buildHistory(ctx context.Context, progress io.Writer, dbURL string, h historyRun) error {
	if _, err := schema.MigrateURL(ctx, dbURL); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	t0 := time.Now()
	n, err := hotbench.BuildHistory(ctx, pool, hotbench.History{Coupons: h.coupons, V4IDs: h.ids == "v4", Now: time.Now()}, progress)
	if err != nil {
		return err
	}
	fmt.Fprintf(progress, "history: %d coupons (%s ids) built in %s\n", n, h.ids, time.Since(t0).Round(time.Second))
	t0 = time.Now()
	rep, err := reconcile.Check(ctx, pool)
	if err != nil {
		return err
	}
	if v := rep.Violations(); len(v) > 0 {
		return fmt.Errorf("history does not reconcile: %v", v)
	}
	fmt.Fprintf(progress, "history: reconcile found it clean in %s\n", time.Since(t0).Round(100*time.Millisecond))
	_, err = pool.Exec(ctx, `CREATE TABLE bench_history_built (coupons bigint, ids text, built_at timestamptz DEFAULT now());
INSERT INTO bench_history_built (coupons, ids) VALUES (`+fmt.Sprint(h.coupons)+`, '`+h.ids+`')`)
	return err
}

// describeHistory writes the history database's size, its indexes' bytes per coupon, and how
// long a no-op migrate, campaign show and campaign list take on it (each the median of 3).
func describeHistory(ctx context.Context, w io.Writer, dbURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	sizes, coupons, err := hotbench.IndexSizes(ctx, pool)
	if err != nil {
		return err
	}
	var dbBytes int64
	if err := pool.QueryRow(ctx, `SELECT pg_database_size(current_database())`).Scan(&dbBytes); err != nil {
		return err
	}
	var total int64
	fmt.Fprintf(w, "history: %d coupons, database %.2f GB\n", coupons, float64(dbBytes)/1e9)
	for _, s := range sizes {
		total += s.Bytes
		fmt.Fprintf(w, "  %-22s %-36s %8.1f MB %6.1f bytes/coupon\n", s.Table, s.Index, float64(s.Bytes)/1e6, s.PerCoupon)
	}
	fmt.Fprintf(w, "  indexes in all: %.1f MB, %.1f bytes/coupon\n", float64(total)/1e6, float64(total)/float64(max(1, coupons)))
	timed := []struct {
		name string
		run  func() error
	}{
		{"migrate (no-op)", func() error { _, err := schema.MigrateURL(ctx, dbURL); return err }},
		{"campaign show", func() error {
			_, err := campaign.Show(ctx, pool, "HIST-"+time.Now().AddDate(0, -1, 0).Format("2006-01")+"-000")
			return err
		}},
		{"campaign list", func() error { _, err := campaign.List(ctx, pool); return err }},
	}
	for _, t := range timed {
		var took []time.Duration
		for range 3 {
			t0 := time.Now()
			if err := t.run(); err != nil && !errors.Is(err, campaign.ErrNotFound) {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			took = append(took, time.Since(t0))
		}
		slices.Sort(took)
		fmt.Fprintf(w, "  %s: %s (median of 3; %s-%s)\n", t.name, took[1].Round(100*time.Microsecond), took[0].Round(100*time.Microsecond), took[2].Round(100*time.Microsecond))
	}
	return nil
}
