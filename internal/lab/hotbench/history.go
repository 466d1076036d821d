package hotbench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// History is the shape of a year of issuance that [BuildHistory] writes: Coupons coupons over
// the 12 Asia/Tokyo months before the one containing Now, in time order, a month's coupons
// spread evenly over it; [HistoryCampaignsPerMonth] campaigns a month, each coupon of the
// month going to them in turn; Coupons / [CouponsPerMember] members, each coupon of a month to
// a different member (a member holds about one coupon a quarter); one coupon in
// [HistoryVoidEvery] voided an hour after its issue. The outbox is as a daily prune leaves it:
// the last month's rows sent and kept, the older months' pruned (outbox_pruned_at, outcome
// sent). The counters (campaign_budgets, member_monthly_usage) hold exactly the live coupons, so
// package reconcile finds the history clean.
type History struct {
	Coupons int64
	// V4IDs makes the coupon ids UUIDv4 (the releases before issue 42) instead of UUIDv7 stamped
	// with each coupon's issue time.
	V4IDs bool
	// Now places the history: its 12 months end where Now's month begins.
	Now time.Time
	// Chunk is the coupons written per statement; 0 is [HistoryChunk].
	Chunk int64
}

// Shape constants of [History].
const (
	HistoryMonths            = 12
	HistoryCampaignsPerMonth = 100
	CouponsPerMember         = 4  // the probe of issue 42: 20M coupons over 5M members
	HistoryVoidEvery         = 97 // about 1% voided
	HistoryChunk             = 250_000
)

// Members is the history's member count: members are "hm0" to "hm<Members-1>".
func (h History) Members() int64 { return max(1, h.Coupons/CouponsPerMember) }

// month is one month of the history: its coupons k in [lo, hi), its instants [start, end).
type historyMonth struct {
	label      string
	start, end time.Time
	lo, hi     int64
	last       bool
}

func (h History) months() []historyMonth {
	first := time.Date(h.Now.In(jst).Year(), h.Now.In(jst).Month()-HistoryMonths, 1, 0, 0, 0, 0, jst)
	out := make([]historyMonth, HistoryMonths)
	for i := range out {
		start := first.AddDate(0, i, 0)
		out[i] = historyMonth{label: start.Format("2006-01"), start: start, end: start.AddDate(0, 1, 0),
			lo: h.Coupons * int64(i) / HistoryMonths, hi: h.Coupons * int64(i+1) / HistoryMonths, last: i == HistoryMonths-1}
	}
	return out
}

// campaignsPerMonth is fewer than [HistoryCampaignsPerMonth] for a small history, so that each
// campaign has coupons.
func (h History) campaignsPerMonth() int64 {
	return min(HistoryCampaignsPerMonth, max(1, h.Coupons/HistoryMonths/100))
}

var jst = time.FixedZone("Asia/Tokyo", 9*3600)

// historyRows is the history's coupons k in [$1, $2) of one month, computed alike by both
// statements of a chunk: $3 the month's first k, $4 and $5 its instants, $6 its coupon count,
// $7 the campaign id prefix, $8 campaigns a month, $9 members. Coupon k goes to member
// k*2654435761 mod members: a prime above any member count, so the k of one month (fewer than
// the members) give distinct members.
var historyRows = `
  SELECT $7 || lpad((k % $8)::text, 3, '0') AS campaign_id,
         'hm' || ((k * 2654435761) % $9) AS member_id,
         100 * (1 + (k % $8) % 5) AS amount_yen,
         $4::timestamptz + ($5::timestamptz - $4::timestamptz) * ((k - $3)::float8 / $6) AS issued_at,
         k % ` + strconv.Itoa(HistoryVoidEvery) + ` = 0 AS voided
    FROM generate_series($1::bigint, $2::bigint - 1) k`

