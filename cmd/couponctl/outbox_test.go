package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/shared/issuance"
)

// TestMain runs each test in a shard of its own (pgtest.MainShards): most set DATABASE_URL with
// t.Setenv for the verbs they run in this process, so they cannot call t.Parallel. The longest
// start first, those that mostly wait (for a stalled client's 30 s) among those that work.
func TestMain(m *testing.M) {
	pgtest.MainShards(m, []string{
		"TestDrillPassesWithEveryFault", "TestGrantKilledAndRerun",
		"TestHeaderDecidedAnswersDoNotWaitForTheBody", "TestDemoServerBoundsStalledClients",
		"TestGrantInterrupted", "TestDemoLogCountsMatchFile", "TestDrillFailsWhenCommitsAreLost",
		"TestDemoWithMoreWorkersThanConnections", "TestSimOutputFitsAndChartSaysMeans",
		"TestGrantStopsWhenTheDatabaseStops", "TestGrantIdempotent", "TestGrantAnswerLostAndNotLookedUp",
		"TestVoidFileStopsWhenTheDatabaseStops", "TestDemoInterrupted", "TestServeChecksThenServesThenStops",
	}, proctest.RemoveBuilds)
}

// couponctl runs the CLI with args against DATABASE_URL and returns its output and error.
func couponctl(args ...string) (string, error) {
	var out bytes.Buffer
	root := rootCmd()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// TestRequeueRefusesExpiredRetryKey parks a row first pushed 25 hours ago: "outbox requeue"
// refuses it, says why and exits non-zero; with --force it requeues it. "line link" refuses a
// LINE user id out of format before touching the database, and links a good one.
func TestRequeueRefusesExpiredRetryKey(t *testing.T) {
	url := pgtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var id string
	err = pool.QueryRow(ctx, `
WITH k AS (INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('T', 1000, 1000000)),
c AS (INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen) VALUES ('T', 'm1', '2026-11', 1000)
      RETURNING coupon_id)
INSERT INTO notification_outbox (coupon_id, member_id, attempts, parked_at, first_pushed_at, last_error)
SELECT coupon_id, 'm1', 1, now(), now() - interval '25 hours', 'not re-sent' FROM c
RETURNING coupon_id::text`).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}

	if out, err := couponctl("line", "link", "--member", "m1", "--line-user", "m1"); err == nil ||
		!strings.Contains(err.Error(), "32 lowercase hex") {
		t.Errorf("link with a member id as LINE user: %v\n%s; want a format error", err, out)
	}
	if out, err := couponctl("line", "link", "--member", "m1", "--line-user", "U0123456789abcdef0123456789abcdef"); err != nil {
		t.Fatalf("link: %v\n%s", err, out)
	}

	out, err := couponctl("outbox", "requeue", id)
	if err == nil || !strings.Contains(out, "REFUSED 1") || !strings.Contains(out, "--force") || !strings.Contains(out, "twice") {
		t.Errorf("requeue without --force: %v\n%s; want refused with the reason and --force", err, out)
	}
	var parked bool
	if err := pool.QueryRow(ctx, `SELECT parked_at IS NOT NULL FROM notification_outbox`).Scan(&parked); err != nil || !parked {
		t.Errorf("row parked=%v (%v) after the refused requeue, want still parked", parked, err)
	}
	if out, err := couponctl("outbox", "requeue", "--force", id); err != nil || !strings.Contains(out, "requeued 1 rows") {
		t.Errorf("requeue --force: %v\n%s; want requeued", err, out)
	}
	if err := pool.QueryRow(ctx, `SELECT parked_at IS NOT NULL OR first_pushed_at IS NOT NULL FROM notification_outbox`).Scan(&parked); err != nil || parked {
		t.Errorf("after --force: parked or first push kept (%v), want an open row with a fresh window", err)
	}
}

// TestPruneAsAdminKeepsRelayRetention runs "outbox prune", the daily operator job, as a user in
// coupon_admin (docs/roles.md): without --older-than it keeps RELAY_RETENTION (168h here, so the
// row sent 10 days ago goes and the one sent 3 days ago stays); --older-than 48h takes that too.
func TestPruneAsAdminKeepsRelayRetention(t *testing.T) {
	url := pgtest.URL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `
WITH k AS (INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('T', 1000, 1000000)),
c AS (INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
      VALUES ('T', 'm1', '2026-11', 1000), ('T', 'm2', '2026-11', 1000) RETURNING coupon_id, member_id)
INSERT INTO notification_outbox (coupon_id, member_id, sent_at)
SELECT coupon_id, member_id, now() - CASE member_id WHEN 'm1' THEN interval '10 days' ELSE interval '3 days' END FROM c`); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DATABASE_URL", pgtest.LoginAs(t, url, "coupon_admin"))
	t.Setenv("RELAY_RETENTION", "168h")
	for _, step := range []struct {
		args []string
		want string
	}{
		{[]string{"outbox", "prune"}, "deleted 1 sent and skipped rows closed more than 168h0m0s ago"},
		{[]string{"outbox", "prune", "--older-than", "48h"}, "deleted 1 sent and skipped rows closed more than 48h0m0s ago"},
	} {
		if out, err := couponctl(step.args...); err != nil || !strings.Contains(out, step.want) {
			t.Errorf("%v: %v\n%s; want %q", step.args, err, out, step.want)
		}
	}
}

