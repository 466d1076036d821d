package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/testkit/localpg"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/outbox"
)

// prune00035 is the prune of 00035 to 00038, kept here as the broken variant: it marks each
// pruned coupon in its own row (issued_coupons.outbox_pruned_at and outbox_outcome), a new version
// of a full page with an entry in each of the coupon's three indexes.
const prune00035 = `
WITH old AS MATERIALIZED (
  SELECT coupon_id FROM notification_outbox
   WHERE (sent_at IS NOT NULL OR skipped_at IS NOT NULL)
     AND COALESCE(sent_at, skipped_at) < now() - $1::interval
   ORDER BY COALESCE(sent_at, skipped_at)
   LIMIT $2
   FOR UPDATE SKIP LOCKED
), deleted AS (
  DELETE FROM notification_outbox o USING old WHERE o.coupon_id = old.coupon_id
  RETURNING o.coupon_id, CASE WHEN o.sent_at IS NOT NULL THEN 'sent' ELSE concat_ws(':', 'skipped', o.skip_reason) END AS outcome
), marked AS (
  UPDATE issued_coupons i SET outbox_pruned_at = now(), outbox_outcome = d.outcome FROM deleted d WHERE i.coupon_id = d.coupon_id RETURNING 1
)
SELECT count(*) FROM marked`

// Sizes of TestPruneWALPerRow: a history of walCoupons coupons, of which walBatches batches of
// outbox.PruneBatch rows are pruned, each after a CHECKPOINT.
const (
	walCoupons = 60_000
	walBatches = 12
	// walBoundPerRow is the WAL one pruned row may write here, in bytes: half issue 42's 2,048,
	// which holds at any history size. The prune itself writes 333-398 (this history and 20M);
	// a coupon-row update, the broken variant, grows with the history and writes 1,833-1,855 on
	// this small one since 00042 put its month-led index entries together (3,518-4,632 before),
	// so the goal's own 2,048 no longer tells them apart at 60,000 coupons.
	walBoundPerRow = 1024
)

// history60k ($1 coupons) is a history built set-based: coupons over 50 campaigns, members scattered as
// production's are (so the coupon's indexes are written at random leaves), issued a minute
// apart in time order; each coupon's outbox row closed a second after its issue, sent or (one in
// ten) skipped for want of a LINE account.
const history60k = `
INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) SELECT 'W' || g, 100, 1000000000 FROM generate_series(0, 49) g;
INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen, issued_at)
SELECT 'W' || (g % 50), 'm' || (g::bigint * 7919 % 1000003), '2026-0' || (1 + g * 9 / $1), 100,
       timestamptz '2026-01-01' + g * interval '1 minute'
  FROM generate_series(0, $1 - 1) g ORDER BY g;
INSERT INTO notification_outbox (coupon_id, member_id, created_at, next_attempt_at, attempts, sent_at, skipped_at, skip_reason)
SELECT coupon_id, member_id, issued_at, issued_at, 1,
       CASE WHEN n % 10 <> 0 THEN issued_at + interval '1 second' END,
       CASE WHEN n % 10 = 0 THEN issued_at + interval '1 second' END,
       CASE WHEN n % 10 = 0 THEN 'no_line_account' END
  FROM (SELECT *, row_number() OVER (ORDER BY issued_at) AS n FROM issued_coupons) c ORDER BY issued_at;
`

// TestPruneWALPerRow: a pruned row writes less than walBoundPerRow bytes of WAL, measured with
// the server's own LSN over walBatches batches, each after a CHECKPOINT, as at production's
// pace, where a checkpoint falls every few batches and each page a batch touches is written
// whole once (full_page_writes, which the other tests' servers turn off). Every pruned row's
// outcome is kept (sent or skipped:no_line_account, counted). Shown red on the prune of 00035,
// which updated the coupon row: 1.8 KB per row here (4.5 KB before 00042), 13.6 KB at 20M
// coupons (issue 42).
func TestPruneWALPerRow(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a history on a server of its own")
	}
	t.Parallel()
	ctx := context.Background()
	srv, err := localpg.Start(ctx, localpg.Options{Settings: map[string]string{
		"full_page_writes": "on", "autovacuum": "off", "max_wal_size": "4GB"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	variants := map[bool]func(context.Context, *pgxpool.Pool) (int64, error){
		false: func(ctx context.Context, p *pgxpool.Pool) (int64, error) {
			return outbox.Prune(ctx, p, 24*time.Hour, outbox.PruneBatch)
		},
		true: func(ctx context.Context, p *pgxpool.Pool) (int64, error) {
			var n int64
			err := p.QueryRow(ctx, prune00035, 24*time.Hour, outbox.PruneBatch).Scan(&n)
			return n, err
		},
	}
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%t", broken), func(t *testing.T) {
			pool := walHistory(t, srv, fmt.Sprintf("wal_%t", broken))
			var wal, rows int64
			for range walBatches {
				w, n := walOf(t, pool, variants[broken])
				wal, rows = wal+w, rows+n
			}
			var problems []string
			if want := int64(walBatches * outbox.PruneBatch); rows != want {
				t.Fatalf("pruned %d rows, want %d", rows, want)
			}
			if perRow := wal / rows; perRow >= walBoundPerRow {
				problems = append(problems, fmt.Sprintf("%d bytes of WAL per pruned row over %d rows, want < %d", perRow, rows, walBoundPerRow))
			} else {
				t.Logf("%d bytes of WAL per pruned row over %d rows", perRow, rows)
			}
			var kept, sent int64
			if err := pool.QueryRow(ctx, `
SELECT count(*), count(*) FILTER (WHERE outcome = 'sent')
  FROM (SELECT outcome FROM outbox_pruned UNION ALL SELECT outbox_outcome FROM issued_coupons WHERE outbox_pruned_at IS NOT NULL) k`).
				Scan(&kept, &sent); err != nil {
				t.Fatal(err)
			}
			if kept != rows || sent != rows*9/10 {
				t.Errorf("%d outcomes kept, %d of them sent, for %d pruned rows, want all kept and 9 in 10 sent", kept, sent, rows)
			}
			pgtest.Verdict(t, broken, problems)
		})
	}
}

// walHistory creates database name on srv, migrated, with history60k, and returns a pool on it.
func walHistory(t *testing.T, srv *localpg.Server, name string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	admin := pgtest.PoolAt(t, srv.URL(), 1)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", srv.Port(), name)
	if _, err := schema.MigrateURL(ctx, url); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.PoolAt(t, url, 2)
	for _, sql := range strings.Split(strings.ReplaceAll(history60k, "$1", strconv.Itoa(walCoupons)), ";\n") {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM (FREEZE, ANALYZE) issued_coupons, notification_outbox"); err != nil {
		t.Fatal(err)
	}
	return pool
}

// walOf runs a CHECKPOINT, then prune once, and returns the WAL bytes the prune wrote and the
// rows it pruned.
func walOf(t *testing.T, pool *pgxpool.Pool, prune func(context.Context, *pgxpool.Pool) (int64, error)) (wal, rows int64) {
	t.Helper()
	ctx := context.Background()
	var start string
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&start); err != nil {
		t.Fatal(err)
	}
	rows, err := prune(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint", start).Scan(&wal); err != nil {
		t.Fatal(err)
	}
	return wal, rows
}
