package reconcile

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Repaired is what [Repair] changed, in yen.
type Repaired struct {
	// Campaigns are the campaign counters rebuilt: before and after, summed over the stripes.
	Campaigns []CounterFix `json:"campaigns"`
	// Usage are the member x month counters rebuilt.
	Usage []CounterFix `json:"usage"`
	// Refused names the campaigns whose live coupons exceed their budget: the counter cannot be
	// written past the budget (issued_within_budget), so they are left for an operator.
	Refused []string `json:"refused,omitempty"`
}

// CounterFix is one counter rebuilt from its rows.
type CounterFix struct {
	Key       string `json:"key"` // campaign id, or member id and month
	BeforeYen int64  `json:"before_yen"`
	AfterYen  int64  `json:"after_yen"`
}

// repairLockTimeout bounds each lock the repair waits for, so that a repair queued behind a long
// transaction gives up (55P03) instead of holding issuances behind it.
const repairLockTimeout = "2s"

// Repair rebuilds every drifted counter from the live coupons in one READ COMMITTED transaction
// that locks each row it fixes before it counts, with the repair's lock protocol (docs/design.md,
// "Lock order": month rows, then each campaign's stripes), so it cannot deadlock with a writer. A
// coupon committed while the repair waited for a lock is counted, because the count is a new
// statement after the lock; one still in flight adds to the counter after the repair commits.
// A campaign's total is laid over its stripes in stripe order, each up to its own budget.
// Errors: the database's (55P03 when a row stays locked past the lock timeout); nothing is
// written then.
func Repair(ctx context.Context, conn interface {
	Begin(context.Context) (pgx.Tx, error)
}) (Repaired, error) {
	var rep Repaired
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rep = Repaired{}
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, repairLockTimeout); err != nil {
			return err
		}
		if err := repairUsage(ctx, tx, &rep); err != nil {
			return err
		}
		return repairCampaigns(ctx, tx, &rep)
	})
	if err != nil {
		return Repaired{}, fmt.Errorf("reconcile: repair: %w", err)
	}
	return rep, nil
}

const sqlUsageDrifted = `
WITH live AS (SELECT member_id, month, SUM(amount_yen) AS s FROM issued_coupons
               WHERE voided_at IS NULL GROUP BY member_id, month)
SELECT member_id, month FROM live l FULL JOIN member_monthly_usage u USING (member_id, month)
 WHERE COALESCE(l.s, 0) <> COALESCE(u.used_yen, 0)
 ORDER BY member_id, month`

func repairUsage(ctx context.Context, tx pgx.Tx, rep *Repaired) error {
	rows, err := tx.Query(ctx, sqlUsageDrifted)
	if err != nil {
		return err
	}
	type key struct{ Member, Month string }
	keys, err := pgx.CollectRows(rows, pgx.RowToStructByPos[key])
	if err != nil {
		return err
	}
	for _, k := range keys {
		var before int64
		err := tx.QueryRow(ctx, `
INSERT INTO member_monthly_usage (member_id, month) VALUES ($1, $2)
ON CONFLICT (member_id, month) DO UPDATE SET used_yen = member_monthly_usage.used_yen
RETURNING used_yen`, k.Member, k.Month).Scan(&before) // locks the row, creating it if missing
		if err != nil {
			return err
		}
		var after int64
		if err := tx.QueryRow(ctx, `
UPDATE member_monthly_usage SET used_yen = (
  SELECT COALESCE(SUM(amount_yen), 0) FROM issued_coupons
   WHERE member_id = $1 AND month = $2 AND voided_at IS NULL)
 WHERE member_id = $1 AND month = $2
RETURNING used_yen`, k.Member, k.Month).Scan(&after); err != nil {
			return err
		}
		if after != before {
			rep.Usage = append(rep.Usage, CounterFix{Key: k.Member + " " + k.Month, BeforeYen: before, AfterYen: after})
		}
	}
	return nil
}

const sqlCampaignsDrifted = `
SELECT b.campaign_id
  FROM (SELECT campaign_id, SUM(issued_yen) AS issued_yen FROM campaign_budgets GROUP BY campaign_id) b
  LEFT JOIN (SELECT campaign_id, SUM(amount_yen) AS s FROM issued_coupons
              WHERE voided_at IS NULL GROUP BY campaign_id) l USING (campaign_id)
 WHERE b.issued_yen <> COALESCE(l.s, 0)
 ORDER BY b.campaign_id`

func repairCampaigns(ctx context.Context, tx pgx.Tx, rep *Repaired) error {
	rows, err := tx.Query(ctx, sqlCampaignsDrifted)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := repairCampaign(ctx, tx, id, rep); err != nil {
			return err
		}
	}
	return nil
}

func repairCampaign(ctx context.Context, tx pgx.Tx, id string, rep *Repaired) error {
	type stripe struct {
		Stripe               int
		BudgetYen, IssuedYen int64
	}
	// The campaign changes' lock protocol (00010_live_campaigns.sql): stripe 0 first, then, in a
	// statement that sees every stripe a re-stripe committed meanwhile, all of them in order.
	if _, err := tx.Exec(ctx, `SELECT FROM campaign_budgets WHERE campaign_id = $1 AND stripe = 0 FOR UPDATE`, id); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT stripe, budget_yen, issued_yen FROM campaign_budgets
		WHERE campaign_id = $1 ORDER BY stripe FOR UPDATE`, id)
	if err != nil {
		return err
	}
	stripes, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stripe])
	if err != nil {
		return err
	}
	var live int64
	if err := tx.QueryRow(ctx, `SELECT COALESCE(SUM(amount_yen), 0) FROM issued_coupons
		WHERE campaign_id = $1 AND voided_at IS NULL`, id).Scan(&live); err != nil {
		return err
	}
	var before, budget int64
	for _, s := range stripes {
		before += s.IssuedYen
		budget += s.BudgetYen
	}
	if live > budget {
		rep.Refused = append(rep.Refused, fmt.Sprintf("%s: live coupons %d yen over its %d yen budget", id, live, budget))
		return nil
	}
	left := live
	for _, s := range stripes {
		put := min(left, s.BudgetYen)
		left -= put
		if put == s.IssuedYen {
			continue
		}
		if _, err := tx.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = $3 WHERE campaign_id = $1 AND stripe = $2`,
			id, s.Stripe, put); err != nil {
			return err
		}
	}
	if live != before {
		rep.Campaigns = append(rep.Campaigns, CounterFix{Key: id, BeforeYen: before, AfterYen: live})
	}
	return nil
}