// TestReconcileDriftAndRepair: a campaign counter changed by hand makes "reconcile" exit 1 and
// name the campaign and the drift, in text and JSON; "reconcile --repair" rebuilds it and exits
// 0, and a plain "reconcile" then finds nothing.
func TestReconcileDriftAndRepair(t *testing.T) {
	url := pgtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if out, err := couponctl("campaign", "create", "--id", "DRIFT", "--discount-yen", "1000", "--budget-yen", "10000"); err != nil {
		t.Fatalf("campaign create: %v\n%s", err, out)
	}
	if _, err := pool.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = 3000 WHERE campaign_id = 'DRIFT'`); err != nil {
		t.Fatal(err)
	}
	out, err := couponctl("reconcile")
	if !errors.Is(err, errViolations) || !strings.Contains(out, "R1 DRIFT") || !strings.Contains(out, "drift +3000 yen") {
		t.Errorf("reconcile on a drifted counter: %v\n%s\nwant exit 1 naming DRIFT and +3000 yen", err, out)
	}
	out, err = couponctl("reconcile", "--format", "json")
	var rep struct {
		Violations []string `json:"violations"`
	}
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil || !errors.Is(err, errViolations) || len(rep.Violations) != 1 {
		t.Errorf("reconcile --format json: %v, %v\n%s\nwant one violation", err, jerr, out)
	}
	if out, err := couponctl("reconcile", "--repair"); err != nil || !strings.Contains(out, "campaign DRIFT: counter 3000 -> 0 yen") {
		t.Errorf("reconcile --repair: %v\n%s", err, out)
	}
	if out, err := couponctl("reconcile"); err != nil {
		t.Errorf("reconcile after the repair: %v\n%s", err, out)
	}
}

// TestPruneThenReconcile: after "outbox prune --older-than 1s --force" deletes the delivered rows,
// "reconcile" exits 0: each pruned row's coupon is marked, whatever the retention. It still
// catches an outbox row deleted by hand. The broken variant, a prune that deletes without
// marking (as before), makes reconcile report the pruned coupons as lost.
func TestPruneThenReconcile(t *testing.T) {
	url := pgtest.URL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	t.Setenv("DATABASE_URL", url)
	if out, err := couponctl("campaign", "create", "--id", "P", "--discount-yen", "100", "--budget-yen", "100000"); err != nil {
		t.Fatalf("campaign create: %v\n%s", err, out)
	}
	svc, err := issuance.New(pool, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 13 {
		if out, err := svc.Issue(ctx, fmt.Sprintf("m%02d", i), "P"); err != nil || out.Result != issuance.ResultIssued {
			t.Fatalf("issue: %+v %v", out, err)
		}
	}
	// Delivered two seconds ago: 10 sent, 3 skipped; the prune takes all 13.
	if _, err := pool.Exec(ctx, `
UPDATE notification_outbox SET sent_at = now() - interval '2 s' WHERE member_id < 'm10';
UPDATE notification_outbox SET skipped_at = now() - interval '2 s', last_error = 'no LINE' WHERE member_id >= 'm10'`); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DATABASE_URL", pgtest.LoginAs(t, url, "coupon_admin"))
	if out, err := couponctl("outbox", "prune", "--older-than", "1s", "--force"); err != nil || !strings.Contains(out, "deleted 13 ") {
		t.Fatalf("outbox prune: %v\n%s", err, out)
	}
	if out, err := couponctl("reconcile"); err != nil {
		t.Errorf("reconcile after the prune: %v\n%s", err, out)
	}

	// A truly missing row: one coupon's outbox row deleted by hand.
	if _, err := pool.Exec(ctx, `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
		SELECT 'P', 'lost', to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 100;
		UPDATE campaign_budgets SET issued_yen = issued_yen + 100 WHERE campaign_id = 'P';
		INSERT INTO member_monthly_usage (member_id, month, used_yen) VALUES ('lost', to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 100)`); err != nil {
		t.Fatal(err)
	}
	if out, err := couponctl("reconcile"); !errors.Is(err, errViolations) || !strings.Contains(out, "outbox: 1 coupons without an outbox row") {
		t.Errorf("reconcile with a lost outbox row: %v\n%s\nwant exit 1 naming it", err, out)
	}

	// The broken variant: delete delivered rows without marking their coupons.
	if _, err := pool.Exec(ctx, `DELETE FROM issued_coupons WHERE member_id = 'lost';
		UPDATE campaign_budgets SET issued_yen = issued_yen - 100 WHERE campaign_id = 'P';
		DELETE FROM member_monthly_usage WHERE member_id = 'lost'`); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if out, err := svc.Issue(ctx, fmt.Sprintf("n%02d", i), "P"); err != nil || out.Result != issuance.ResultIssued {
			t.Fatalf("issue: %+v %v", out, err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE notification_outbox SET sent_at = now() - interval '2 s' WHERE sent_at IS NULL AND skipped_at IS NULL;
		DELETE FROM notification_outbox WHERE sent_at < now() - interval '1 s'`); err != nil {
		t.Fatal(err)
	}
	if out, err := couponctl("reconcile"); !errors.Is(err, errViolations) || !strings.Contains(out, "outbox: 3 coupons without an outbox row") {
		t.Errorf("the broken prune: reconcile %v\n%s\nwant the 3 unmarked coupons reported", err, out)
	}
}
