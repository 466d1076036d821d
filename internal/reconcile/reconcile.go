// Package reconcile counts the tables and reports every broken rule: R1 budget, R2 one coupon
// per member, R3 monthly cap, the counters against the rows they count, and the outbox against
// the coupons. It judges by SQL on the tables, never by what the API answered; the demo, the
// tests, `couponctl reconcile` and the isolation lab all read the same report.
package reconcile

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/shared/db"
)

// Campaign is one campaign's R1 figures, in yen.
type Campaign struct {
	CampaignID string
	BudgetYen  int64 // the campaign budget approval (summed over its budget stripes)
	CounterYen int64 // campaign_budgets.issued_yen, summed over its budget stripes
	ActualYen  int64 // SUM(amount_yen) of its coupons
	Coupons    int64
}

// Report is what the tables say. Every count below except Coupons and Campaigns is a violation
// when it is not zero.
type Report struct {
	Coupons   int64
	Campaigns []Campaign
	// DuplicatePairs is R2: (campaign, member) pairs holding more than one coupon.
	DuplicatePairs int64
	// MembersOverCap is R3: member x month pairs whose coupons sum above the cap.
	MembersOverCap int64
	// UsageDrift is member x month pairs whose used_yen differs from their coupons' sum.
	UsageDrift int64
	// CouponsWithoutOutbox and OutboxWithoutCoupon compare the outbox with the coupons: exactly
	// one outbox row per coupon.
	CouponsWithoutOutbox int64
	OutboxWithoutCoupon  int64
	// CapYen is the R3 cap the report was checked against.
	CapYen int
}

// Check reads the tables through q and returns the report. capYen is R3's cap in yen.
func Check(ctx context.Context, q db.Querier, capYen int) (Report, error) {
	r := Report{CapYen: capYen}
	rows, err := q.Query(ctx, sqlCampaigns)
	if err != nil {
		return r, fmt.Errorf("reconcile: campaigns: %w", err)
	}
	r.Campaigns, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Campaign])
	if err != nil {
		return r, fmt.Errorf("reconcile: campaigns: %w", err)
	}
	err = q.QueryRow(ctx, sqlCounts, capYen).Scan(&r.Coupons, &r.DuplicatePairs, &r.MembersOverCap,
		&r.UsageDrift, &r.CouponsWithoutOutbox, &r.OutboxWithoutCoupon)
	if err != nil {
		return r, fmt.Errorf("reconcile: counts: %w", err)
	}
	return r, nil
}

// sqlCampaigns reads each campaign as one: budget and counter summed over its budget stripes,
// against the sum of its coupons.
const sqlCampaigns = `
SELECT b.campaign_id, b.budget_yen, b.issued_yen,
       COALESCE(SUM(i.amount_yen), 0)::bigint, count(i.coupon_id)
  FROM (SELECT campaign_id, SUM(budget_yen)::bigint AS budget_yen, SUM(issued_yen)::bigint AS issued_yen
          FROM campaign_budgets GROUP BY campaign_id) b
  LEFT JOIN issued_coupons i USING (campaign_id)
 GROUP BY b.campaign_id, b.budget_yen, b.issued_yen
 ORDER BY b.campaign_id`

const sqlCounts = `
SELECT (SELECT count(*) FROM issued_coupons),
       (SELECT count(*) FROM (SELECT 1 FROM issued_coupons
                               GROUP BY campaign_id, member_id HAVING count(*) > 1) d),
       (SELECT count(*) FROM (SELECT 1 FROM issued_coupons
                               GROUP BY member_id, month HAVING SUM(amount_yen) > $1) o),
       (SELECT count(*) FROM (SELECT member_id, month, SUM(amount_yen) AS s
                                FROM issued_coupons GROUP BY 1, 2) c
                        FULL JOIN member_monthly_usage u USING (member_id, month)
         WHERE COALESCE(c.s, 0) <> COALESCE(u.used_yen, 0)),
       (SELECT count(*) FROM issued_coupons i
         WHERE NOT EXISTS (SELECT 1 FROM notification_outbox o WHERE o.coupon_id = i.coupon_id)),
       (SELECT count(*) FROM notification_outbox o
         WHERE NOT EXISTS (SELECT 1 FROM issued_coupons i WHERE i.coupon_id = o.coupon_id))`

// Violations lists each broken rule in words; empty means every rule held.
func (r Report) Violations() []string {
	var v []string
	for _, c := range r.Campaigns {
		if c.ActualYen > c.BudgetYen {
			v = append(v, fmt.Sprintf("R1 %s: issued %d yen over a budget of %d yen", c.CampaignID, c.ActualYen, c.BudgetYen))
		}
		if c.CounterYen != c.ActualYen {
			v = append(v, fmt.Sprintf("R1 %s: counter %d yen but coupons sum to %d yen (lost update)", c.CampaignID, c.CounterYen, c.ActualYen))
		}
	}
	add := func(n int64, format string) {
		if n != 0 {
			v = append(v, fmt.Sprintf(format, n))
		}
	}
	add(r.DuplicatePairs, "R2: %d (campaign, member) pairs hold more than one coupon")
	add(r.MembersOverCap, fmt.Sprintf("R3: %%d member-months over the %d yen cap", r.CapYen))
	add(r.UsageDrift, "R3: %d member-months whose used_yen differs from their coupons")
	add(r.CouponsWithoutOutbox, "outbox: %d coupons without an outbox row")
	add(r.OutboxWithoutCoupon, "outbox: %d outbox rows without a coupon")
	return v
}

// Write prints the report as a small table with a verdict line.
func (r Report) Write(w io.Writer) {
	fmt.Fprintf(w, "%-12s %12s %12s %12s %8s\n", "campaign", "budget_yen", "counter_yen", "actual_yen", "coupons")
	for _, c := range r.Campaigns {
		fmt.Fprintf(w, "%-12s %12d %12d %12d %8d\n", c.CampaignID, c.BudgetYen, c.CounterYen, c.ActualYen, c.Coupons)
	}
	fmt.Fprintf(w, "coupons %d; R2 duplicate pairs %d; R3 member-months over %d yen %d; usage drift %d; "+
		"coupons without outbox %d; outbox without coupon %d\n",
		r.Coupons, r.DuplicatePairs, r.CapYen, r.MembersOverCap, r.UsageDrift, r.CouponsWithoutOutbox, r.OutboxWithoutCoupon)
	if v := r.Violations(); len(v) > 0 {
		fmt.Fprintf(w, "VIOLATIONS (%d):\n  %s\n", len(v), strings.Join(v, "\n  "))
		return
	}
	fmt.Fprintln(w, "all rules held: R1 budget, R2 one per member, R3 monthly cap, counters, outbox")
}
