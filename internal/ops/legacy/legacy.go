// Package legacy reads the Before code's tables before the migration (couponctl legacy report)
// and undoes the counter side of it for a rollback (couponctl legacy rollback). The migration
// itself is schema/migrations/00001-00003; docs/migration.md is the runbook.
package legacy

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/shared/db"
)

// ErrMigrated is returned by [Read] on a database that already holds the new schema.
var ErrMigrated = errors.New("legacy: the database is already migrated (campaign_budgets exists): use couponctl reconcile")

// ErrNotLegacy is returned by [Read] on a database without the Before code's tables.
var ErrNotLegacy = errors.New("legacy: no Before-code tables (campaigns, issued_coupons) in this database")

// Campaign is one legacy campaign's figures, in yen.
type Campaign struct {
	CampaignID string `json:"campaign_id"`
	BudgetYen  int64  `json:"budget_yen"`
	// CounterYen is campaigns.issued_yen, the Before code's drifted counter.
	CounterYen int64 `json:"counter_yen"`
	// AllYen is the sum of all its coupons, duplicates included.
	AllYen int64 `json:"all_yen"`
	// LiveYen is what stays live after the migration voids the unredeemed duplicates: the
	// figure the rebuilt counter will hold.
	LiveYen int64 `json:"live_yen"`
}

// OvershootYen is how far the live coupons exceed the budget: the figure finance and promotion
// need, 0 within budget.
func (c Campaign) OvershootYen() int64 { return max(c.LiveYen-c.BudgetYen, 0) }

// DriftYen is the Before code's counter minus the sum of all coupons (its lost updates).
func (c Campaign) DriftYen() int64 { return c.CounterYen - c.AllYen }

// Report is what the legacy tables hold that the migration must deal with. Counts are rows,
// pairs or member-months.
type Report struct {
	Coupons int64 `json:"coupons"`
	// DuplicatePairs are (campaign, member) pairs with more than one coupon; RedeemedPairs of
	// them have at least one redeemed coupon.
	DuplicatePairs int64 `json:"duplicate_pairs"`
	RedeemedPairs  int64 `json:"duplicate_pairs_redeemed"`
	// ExtraCoupons are the coupons beyond the first of each pair: ToVoid of them were never
	// redeemed (the migration voids them), KeptRedeemed were (they stay live, marked).
	ExtraCoupons int64 `json:"extra_coupons"`
	ToVoid       int64 `json:"to_void"`
	KeptRedeemed int64 `json:"kept_redeemed"`
	// ClientMonthWrong are coupons whose month (chosen by the client) is not the Asia/Tokyo
	// month of issued_at.
	ClientMonthWrong int64 `json:"client_month_wrong"`
	// MembersOverCap are member x Tokyo-month pairs whose live coupons sum above the cap.
	MembersOverCap int64 `json:"members_over_cap"`
	// CapYen is the R3 cap checked against.
	CapYen int `json:"cap_yen"`
	// Campaigns lists every campaign; OverBudget and Drifted name the ones that need attention.
	Campaigns []Campaign `json:"campaigns"`
}

// sqlRanked ranks each (campaign, member)'s coupons as the migration does: a redeemed one first,
// then the earliest; rank 1 stays live, the others are duplicates.
const sqlRanked = `
WITH ranked AS (
  SELECT c.*, row_number() OVER (PARTITION BY campaign_id, member_id
                                 ORDER BY redeemed_at IS NULL, issued_at, coupon_id) AS rn
    FROM issued_coupons c),
live AS (SELECT * FROM ranked WHERE rn = 1 OR redeemed_at IS NOT NULL)`

