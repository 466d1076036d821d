package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"gonum.org/v1/plot/vg"

	"github.com/mops/coupon-api/internal/lab/isolationlab"
	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/shared/issuance"
)

// simFlags are couponctl sim's flags.
type simFlags struct {
	load        isolationlab.Load
	campaigns   int
	discountYen int
	budgets     []int
	strategies  []string
	workers     []int
	runs        int
	format      string
	chart       string
	scenario    string
	friday      blackFridayFlags
}

func simCmd() *cobra.Command {
	sf := &simFlags{load: isolationlab.SilverWeek()}
	names := make([]string, len(isolationlab.Strategies))
	for i, s := range isolationlab.Strategies {
		names[i] = s.Name
	}
	c := &cobra.Command{
		Use:   "sim",
		Short: "The isolation lab: the same load through each strategy, one table of violations, retries and latency",
		Long: `sim runs the same load through each strategy against a real PostgreSQL, a fresh database per
strategy x workers x run, and counts with SQL afterwards what broke: coupons issued, R1 overshoot
per campaign and counter drift (yen), R2 duplicate pairs, R3 members over the cap, pushes for
coupons that do not exist; then retries, RETRY_EXHAUSTED, throughput and latency. For a
terminal (--format text) these are two tables in about 100 columns, the rules and then the
retries and latency, each with a key under it. A verdict follows: per strategy, the rules any
of its runs broke. --chart draws each figure as the mean of the --runs. "retried %" is the
transactions started beyond each request's first, per 100 requests: over 100 means more than
one retry per request on average.

Strategies:
  before           the incident's code: read-judge-write in Go at READ COMMITTED, push inside the
                   transaction (20 ms), blind retries, no unique index
  repeatable-read  the same code at REPEATABLE READ, retrying SQLSTATE 40001 (junior proposal A)
  serializable     the same logic at SERIALIZABLE, outbox, 40001 retried with full jitter (proposal B)
  good             the production path, shared/issuance

Default load: Silver Week (300 members x SW-A 100,000 yen, SW-B and SW-C 300,000 yen x double tap,
1,800 requests; right answer 600 coupons).

--scenario black-friday runs one first-come campaign instead (1,000 coupons, 20,000 members
asking once, 64 and 256 workers) through good (one budget row), stripes-16, preallocated (leased
slices, one instance dying) and serializable: coupons, overshoot, stranded budget and false
rejections (docs/hot-campaigns.md).

Database: DATABASE_URL (its user must be allowed to CREATE DATABASE), or a throwaway local
PostgreSQL when unset. Progress goes to stderr.`,
		Example: `  couponctl sim
  couponctl sim --scenario black-friday --format markdown
  couponctl sim --format markdown --chart docs/isolation-lab.png
  couponctl sim --strategies repeatable-read,good --members 1 --campaigns 10 --budgets 100000 --workers 20`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSim(cmd, sf) },
	}
	f := c.Flags()
	f.StringSliceVar(&sf.strategies, "strategies", names, "strategies to run, in order")
	f.IntSliceVar(&sf.workers, "workers", []int{8, 32}, "concurrent workers (and pool connections) per run")
	f.IntVar(&sf.runs, "runs", 3, "repetitions of each strategy x workers, each on a fresh database")
	f.IntVar(&sf.load.Members, "members", sf.load.Members, "members; each asks for every campaign twice")
	f.IntVar(&sf.campaigns, "campaigns", len(sf.load.Campaigns), "campaigns, named SW-A, SW-B, ... (at most 26)")
	f.IntVar(&sf.discountYen, "discount-yen", silverweek.Campaigns[0].DiscountYen, "face value of every coupon in yen")
	f.IntSliceVar(&sf.budgets, "budgets", []int{100_000, 300_000, 300_000},
		"budget approval of each campaign in yen, in order; campaigns past the list take its last value")
	f.IntVar(&sf.load.CapYen, "cap-yen", 0, "R3 monthly cap in yen, set in each run's database (default 2000)")
	f.DurationVar(&sf.load.TapGap, "tap-gap", sf.load.TapGap, "the second tap comes up to this long after the first")
	f.Uint64Var(&sf.load.Seed, "seed", sf.load.Seed, "shuffle seed; each run adds its workers and run number")
	f.StringVar(&sf.format, "format", "text", "table format: "+strings.Join(isolationlab.Formats, ", ")+
		" (text: for a terminal, two tables in about 100 columns with a key; the others one row per run)")
	f.StringVar(&sf.chart, "chart", "", "also write a chart of violations and retries to this file (each bar the mean of the --runs), in the format its extension names ("+
		strings.Join(isolationlab.ChartFormats, ", ")+")")
	f.StringVar(&sf.scenario, "scenario", "silver-week", "load: silver-week, or black-friday (one first-come campaign: good, stripes-16, preallocated, serializable; docs/hot-campaigns.md)")
	sf.friday.register(f)
	return c
}

// runSim runs the lab: it checks the flags and the chart's path (before the runs, which take
// minutes), runs every strategy on DATABASE_URL's server or a throwaway one, and writes the
// table, the verdict and the chart.
func runSim(cmd *cobra.Command, sf *simFlags) error {
	switch sf.scenario {
	case "black-friday":
		return runBlackFriday(cmd, sf.strategies, sf.workers, sf.load.Members, sf.discountYen, sf.load.CapYen, sf.runs,
			sf.load.Seed, sf.format, sf.friday)
	case "silver-week":
	default:
		return flagError("--scenario %q: want one of %s", sf.scenario, strings.Join(scenarios, ", "))
	}
	plan, chartFormat, err := sf.plan(cmd)
	if err != nil {
		return err
	}
	fresh, stop, err := labServer(cmd)
	if err != nil {
		return err
	}
	defer stop()
	plan.Fresh = fresh
	ms, err := isolationlab.Run(cmd.Context(), plan)
	if err != nil {
		return err
	}
	return sf.write(cmd, ms, chartFormat)
}

