package main

import (
	"context"
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/lab/hotbench"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/localpg"
)

// TestBenchJobsRefusesBadInput: --jobs only with a history and turns to run, --changed only
// with --jobs and not negative; each a usage error (exit 2) naming the flag, before any
// database is touched.
func TestBenchJobsRefusesBadInput(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--jobs"}, "--jobs: only with --history"},
		{[]string{"bench", "--changed", "5"}, "--changed: only with --history"},
		{[]string{"bench", "--instances", "1", "--jobs"}, "--instances does not go with --jobs"},
		{[]string{"bench", "--history", "1000", "--changed", "5"}, "--changed: only with --jobs"},
		{[]string{"bench", "--history", "1000", "--jobs", "--changed", "-1"}, "--changed -1"},
		{[]string{"bench", "--history", "0", "--jobs"}, "--jobs: give a history"},
		{[]string{"bench", "--history", "1000", "--jobs", "--turns", "0"}, "--jobs: give --turns 1 or more"},
	} {
		_, err := couponctl(c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want it to mention %q", c.args, err, c.want)
		}
		var usage usageError
		if !errors.As(err, &usage) {
			t.Errorf("%v: err %v is not a usage error (exit 2)", c.args, err)
		}
	}
	if code, _, stderr := couponctlBin(t, []string{"DATABASE_URL="}, "bench", "--jobs"); code != 2 {
		t.Errorf("bench --jobs without --history: exit %d, want 2\n%s", code, stderr)
	}
}

// jobsCoupons is the history of TestBenchJobs: its backlog, the last month's sent outbox rows
// (12,000), is more than one prune turn of 1 s can delete at the verb's pace (a statement of
// 1,000 rows, then 100ms: at most 11 statements).
const jobsCoupons = 144_000

// TestBenchJobs runs `couponctl bench --history N --jobs` for one turn on a throwaway server of
// the test's (as bench's own: durable, pg_stat_statements) and keeps the history to look at: it
// exits 0 (every reconcile run clean, none run out of backlog), both tables are printed, the
// prune's rows are in outbox_pruned as many as the table says, the WAL per pruned row is there
// and positive, and the history reconciles clean (reconcile.Check); and [hotbench.ChangeHistory]
// alone leaves it clean for a full and an incremental run. Mechanisms, not timing.
func TestBenchJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("a bench run: about a minute")
	}
	ctx := context.Background()
	srv, err := localpg.Start(ctx, localpg.Options{Durable: true, Settings: map[string]string{
		"shared_preload_libraries": "pg_stat_statements"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	code, out, errOut := couponctlBin(t, []string{"DATABASE_URL=" + srv.URL(), "TMPDIR=" + childTMPDIR(t)},
		"bench", "--history", strconv.Itoa(jobsCoupons), "--jobs", "--turns", "1", "--duration", "1s", "--clients", "4", "--keep-history")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{hotbench.ReconcileTable, hotbench.PruneTable, "goal: at 10x this history", "A/A (alone after alone"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the output:\n%s", want, out)
		}
	}
	if strings.Contains(out, "coupons for") {
		t.Errorf("a hot cell's coupons differ from its ISSUED answers:\n%s", out)
	}
	wal := regexp.MustCompile(`goal: WAL per pruned row <= 2048 bytes: (\d+) `).FindStringSubmatch(out)
	if wal == nil || wal[1] == "0" {
		t.Errorf("no positive WAL per pruned row of the prune's statements:\n%s", out)
	}
	pruned := prunedInTable(t, out)

	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + historyRun{historyFlags: historyFlags{coupons: jobsCoupons, ids: "v7"}}.historyDBName()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var kept int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_pruned`).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if pruned == 0 || kept != pruned {
		t.Errorf("the table says %d rows pruned, outbox_pruned holds %d: want them equal and above 0", pruned, kept)
	}
	checkClean(t, pool, "after the bench")

	ch, err := hotbench.ChangeHistory(ctx, pool, 2000)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Issued != 2000 || ch.Voided != 200 {
		t.Errorf("ChangeHistory(2000): %+v, want 2000 issued and 200 voided", ch)
	}
	checkClean(t, pool, "after ChangeHistory")
	p, err := reconcile.Run(ctx, pool, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Full || len(p.Violations()) > 0 || p.ChangedCoupons < 2200 {
		t.Errorf("the incremental run after ChangeHistory: full %t, %d changed coupons, violations %v; want incremental, clean, 2,200 or more",
			p.Full, p.ChangedCoupons, p.Violations())
	}
}

// prunedInTable sums the prune table's "rows pruned" column.
func prunedInTable(t *testing.T, out string) int64 {
	t.Helper()
	var sum int64
	for _, m := range regexp.MustCompile(`(?m)^\s*\d+\s+(?:alone|beside)\s+\d+\s+[\d.]+\s+\S+\s+\S+\s+(\d+)\s`).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		sum += n
	}
	return sum
}

// checkClean fails t when the history of pool does not reconcile clean.
func checkClean(t *testing.T, pool *pgxpool.Pool, when string) {
	t.Helper()
	rep, err := reconcile.Check(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if v := rep.Violations(); len(v) > 0 {
		t.Errorf("%s: the history does not reconcile: %v", when, v)
	}
}