// sqlV7 is SQL for a UUIDv7 stamped with the instant at (an SQL expression): the instant's Unix
// milliseconds in the first 48 bits of a random uuid and the version nibble 7 (bits 52 and 53 of
// set_bit's numbering) over its 4.
func sqlV7(at string) string {
	return `encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
                 PLACING substring(int8send(floor(extract(epoch FROM ` + at + `) * 1000)::bigint) FROM 3) FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid`
}

// sqlHistoryCoupons writes the coupons of [historyRows] and, unless pruned ($12), their outbox
// rows, sent: $10 the month's label, $11 v7 ids ([sqlV7]), $13 the prune's instant.
var sqlHistoryCoupons = `
WITH s AS MATERIALIZED (
  SELECT CASE WHEN $11 THEN ` + sqlV7("issued_at") + `
              ELSE gen_random_uuid() END AS coupon_id, g.*
    FROM (` + historyRows + `) g),
c AS (
  INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, voided_at, voided_by, void_reason,
                              outbox_pruned_at, outbox_outcome)
  SELECT coupon_id, campaign_id, member_id, $10, amount_yen, issued_at,
         CASE WHEN voided THEN issued_at + interval '1 hour' END, CASE WHEN voided THEN 'bench-history' END,
         CASE WHEN voided THEN 'history' END, CASE WHEN $12 THEN $13::timestamptz END, CASE WHEN $12 THEN 'sent' END
    FROM s)
INSERT INTO notification_outbox (coupon_id, member_id, created_at, sent_at, attempts, next_attempt_at, first_pushed_at)
SELECT coupon_id, member_id, issued_at, issued_at + interval '2 seconds', 1, issued_at, issued_at + interval '2 seconds'
  FROM s WHERE NOT $12`

// sqlHistoryCounters adds the live coupons of [historyRows] to their members' usage of month
// $10 (a month's coupons go to distinct members) and to their campaigns' counters.
var sqlHistoryCounters = `
WITH g AS MATERIALIZED (` + historyRows + `),
u AS (
  INSERT INTO member_monthly_usage (member_id, month, used_yen)
  SELECT member_id, $10, amount_yen FROM g WHERE NOT voided)
UPDATE campaign_budgets b SET issued_yen = b.issued_yen + t.yen
  FROM (SELECT campaign_id, sum(amount_yen) AS yen FROM g WHERE NOT voided GROUP BY 1) t
 WHERE b.campaign_id = t.campaign_id AND b.stripe = 0`

