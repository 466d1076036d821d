package hotbench_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/lab/hotbench"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestHistoryReconcilesClean builds small histories with v7 and v4 ids and checks them with SQL:
// package reconcile finds each clean; every coupon is in the 12 months before now, a month's
// coupons of distinct members; about one in 97 voided; the outbox keeps only the last month's
// rows, every older coupon marked pruned; the v7 ids carry their issue time's milliseconds, so
// key order is issue order; the v4 ids are version 4.
func TestHistoryReconcilesClean(t *testing.T) {
	t.Parallel()
	for _, v4 := range []bool{false, true} {
		t.Run(map[bool]string{false: "v7", true: "v4"}[v4], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t, 4)
			now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
			h := hotbench.History{Coupons: 12_000, V4IDs: v4, Now: now, Chunk: 300}
			var progress bytes.Buffer
			n, err := hotbench.BuildHistory(ctx, pool, h, &progress)
			if err != nil || n != h.Coupons {
				t.Fatalf("BuildHistory: %d coupons, %v", n, err)
			}
			if !strings.Contains(progress.String(), "12000/12000 coupons") {
				t.Errorf("progress %q: want the last line's 12000/12000 coupons", progress.String())
			}
			rep, err := reconcile.Check(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			if v := rep.Violations(); len(v) > 0 {
				t.Fatalf("reconcile: %v", v)
			}
			checkHistory(t, pool, h)
		})
	}
}

func checkHistory(t *testing.T, pool *pgxpool.Pool, h hotbench.History) {
	t.Helper()
	var (
		coupons, months, voided, outbox, unpruned, pairs, memberMonths, v7, keyOrder int64
		first, last                                                                  string
	)
	err := pool.QueryRow(context.Background(), `
SELECT count(*), count(DISTINCT month), count(*) FILTER (WHERE voided_at IS NOT NULL),
       (SELECT count(*) FROM notification_outbox), count(*) FILTER (WHERE outbox_pruned_at IS NULL),
       count(DISTINCT (campaign_id, member_id)), count(DISTINCT (member_id, month)), min(month), max(month),
       count(*) FILTER (WHERE substr(coupon_id::text, 15, 1) = '7'
                          AND ('x' || lpad(replace(left(coupon_id::text, 13), '-', ''), 16, '0'))::bit(64)::bigint
                              = floor(extract(epoch FROM issued_at) * 1000)::bigint),
       (SELECT count(*) FROM (SELECT issued_at < lead(issued_at) OVER (ORDER BY coupon_id) OR lead(issued_at) OVER (ORDER BY coupon_id) IS NULL AS ok
                               FROM issued_coupons) o WHERE ok)
  FROM issued_coupons`).Scan(&coupons, &months, &voided, &outbox, &unpruned, &pairs, &memberMonths, &first, &last, &v7, &keyOrder)
	if err != nil {
		t.Fatal(err)
	}
	if coupons != h.Coupons || months != 12 || first != "2025-12" || last != "2026-11" {
		t.Errorf("%d coupons in %d months %s to %s, want %d in the 12 from 2025-12 to 2026-11", coupons, months, first, last, h.Coupons)
	}
	if want := (h.Coupons + hotbench.HistoryVoidEvery - 1) / hotbench.HistoryVoidEvery; voided != want {
		t.Errorf("%d voided, want %d (one in 97)", voided, want)
	}
	if outbox != h.Coupons/12 || unpruned != outbox {
		t.Errorf("%d outbox rows, %d coupons unpruned; want the last month's %d, the rest pruned", outbox, unpruned, h.Coupons/12)
	}
	if pairs != coupons || memberMonths != coupons {
		t.Errorf("%d (campaign, member) pairs and %d (member, month) for %d coupons: want one each", pairs, memberMonths, coupons)
	}
	if !h.V4IDs && (v7 != coupons || keyOrder != coupons) {
		t.Errorf("%d v7 ids stamped with their issue time and %d in issue order by key, of %d", v7, keyOrder, coupons)
	}
	if h.V4IDs {
		var id string
		if err := pool.QueryRow(context.Background(), `SELECT coupon_id::text FROM issued_coupons LIMIT 1`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if uuid.MustParse(id).Version() != 4 || v7 != 0 {
			t.Errorf("v4 history: id %s, %d v7 ids", id, v7)
		}
	}
}

// TestHistoryBenchRuns runs one short turn on an empty database and a small history: each cell
// issues, its coupons match its ISSUED answers, both databases are ANALYZEd before each turn,
// and the table has both databases' rows.
func TestHistoryBenchRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	empty, full := pgtest.Pool(t, 8), pgtest.Pool(t, 8)
	h := hotbench.History{Coupons: 4_000, Now: time.Now()}
	if _, err := hotbench.BuildHistory(ctx, full, h, nil); err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	b := hotbench.HistoryBench{Empty: poolURL(empty), Full: poolURL(full), History: h, Clients: 2, Duration: time.Second, Turns: 1, Progress: &progress}
	turns, err := b.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(turns) != 4 {
		t.Fatalf("%d cells, want 4 (2 cells x 2 databases x 1 turn)", len(turns))
	}
	for _, r := range turns {
		if r.Issued == 0 || r.Failed != 0 || r.Rules != "held" {
			t.Errorf("%s on %s: %d issued, %d failed, rules %s", r.Cell, r.DB, r.Issued, r.Failed, r.Rules)
		}
	}
	// Both databases are ANALYZEd before each turn, the warm-up's included (red before: the
	// empty one never was).
	for name, p := range map[string]*pgxpool.Pool{"empty": empty, "history": full} {
		var analyzed int64
		if err := p.QueryRow(ctx, `SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'issued_coupons'`).Scan(&analyzed); err != nil {
			t.Fatal(err)
		}
		if analyzed < int64(b.Turns)+1 {
			t.Errorf("the %s database's issued_coupons ANALYZEd %d times, want one per turn (%d)", name, analyzed, b.Turns+1)
		}
	}
	var out bytes.Buffer
	if err := hotbench.WriteHistoryTable(&out, turns); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{hotbench.HistoryHot, hotbench.HistoryCold, "history", "empty", "rate ratio"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("%s\n%s", progress.String(), out.String())
}

func poolURL(p *pgxpool.Pool) string { return p.Config().ConnString() }