// Read reads the legacy tables through q, checking R3 against capYen. Errors: [ErrMigrated],
// [ErrNotLegacy], or the database's.
func Read(ctx context.Context, q db.Querier, capYen int) (Report, error) {
	r := Report{CapYen: capYen}
	var hasLegacy, migrated bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('issued_coupons') IS NOT NULL AND to_regclass('campaigns') IS NOT NULL,
		to_regclass('campaign_budgets') IS NOT NULL`).Scan(&hasLegacy, &migrated); err != nil {
		return r, fmt.Errorf("legacy: %w", err)
	}
	switch {
	case migrated:
		return r, ErrMigrated
	case !hasLegacy:
		return r, ErrNotLegacy
	}
	err := q.QueryRow(ctx, sqlRanked+`
SELECT (SELECT count(*) FROM issued_coupons),
       (SELECT count(*) FROM (SELECT 1 FROM issued_coupons GROUP BY campaign_id, member_id HAVING count(*) > 1) d),
       (SELECT count(*) FROM (SELECT 1 FROM issued_coupons GROUP BY campaign_id, member_id
                               HAVING count(*) > 1 AND bool_or(redeemed_at IS NOT NULL)) d),
       (SELECT count(*) FROM ranked WHERE rn > 1),
       (SELECT count(*) FROM ranked WHERE rn > 1 AND redeemed_at IS NULL),
       (SELECT count(*) FROM ranked WHERE rn > 1 AND redeemed_at IS NOT NULL),
       (SELECT count(*) FROM issued_coupons WHERE month <> to_char(issued_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM')),
       (SELECT count(*) FROM (SELECT 1 FROM live
                               GROUP BY member_id, to_char(issued_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM')
                               HAVING SUM(amount_yen) > $1) o)`, capYen).
		Scan(&r.Coupons, &r.DuplicatePairs, &r.RedeemedPairs, &r.ExtraCoupons, &r.ToVoid, &r.KeptRedeemed,
			&r.ClientMonthWrong, &r.MembersOverCap)
	if err != nil {
		return r, fmt.Errorf("legacy: counts: %w", err)
	}
	rows, err := q.Query(ctx, sqlRanked+`
SELECT k.campaign_id, k.budget_yen::bigint, k.issued_yen::bigint,
       COALESCE((SELECT SUM(amount_yen) FROM issued_coupons i WHERE i.campaign_id = k.campaign_id), 0)::bigint,
       COALESCE((SELECT SUM(amount_yen) FROM live l WHERE l.campaign_id = k.campaign_id), 0)::bigint
  FROM campaigns k ORDER BY k.campaign_id`)
	if err != nil {
		return r, fmt.Errorf("legacy: campaigns: %w", err)
	}
	if r.Campaigns, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Campaign]); err != nil {
		return r, fmt.Errorf("legacy: campaigns: %w", err)
	}
	return r, nil
}

// OvershootYen is the sum of every campaign's overshoot.
func (r Report) OvershootYen() int64 {
	var n int64
	for _, c := range r.Campaigns {
		n += c.OvershootYen()
	}
	return n
}

// Write prints the report for people.
func (r Report) Write(w io.Writer) {
	fmt.Fprintf(w, "legacy tables: %d coupons in %d campaigns\n", r.Coupons, len(r.Campaigns))
	fmt.Fprintf(w, "duplicates: %d (campaign, member) pairs, %d with a redeemed coupon; %d extra coupons: %d to void (never redeemed), %d redeemed kept live\n",
		r.DuplicatePairs, r.RedeemedPairs, r.ExtraCoupons, r.ToVoid, r.KeptRedeemed)
	fmt.Fprintf(w, "client months: %d coupons whose month is not the Asia/Tokyo month of issue (recomputed; the client's kept as client_month)\n", r.ClientMonthWrong)
	fmt.Fprintf(w, "monthly cap: %d member-months over %d yen after voiding\n", r.MembersOverCap, r.CapYen)
	fmt.Fprintf(w, "\n%-12s %12s %12s %12s %12s %12s %12s\n", "campaign", "budget_yen", "counter_yen", "all_yen", "live_yen", "overshoot", "drift")
	for _, c := range r.Campaigns {
		fmt.Fprintf(w, "%-12s %12d %12d %12d %12d %12d %+12d\n", c.CampaignID, c.BudgetYen, c.CounterYen, c.AllYen, c.LiveYen, c.OvershootYen(), c.DriftYen())
	}
	fmt.Fprintf(w, "\nover budget after the migration: %d yen in all (report to finance and promotion; the migration keeps it and lets nothing add to it)\n", r.OvershootYen())
}

// Rollback writes the rebuilt counters back where the Before code reads them,
// campaigns.issued_yen = the campaign's issued yen summed over its budget stripes, for every
// campaign, in one transaction, and returns how many campaigns it wrote. Run it after stopping
// the new functions and before starting the old code (docs/migration.md, "Roll back"); the unique
// index and the NOT VALID CHECK stay, harmless to the old code.
func Rollback(ctx context.Context, conn interface {
	Begin(context.Context) (pgx.Tx, error)
}) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `
UPDATE campaigns c SET issued_yen = b.issued_yen
  FROM (SELECT campaign_id, SUM(issued_yen)::integer AS issued_yen FROM campaign_budgets GROUP BY campaign_id) b
 WHERE c.campaign_id = b.campaign_id`)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("legacy: rollback: %w", err)
	}
	return n, nil
}