// BuildHistory writes history h into the migrated database of pool, a month at a time in chunks
// of h.Chunk coupons, on two connections at once: one writes the coupons (in time order, as
// they were issued) and the kept outbox rows, the other the counters. Each chunk is one
// statement; the coupons' foreign keys are not checked when the pool's user may turn triggers
// off (session_replication_role, a superuser's: the rows are made consistent). It writes a
// progress line to progress (if not nil) after a chunk, at most every 5 s: coupons written,
// coupons/s and the time left at that rate; then VACUUMs and ANALYZEs the tables, as a year's
// history has been. It returns the coupons written.
func BuildHistory(ctx context.Context, pool *pgxpool.Pool, h History, progress io.Writer) (int64, error) {
	if h.Coupons <= 0 {
		return 0, nil
	}
	months := h.months()
	if err := createHistoryCampaigns(ctx, pool, h, months); err != nil {
		return 0, err
	}
	start := time.Now()
	var counted atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return h.writeChunks(gctx, pool, months, sqlHistoryCounters, func(m historyMonth) []any { return []any{m.label} },
			func(n int64) { counted.Add(n) })
	})
	said := time.Now()
	var done int64
	g.Go(func() error {
		return h.writeChunks(gctx, pool, months, sqlHistoryCoupons, func(m historyMonth) []any {
			return []any{m.label, !h.V4IDs, !m.last, m.end.AddDate(0, 0, 14)}
		}, func(n int64) {
			done += n
			if progress != nil && (time.Since(said) >= 5*time.Second || done == h.Coupons) {
				said = time.Now()
				rate := float64(done) / time.Since(start).Seconds()
				fmt.Fprintf(progress, "history: %d/%d coupons (counters %d), %.0f coupons/s, ETA %s\n", done, h.Coupons, counted.Load(), rate,
					time.Duration(float64(h.Coupons-done)/rate*float64(time.Second)).Round(time.Second))
			}
		})
	})
	if err := g.Wait(); err != nil {
		return done, err
	}
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) issued_coupons, member_monthly_usage, notification_outbox, campaign_budgets`); err != nil {
		return done, err
	}
	return done, nil
}

// writeChunks runs statement sql over every chunk of months, in order, on one connection of
// pool: [historyRows]' arguments, then extra(month)'s; after each chunk, wrote(its coupons).
func (h History) writeChunks(ctx context.Context, pool *pgxpool.Pool, months []historyMonth, sql string,
	extra func(historyMonth) []any, wrote func(int64)) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// Only a superuser may turn the foreign keys' triggers off; for another user they run.
	if _, err := conn.Exec(ctx, `SET session_replication_role = replica`); err == nil {
		defer func() { _, _ = conn.Exec(context.Background(), `RESET session_replication_role`) }()
	}
	chunk := h.Chunk
	if chunk <= 0 {
		chunk = HistoryChunk
	}
	for _, m := range months {
		for lo := m.lo; lo < m.hi; lo += chunk {
			hi := min(lo+chunk, m.hi)
			args := append([]any{lo, hi, m.lo, m.start, m.end, max(1, m.hi-m.lo), "HIST-" + m.label + "-", h.campaignsPerMonth(), h.Members()},
				extra(m)...)
			if _, err := conn.Exec(ctx, sql, args...); err != nil {
				return fmt.Errorf("hotbench: history chunk %d-%d (%s): %w", lo, hi, m.label, err)
			}
			wrote(hi - lo)
		}
	}
	return nil
}

// createHistoryCampaigns creates the history's campaigns through package campaign, one stripe
// each, a budget with room for all the coupons the history gives them.
func createHistoryCampaigns(ctx context.Context, pool *pgxpool.Pool, h History, months []historyMonth) error {
	per := h.campaignsPerMonth()
	for _, m := range months {
		room := (m.hi-m.lo)/per + 1
		for c := range per {
			discount := 100 * int(1+c%5)
			id := fmt.Sprintf("HIST-%s-%03d", m.label, c)
			if err := campaign.Create(ctx, pool, campaign.Campaign{ID: id, DiscountYen: discount, BudgetYen: discount * int(room)}); err != nil {
				return fmt.Errorf("hotbench: history campaign %s: %w", id, err)
			}
		}
	}
	return nil
}

// IndexSize is one index of the issuance's tables and its bytes per coupon of the database.
type IndexSize struct {
	Table, Index string
	Bytes        int64
	PerCoupon    float64
}

// IndexSizes lists the indexes of issued_coupons, notification_outbox and member_monthly_usage
// (pg_relation_size), largest first, each over the coupons (count of issued_coupons), and the
// coupons.
func IndexSizes(ctx context.Context, pool *pgxpool.Pool) ([]IndexSize, int64, error) {
	var coupons int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM issued_coupons`).Scan(&coupons); err != nil {
		return nil, 0, err
	}
	rows, err := pool.Query(ctx, `
SELECT indrelid::regclass::text, indexrelid::regclass::text, pg_relation_size(indexrelid)
  FROM pg_index WHERE indrelid IN ('issued_coupons'::regclass, 'notification_outbox'::regclass, 'member_monthly_usage'::regclass)
 ORDER BY 3 DESC`)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []IndexSize
	for rows.Next() {
		var s IndexSize
		if err := rows.Scan(&s.Table, &s.Index, &s.Bytes); err != nil {
			return nil, 0, err
		}
		s.PerCoupon = float64(s.Bytes) / float64(max(1, coupons))
		out = append(out, s)
	}
	return out, coupons, rows.Err()
}
