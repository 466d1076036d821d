package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// runCLI runs the command line with args and returns its stdout, stderr and error.
func runCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := rootCmd()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	err := root.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// TestDemoAsksBeforeWritingIntoDatabaseURL: with DATABASE_URL set and no --yes, the demo
// refuses before connecting, and says what it would write and how to allow it.
func TestDemoAsksBeforeWritingIntoDatabaseURL(t *testing.T) {
	// Port 1 on loopback: nothing listens, so a demo that tried to connect would fail otherwise.
	t.Setenv("DATABASE_URL", "postgres://someone:secret@127.0.0.1:1/production")
	_, stderr, err := runCLI(t, "demo", "--members", "1")
	if err == nil || !strings.Contains(err.Error(), "--yes") || !strings.Contains(err.Error(), "write") {
		t.Fatalf("demo with DATABASE_URL and no --yes: %v; want a refusal that names --yes", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("the refusal shows the password: %v", err)
	}
	if strings.Contains(stderr, "using DATABASE_URL") {
		t.Errorf("the demo went on to use DATABASE_URL: %s", stderr)
	}
}

// TestSimChecksChartFirst: a --chart whose format or directory is wrong fails before any run
// (no server is started), not after the minutes of runs.
func TestSimChecksChartFirst(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	small := []string{"sim", "--strategies", "good", "--workers", "1", "--runs", "1", "--members", "1"}
	for _, c := range []struct{ chart, want string }{
		{filepath.Join(t.TempDir(), "missing-dir", "lab.png"), "cannot create a file"},
		{filepath.Join(t.TempDir(), "lab.gif"), "extension names the format"},
		{filepath.Join(t.TempDir(), "lab"), "extension names the format"},
	} {
		_, stderr, err := runCLI(t, append(small, "--chart", c.chart)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--chart %s: %v, want an error with %q", c.chart, err, c.want)
		}
		if strings.Contains(stderr, "throwaway") {
			t.Errorf("--chart %s: a server was started before the chart's path was checked:\n%s", c.chart, stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(t.TempDir(), "lab.gif")); err == nil {
		t.Errorf("a refused chart was written")
	}
}

// TestCampaignListTable: amounts in yen and in coupons, Tokyo periods, and each campaign's state
// as the database judged it, in campaign list's words.
func TestCampaignListTable(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	past, future := now.Add(-48*time.Hour), now.Add(48*time.Hour)
	var b bytes.Buffer
	writeCampaignList(&b, []campaign.Status{
		{Campaign: campaign.Campaign{ID: "OPEN", DiscountYen: 1000, BudgetYen: 100000}, IssuedYen: 3000, State: campaign.StateActive, RemainingCoupons: 97},
		{Campaign: campaign.Campaign{ID: "SOON", DiscountYen: 500, BudgetYen: 1000, StartsAt: &future}, State: campaign.StateNotStarted, OpensAt: &future},
		{Campaign: campaign.Campaign{ID: "OVER", DiscountYen: 500, BudgetYen: 1000, EndsAt: &past}, State: campaign.StateEnded},
		{Campaign: campaign.Campaign{ID: "SPENT", DiscountYen: 500, BudgetYen: 1000}, IssuedYen: 1000, State: campaign.StateSoldOut},
		{Campaign: campaign.Campaign{ID: "HELD", DiscountYen: 500, BudgetYen: 1000}, PausedAt: &past, State: campaign.StatePaused},
	})
	got := b.String()
	for _, want := range []string{
		"campaign", "remaining_yen", "state",
		"OPEN      1000          100000      3000        97000          3/100                  97                 (open)",
		"SOON", "not started", future.In(tokyo(t)).Format(time.RFC3339),
		"OVER", "ended",
		"SPENT", "active (budget spent)",
		"HELD", "paused since " + past.In(tokyo(t)).Format(time.RFC3339),
	} {
		if !strings.Contains(got, want) {
			t.Errorf("campaign list lacks %q:\n%s", want, got)
		}
	}
	b.Reset()
	writeCampaignList(&b, nil)
	if !strings.Contains(b.String(), "no campaigns") {
		t.Errorf("empty list: %q", b.String())
	}
}

func tokyo(t *testing.T) *time.Location {
	l, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestDemoIntoAnEmptyDatabase: with --yes, an empty unmigrated database is accepted (the check
// for data in use counts only the tables that exist), one holding an outbox row is refused, and a
// bad telemetry setting is refused before anything is written.
func TestDemoIntoAnEmptyDatabase(t *testing.T) {
	ctx := context.Background()
	empty := pgtest.EmptyURL(t)
	if err := refuseDataInUse(ctx, empty, demoConsequence); err != nil {
		t.Errorf("an empty, unmigrated database: %v, want it accepted", err)
	}

	t.Setenv("DATABASE_URL", empty)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp_gogle")
	if _, _, err := runCLI(t, "demo", "--yes", "--members", "1"); err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_EXPORTER") {
		t.Errorf("demo with a misspelt exporter: %v, want a refusal naming OTEL_TRACES_EXPORTER", err)
	}
	conn, err := pgx.Connect(ctx, empty)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var tables int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil || tables != 0 {
		t.Errorf("the refused demo left %d tables (%v), want none", tables, err)
	}

	used := pgtest.URL(t)
	if _, err := seedOneOutboxRow(ctx, used); err != nil {
		t.Fatal(err)
	}
	if err := refuseDataInUse(ctx, used, demoConsequence); err == nil || !strings.Contains(err.Error(), "1 outbox rows") {
		t.Errorf("a database with an outbox row: %v, want a refusal counting it", err)
	}
}

// seedOneOutboxRow writes one coupon and its outbox row.
func seedOneOutboxRow(ctx context.Context, url string) (pgconn.CommandTag, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer conn.Close(ctx)
	return conn.Exec(ctx, `
WITH k AS (INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('T', 1000, 1000000)),
c AS (INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen) VALUES ('T', 'm1', '2026-11', 1000)
  RETURNING coupon_id, member_id)
INSERT INTO notification_outbox (coupon_id, member_id) SELECT coupon_id, member_id FROM c`)
}
