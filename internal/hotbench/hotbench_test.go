package hotbench_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/hotbench"
	"github.com/mops/coupon-api/internal/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// TestRunChecksEveryCell runs the whole bench for one second a cell at 2 clients, the product
// called in-process instead of over HTTP: both pgbench scripts run on the schema, every cell does
// work, and the rules and the coupon counts hold after each one. A request answered other than
// ISSUED is counted as failed.
func TestRunChecksEveryCell(t *testing.T) {
	if _, err := exec.LookPath(hotbench.DefaultPgbench); err != nil {
		t.Skipf("no pgbench: %v", err)
	}
	ctx := context.Background()
	url := pgtest.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc, err := issuance.New(pool, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	rs, err := hotbench.Run(ctx, hotbench.Config{
		DBURL: url, Clients: []int{2}, Duration: time.Second, CapYen: issuance.DefaultMonthlyCapYen, Progress: &progress,
		Issue: func(ctx context.Context, memberID, campaignID string) (string, error) {
			out, err := svc.Issue(ctx, memberID, campaignID)
			return string(out.Result), err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != len(hotbench.Variants) {
		t.Fatalf("%d results, want one per variant: %+v", len(rs), rs)
	}
	for _, r := range rs {
		if r.Done == 0 || r.TPS <= 0 || r.P99Ms < r.P50Ms || r.Failed != 0 || r.Rules != "held" {
			t.Errorf("%+v: want work done, no failure, rules held", r)
		}
	}
	if n := strings.Count(progress.String(), "\n"); n != len(rs) {
		t.Errorf("%d progress lines, want %d:\n%s", n, len(rs), progress.String())
	}
	var table bytes.Buffer
	if err := hotbench.WriteTable(&table, "markdown", rs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "| 2 | pgbench: the write-up's transaction |") || !strings.Contains(table.String(), " 1.00x |") {
		t.Errorf("table:\n%s", table.String())
	}
}

// TestPgbenchMissing: a pgbench that is not there is a clear error before anything runs.
func TestPgbenchMissing(t *testing.T) {
	_, err := hotbench.Run(context.Background(), hotbench.Config{Pgbench: "/nonexistent/pgbench", Clients: []int{1}, Duration: time.Second})
	if err == nil || !strings.Contains(err.Error(), "pgbench not found") {
		t.Errorf("err %v, want it to say pgbench was not found", err)
	}
}