// labServer is where the lab makes its fresh databases: DATABASE_URL's server or a throwaway one,
// which stop removes.
func labServer(cmd *cobra.Command) (isolationlab.FreshDB, func(), error) {
	serverURL, stop, err := databaseOrThrowaway(cmd.Context(), cmd)
	if err != nil {
		return nil, nil, err
	}
	fresh, err := isolationlab.OnServer(serverURL)
	if err != nil {
		stop()
		return nil, nil, err
	}
	return fresh, stop, nil
}

// plan turns the flags into the lab's plan, and checks the chart's path ([simFlags.checkChart]);
// it returns the chart's format.
func (sf *simFlags) plan(cmd *cobra.Command) (isolationlab.Plan, string, error) {
	plan := isolationlab.Plan{Workers: sf.workers, Runs: sf.runs, Load: sf.load, Progress: cmd.ErrOrStderr()}
	if !slices.Contains(isolationlab.Formats, sf.format) {
		return plan, "", flagError("--format %q: want one of %s", sf.format, strings.Join(isolationlab.Formats, ", "))
	}
	for _, name := range sf.strategies {
		s, err := isolationlab.StrategyNamed(name)
		if err != nil {
			return plan, "", usageError{err}
		}
		plan.Strategies = append(plan.Strategies, s)
	}
	if err := completeLoad(&plan.Load, sf.campaigns, sf.discountYen, sf.budgets); err != nil {
		return plan, "", err
	}
	if plan.Load.Members < 1 || sf.runs < 1 || len(sf.workers) == 0 || slices.Min(sf.workers) < 1 {
		return plan, "", flagError("--members, --runs and every --workers must be at least 1")
	}
	chartFormat, err := sf.checkChart()
	if err != nil {
		return plan, "", err
	}
	if plan.Load.CapYen == 0 {
		plan.Load.CapYen = issuance.DefaultMonthlyCapYen
	}
	return plan, chartFormat, nil
}

// checkChart returns the format --chart's extension names, after checking that its directory
// takes a new file; "" without --chart.
func (sf *simFlags) checkChart() (string, error) {
	if sf.chart == "" {
		return "", nil
	}
	chartFormat, err := isolationlab.ChartFormat(sf.chart)
	if err != nil {
		return "", flagError("--chart: %w", err)
	}
	if err := checkWritableDir(filepath.Dir(sf.chart)); err != nil {
		return "", fmt.Errorf("--chart %s: %w", sf.chart, err)
	}
	return chartFormat, nil
}

// write writes the table to stdout, the verdict after it (on stderr beside JSON or CSV, so that
// stdout stays machine-readable), and the chart if asked.
func (sf *simFlags) write(cmd *cobra.Command, ms []isolationlab.Measurement, chartFormat string) error {
	if err := writeSimTable(cmd.OutOrStdout(), sf.format, ms); err != nil {
		return err
	}
	verdictOut := cmd.OutOrStdout()
	if sf.format == "json" || sf.format == "csv" {
		verdictOut = cmd.ErrOrStderr()
	}
	if err := isolationlab.WriteVerdict(verdictOut, ms); err != nil {
		return err
	}
	if sf.chart == "" {
		return nil
	}
	if err := writeFileAtomic(sf.chart, func(w io.Writer) error {
		return isolationlab.WriteChart(w, ms, 30*vg.Centimeter, 32*vg.Centimeter, chartFormat)
	}); err != nil {
		return fmt.Errorf("--chart: %w", err)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "chart (%s) written to %s\n", chartFormat, sf.chart)
	return nil
}

// writeSimTable writes the lab's table in format: for "text", the terminal's, wrapped to about
// 100 columns with a key under it; the others (markdown, json, csv) one row per run, for files.
func writeSimTable(w io.Writer, format string, ms []isolationlab.Measurement) error {
	if format == "text" {
		return isolationlab.WriteTerminalTable(w, ms)
	}
	return isolationlab.WriteTable(w, format, ms)
}

// completeLoad sets load's campaigns from the flags: n campaigns SW-A, SW-B, ..., each with
// discountYen yen coupons and the budget at its place in budgets (the last one repeated).
func completeLoad(load *isolationlab.Load, n, discountYen int, budgets []int) error {
	ids, err := isolationlab.CampaignLetters(n)
	if err != nil {
		return flagError("--campaigns: %w", err)
	}
	if len(budgets) == 0 {
		return flagError("--budgets: give at least one budget in yen")
	}
	load.Campaigns = make([]silverweek.Campaign, n)
	for i, id := range ids {
		b := budgets[min(i, len(budgets)-1)]
		if discountYen <= 0 || b < discountYen {
			return fmt.Errorf("campaign %s: budget %d yen and discount %d yen: want 0 < discount <= budget", id, b, discountYen)
		}
		load.Campaigns[i] = silverweek.Campaign{ID: id, DiscountYen: discountYen, BudgetYen: b}
	}
	return nil
}

// checkWritableDir reports whether dir exists and a file can be created in it (by creating and
// removing one).
func checkWritableDir(dir string) error {
	f, err := os.CreateTemp(dir, ".couponctl-check-*")
	if err != nil {
		return fmt.Errorf("cannot create a file in %s: %w", dir, err)
	}
	name := f.Name()
	_ = f.Close()
	return os.Remove(name)
}

// writeFileAtomic writes path through write into a temporary file beside it, then renames it
// into place, so that a failure leaves no half-written file (and an older file untouched).
func writeFileAtomic(path string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after a successful rename there is nothing left to remove
	if err := write(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
