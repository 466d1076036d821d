package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
)

func TestMain(m *testing.M) { pgtest.Main(m, proctest.RemoveBuilds) }

// couponops runs the command line in-process and returns its exit code and output.
func couponops(args ...string) (int, string) {
	var out bytes.Buffer
	code := run(context.Background(), args, &out, &out)
	return code, out.String()
}

// TestVerbs runs each verb on a real PostgreSQL: migrate twice (the second finds nothing to
// do), reconcile on a clean database (exit 0) and on a drifted counter (exit 1, the drift
// named), outbox prune; and refuses command lines it does not understand with exit 2.
func TestVerbs(t *testing.T) {
	url := pgtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	if code, out := couponops("migrate"); code != 0 || !strings.Contains(out, "schema is up to date") {
		t.Errorf("migrate on a migrated database: exit %d\n%s", code, out)
	}
	if code, out := couponops("reconcile"); code != 0 {
		t.Errorf("reconcile on a clean database: exit %d\n%s", code, out)
	}
	if code, out := couponops("outbox", "prune", "--older-than", "1h", "--force"); code != 0 || !strings.Contains(out, "deleted 0 ") {
		t.Errorf("outbox prune: exit %d\n%s", code, out)
	}
	drift(t, url)
	if code, out := couponops("reconcile"); code != 1 || !strings.Contains(out, "R1 DRIFT") {
		t.Errorf("reconcile on a drifted counter: exit %d, want 1 and the drift\n%s", code, out)
	}
	for _, args := range [][]string{{"bogus"}, {"reconcile", "--bogus"}, {"outbox"}, {"outbox", "prune", "extra"}, {"demo"}} {
		if code, out := couponops(args...); code != 2 || !strings.Contains(out, "Usage:") {
			t.Errorf("couponops %v: exit %d, want 2 with the usage\n%s", args, code, out)
		}
	}
	if code, out := couponops("--help"); code != 0 || !strings.Contains(out, "reconcile") || strings.Contains(out, "demo") {
		t.Errorf("couponops --help: exit %d\n%s", code, out)
	}
}

// drift makes campaign DRIFT's counter say 3,000 yen issued with no coupon behind it.
func drift(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := campaign.Create(ctx, conn, campaign.Campaign{ID: "DRIFT", DiscountYen: 1000, BudgetYen: 10000}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = 3000 WHERE campaign_id = 'DRIFT'`); err != nil {
		t.Fatal(err)
	}
}
