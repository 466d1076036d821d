// Package reconcile counts the tables and reports every broken rule: R1 budget, R2 one coupon
// per member, R3 monthly cap, the counters against the rows they count, and the outbox against
// the coupons. It judges by SQL on the tables, never by what the API answered; the demo, the
// tests, `couponctl reconcile` (daily in production) and the isolation lab read the same report.
//
// Redemptions are checked against their append-only history (coupon_redemptions).
//
// It tells faults from facts. A fault (drift, a rule broken by a write of this code) is a
// [Report.Violations] line and makes `couponctl reconcile` exit 1. A fact is what the Before
// code left and the migration recorded (docs/migration.md): a campaign already over budget
// (legacy_overshoot), member-months already over the cap, redeemed duplicates kept live; those
// are [Report.Facts] lines, reported for finance and promotion, and exit 0.
//
// A coupon is live unless voided_at is set (voided by an operator, `couponctl coupon void`, or an
// unredeemed legacy duplicate the migration voided); R1 and R3 count live coupons, R2 the coupons
// that hold their (campaign, member) pair: not legacy duplicates, and not voided with reissue
// allowed. A coupon whose delivered outbox row `couponctl outbox prune` deleted is marked so
// (outbox_pruned since 00039, outbox_pruned_at before): it has no outbox row, and that is no
// fault.
package reconcile

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/shared/db"
)

// Campaign is one campaign's R1 figures, in yen, summed over its budget stripes.
type Campaign struct {
	CampaignID string `json:"campaign_id"`
	BudgetYen  int64  `json:"budget_yen"`  // the campaign budget approval
	CounterYen int64  `json:"counter_yen"` // campaign_budgets.issued_yen
	ActualYen  int64  `json:"actual_yen"`  // SUM(amount_yen) of its live coupons
	Coupons    int64  `json:"coupons"`     // its live coupons
	// LegacyOvershootYen is the yen over budget that the migration found and recorded
	// (legacy_overshoot), 0 when the campaign was within budget then.
	LegacyOvershootYen int64 `json:"legacy_overshoot_yen"`
}

// DriftYen is the counter minus the live coupons' sum: zero when the counter is right.
func (c Campaign) DriftYen() int64 { return c.CounterYen - c.ActualYen }

// OverBudgetYen is how far the live coupons exceed the budget, 0 within budget.
func (c Campaign) OverBudgetYen() int64 { return max(c.ActualYen-c.BudgetYen, 0) }

// overshootIsLegacy reports whether the campaign's overshoot is the one the migration recorded,
// not grown since.
func (c Campaign) overshootIsLegacy() bool {
	return c.LegacyOvershootYen > 0 && c.OverBudgetYen() <= c.LegacyOvershootYen
}

// Report is what the tables say. Counts are rows or pairs, amounts yen.
type Report struct {
	Coupons   int64      `json:"coupons"` // live coupons
	Campaigns []Campaign `json:"campaigns"`
	// DuplicatePairs is R2: (campaign, member) pairs holding more than one coupon that is not a
	// legacy duplicate.
	DuplicatePairs int64 `json:"duplicate_pairs"`
	// MembersOverCap is R3: member x month pairs holding a coupon of this code (legacy
	// member-months are in LegacyMembersOverCap) of which a live coupon took the month's live
	// coupons, up to and including it in issue order, above the cap in force when it was issued
	// ([sqlJudged]): a cap lowered in mid-month leaves the coupons issued before it alone.
	MembersOverCap int64 `json:"members_over_cap"`
	// UsageDrift is member x month pairs whose used_yen differs from their live coupons' sum.
	UsageDrift int64 `json:"usage_drift"`
	// CouponsWithoutOutbox and OutboxWithoutCoupon compare the outbox with the coupons: exactly
	// one outbox row per coupon, unless the prune deleted it after delivery.
	CouponsWithoutOutbox int64 `json:"coupons_without_outbox"`
	OutboxWithoutCoupon  int64 `json:"outbox_without_coupon"`
	// LegacyMembersOverCap is member x month pairs over the cap with legacy coupons only: a fact
	// of the Before code.
	LegacyMembersOverCap int64 `json:"legacy_members_over_cap"`
	// RedemptionDrift is coupons whose redemption disagrees with its history
	// ([sqlRedemptionDrift]): redeemed without a redeem as its last history row, or the reverse,
	// or a history out of order (a redeem after a redeem, a rollback not after its order's redeem).
	RedemptionDrift int64 `json:"redemption_drift"`
	// LegacyDuplicatesLive is redeemed legacy duplicates kept live (tied to orders): a fact.
	LegacyDuplicatesLive int64 `json:"legacy_duplicates_live"`
	// CapYen is R3's cap in force when the report was made (coupon_rules; `couponctl rules
	// show` has its history).
	CapYen int `json:"cap_yen"`
	// MonthsNamed are the first [NamedMonths] member-months over the cap or drifted, by member
	// and month: the rows behind MembersOverCap and UsageDrift.
	MonthsNamed []MemberMonth `json:"member_months"`
}

// NamedMonths is how many member-months a [Report] names; the counts cover every one.
const NamedMonths = 20

// monthsNamed is [NamedMonths] as [Check] asks for them: a variable, so that a test can swap in
// its broken variant, a report that names none (names_internal_test.go).
var monthsNamed = NamedMonths

// MemberMonth is one member x month R3 found wrong: its counter and its live coupons' sum.
type MemberMonth struct {
	MemberID string `json:"member_id"`
	Month    string `json:"month"`
	UsedYen  int64  `json:"used_yen"` // the member_monthly_usage counter (0 when the row is missing)
	LiveYen  int64  `json:"live_yen"` // the sum of the member's live coupons of the month
}

func (m MemberMonth) String() string {
	return fmt.Sprintf("%s %s (counter %d yen, live coupons %d yen)", m.MemberID, m.Month, m.UsedYen, m.LiveYen)
}

// scopeFull heads every check of a full pass: each check reads its rows through these names,
// every row here; an incremental pass ([Run]) names the rows that changed instead
// (scopeIncremental). live is R3's coupons, pair_coupons R2's, usage the member x month counters,
// outbox_coupons the coupons owed an outbox row, outbox the outbox rows, redemptions the
// redemption history and redeemed the coupons whose redemption has no history. NOT MATERIALIZED
// keeps each a plain read of its table.
const scopeFull = `
WITH live AS (SELECT * FROM issued_coupons WHERE voided_at IS NULL),
pair_coupons AS NOT MATERIALIZED (SELECT * FROM issued_coupons),
usage AS NOT MATERIALIZED (SELECT * FROM member_monthly_usage),
outbox_coupons AS NOT MATERIALIZED (SELECT * FROM issued_coupons),
outbox AS NOT MATERIALIZED (SELECT * FROM notification_outbox),
redemptions AS NOT MATERIALIZED (SELECT * FROM coupon_redemptions),
redeemed AS NOT MATERIALIZED (SELECT * FROM issued_coupons)`

// sqlJudged follows a scope in the statements that judge R3: over live, the live coupons; judged, each one with
// over set when the live coupons of its member and month, up to and including it in issue order,
// sum above the cap in force at its issued_at. The caps' spans come from their history
// (coupon_rules_changes, migration 00021), whose first row holds the cap before any change, the
// legacy coupons' too. coupon_rules_set divides the coupons exactly at its changed_at: every
// coupon issued under a cap has its issued_at inside that cap's span.
const sqlJudged = `,
caps AS (SELECT (after->>'monthly_cap_yen')::bigint AS cap,
                CASE WHEN row_number() OVER w = 1 THEN '-infinity' ELSE changed_at END AS since,
                COALESCE(lead(changed_at) OVER w, 'infinity') AS until
           FROM coupon_rules_changes WHERE after ? 'monthly_cap_yen' WINDOW w AS (ORDER BY change_id)),
judged AS (SELECT l.member_id, l.month, l.client_month,
                  SUM(l.amount_yen) OVER (PARTITION BY l.member_id, l.month ORDER BY l.issued_at, l.coupon_id) > c.cap AS over
             FROM live l JOIN caps c ON l.issued_at >= c.since AND l.issued_at < c.until)`

// sqlMonthsNamed lists the member-months over the cap (legacy-only ones aside) or whose counter
// differs from their live coupons, at most @limit.
const sqlMonthsNamed = sqlJudged + `,
months AS (SELECT member_id, month, bool_or(over) AS over, bool_and(client_month IS NOT NULL) AS legacy_only
             FROM judged GROUP BY 1, 2),
sums AS (SELECT member_id, month, SUM(amount_yen)::bigint AS s FROM live GROUP BY 1, 2)
SELECT member_id, month, COALESCE(u.used_yen, 0)::bigint, COALESCE(c.s, 0)
  FROM sums c LEFT JOIN months m USING (member_id, month) FULL JOIN usage u USING (member_id, month)
 WHERE COALESCE(c.s, 0) <> COALESCE(u.used_yen, 0) OR (m.over AND NOT m.legacy_only)
 ORDER BY member_id, month
 LIMIT @limit`

// sqlCapNow is R3's cap in force.
const sqlCapNow = `SELECT monthly_cap_yen FROM coupon_rules`

// Check reads the tables through q and returns the report: a full pass, recording nothing
// ([Run] records clean runs and continues from them). R3 is judged against the cap the database
// holds (coupon_rules and its history), never a client's setting.
func Check(ctx context.Context, q db.Querier) (Report, error) {
	r, err := checkScope(ctx, q, scopeFull, pgx.NamedArgs{})
	if err != nil {
		return r, err
	}
	rows, err := q.Query(ctx, sqlCampaigns)
	if err != nil {
		return r, fmt.Errorf("reconcile: campaigns: %w", err)
	}
	r.Campaigns, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Campaign])
	if err != nil {
		return r, fmt.Errorf("reconcile: campaigns: %w", err)
	}
	return r, nil
}

// checkScope runs every check but the campaigns' over the rows scope names (scopeFull, or
// scopeIncremental with args' since), through q.
func checkScope(ctx context.Context, q db.Querier, scope string, args pgx.NamedArgs) (Report, error) {
	var r Report
	if err := q.QueryRow(ctx, sqlCapNow).Scan(&r.CapYen); err != nil {
		return r, fmt.Errorf("reconcile: the monthly cap: %w", err)
	}
	err := q.QueryRow(ctx, scope+sqlCounts, args).Scan(&r.Coupons, &r.DuplicatePairs,
		&r.MembersOverCap, &r.LegacyMembersOverCap, &r.UsageDrift, &r.CouponsWithoutOutbox,
		&r.OutboxWithoutCoupon, &r.LegacyDuplicatesLive)
	if err != nil {
		return r, fmt.Errorf("reconcile: counts: %w", err)
	}
	if err := q.QueryRow(ctx, scope+sqlRedemptionDrift, args).Scan(&r.RedemptionDrift); err != nil {
		return r, fmt.Errorf("reconcile: redemptions: %w", err)
	}
	if r.MembersOverCap+r.UsageDrift == 0 {
		return r, nil
	}
	named := pgx.NamedArgs{"limit": monthsNamed}
	for k, v := range args {
		named[k] = v
	}
	rows, err := q.Query(ctx, scope+sqlMonthsNamed, named)
	if err == nil {
		r.MonthsNamed, err = pgx.CollectRows(rows, pgx.RowToStructByPos[MemberMonth])
	}
	if err != nil {
		return r, fmt.Errorf("reconcile: member-months: %w", err)
	}
	return r, nil
}

// sqlCampaigns reads each campaign as one: budget and counter summed over its budget stripes,
// against the sum of its live coupons, with the overshoot the migration recorded.
const sqlCampaigns = `
SELECT b.campaign_id, b.budget_yen, b.issued_yen,
       COALESCE(SUM(i.amount_yen), 0)::bigint, count(i.coupon_id),
       COALESCE(GREATEST(o.issued_yen - o.budget_yen, 0), 0)::bigint
  FROM (SELECT campaign_id, SUM(budget_yen)::bigint AS budget_yen, SUM(issued_yen)::bigint AS issued_yen
          FROM campaign_budgets GROUP BY campaign_id) b
  LEFT JOIN issued_coupons i ON i.campaign_id = b.campaign_id AND i.voided_at IS NULL
  LEFT JOIN legacy_overshoot o ON o.campaign_id = b.campaign_id
 GROUP BY b.campaign_id, b.budget_yen, b.issued_yen, o.issued_yen, o.budget_yen
 ORDER BY b.campaign_id`

// sqlCounts counts the rest in one statement (one snapshot). A legacy coupon is one the Before
// code wrote: the migration kept its client's month in client_month, which this code never sets.
// R3 judges each coupon against the cap in force when it was issued ([sqlJudged]).
const sqlCounts = sqlJudged + `,
over_cap AS (
  SELECT bool_and(client_month IS NOT NULL) AS legacy_only
    FROM judged GROUP BY member_id, month HAVING bool_or(over))
SELECT (SELECT count(*) FROM live),
       (SELECT count(*) FROM (SELECT 1 FROM pair_coupons WHERE NOT legacy_duplicate AND NOT reissue_allowed
                               GROUP BY campaign_id, member_id HAVING count(*) > 1) d),
       (SELECT count(*) FROM over_cap WHERE NOT legacy_only),
       (SELECT count(*) FROM over_cap WHERE legacy_only),
       (SELECT count(*) FROM (SELECT member_id, month, SUM(amount_yen) AS s FROM live GROUP BY 1, 2) c
                        FULL JOIN usage u USING (member_id, month)
         WHERE COALESCE(c.s, 0) <> COALESCE(u.used_yen, 0)),
       (SELECT count(*) FROM outbox_coupons i
         WHERE i.outbox_pruned_at IS NULL
           AND NOT EXISTS (SELECT 1 FROM notification_outbox o WHERE o.coupon_id = i.coupon_id)
           AND NOT EXISTS (SELECT 1 FROM outbox_pruned p WHERE p.issued_at = i.issued_at AND p.coupon_id = i.coupon_id)),
       (SELECT count(*) FROM outbox o
         WHERE NOT EXISTS (SELECT 1 FROM issued_coupons i WHERE i.coupon_id = o.coupon_id)),
       (SELECT count(*) FROM live WHERE legacy_duplicate)`

// sqlRedemptionDrift counts the coupons whose redemption state (issued_coupons.redeemed_at) is
// not what their history (coupon_redemptions, 00032) says: each redeem follows a rollback or
// nothing, each rollback follows its own order's redeem, and a coupon is redeemed exactly when
// its last row is a redeem (a legacy coupon redeemed before the migration has its row, its order
// unknown). One scan of the history, and of the redeemed coupons alone.
const sqlRedemptionDrift = `,
h AS (
  SELECT coupon_id, action, order_id, lag(action) OVER w AS prev_action, lag(order_id) OVER w AS prev_order,
         row_number() OVER (PARTITION BY coupon_id ORDER BY redemption_id DESC) = 1 AS last
    FROM redemptions WINDOW w AS (PARTITION BY coupon_id ORDER BY redemption_id))
SELECT count(DISTINCT coupon_id) FROM (
  SELECT h.coupon_id FROM h
   WHERE (h.action = 'redeem' AND h.prev_action = 'redeem')
      OR (h.action = 'rollback' AND (h.prev_action IS DISTINCT FROM 'redeem' OR h.prev_order IS DISTINCT FROM h.order_id))
  UNION ALL
  SELECT h.coupon_id FROM h LEFT JOIN issued_coupons c ON c.coupon_id = h.coupon_id
   WHERE h.last AND (c.redeemed_at IS NOT NULL) <> (h.action = 'redeem')
  UNION ALL
  SELECT c.coupon_id FROM redeemed c
   WHERE c.redeemed_at IS NOT NULL AND NOT EXISTS (SELECT FROM coupon_redemptions r WHERE r.coupon_id = c.coupon_id)
) drifted`

// Violations lists each fault in words; empty means every rule held and no counter drifted.
func (r Report) Violations() []string {
	var v []string
	for _, c := range r.Campaigns {
		if c.OverBudgetYen() > 0 && !c.overshootIsLegacy() {
			v = append(v, fmt.Sprintf("R1 %s: issued %d yen over a budget of %d yen", c.CampaignID, c.ActualYen, c.BudgetYen))
		}
		if d := c.DriftYen(); d != 0 {
			v = append(v, fmt.Sprintf("R1 %s: counter %d yen but live coupons sum to %d yen (drift %+d yen)",
				c.CampaignID, c.CounterYen, c.ActualYen, d))
		}
	}
	add := func(n int64, format string) {
		if n != 0 {
			v = append(v, fmt.Sprintf(format, n))
		}
	}
	add(r.DuplicatePairs, "R2: %d (campaign, member) pairs hold more than one coupon")
	add(r.MembersOverCap, "R3: %d member-months over the cap in force when their coupons were issued (couponctl rules show)")
	add(r.UsageDrift, "R3: %d member-months whose used_yen differs from their live coupons")
	add(r.CouponsWithoutOutbox, "outbox: %d coupons without an outbox row")
	add(r.OutboxWithoutCoupon, "outbox: %d outbox rows without a coupon")
	add(r.RedemptionDrift, "redemption: %d coupons whose redemption disagrees with their history (couponctl coupon show)")
	return v
}

// Facts lists what the Before code left and the migration recorded: reported, not faults.
func (r Report) Facts() []string {
	var f []string
	for _, c := range r.Campaigns {
		if c.OverBudgetYen() > 0 && c.overshootIsLegacy() {
			f = append(f, fmt.Sprintf("legacy %s: %d yen over its %d yen budget since the Before code (no new coupon adds to it)",
				c.CampaignID, c.OverBudgetYen(), c.BudgetYen))
		}
	}
	if r.LegacyMembersOverCap > 0 {
		f = append(f, fmt.Sprintf("legacy: %d member-months over the cap since the Before code", r.LegacyMembersOverCap))
	}
	if r.LegacyDuplicatesLive > 0 {
		f = append(f, fmt.Sprintf("legacy: %d redeemed duplicate coupons kept live (tied to orders)", r.LegacyDuplicatesLive))
	}
	return f
}

// Write prints the report as a small table with the facts and a verdict line.
func (r Report) Write(w io.Writer) {
	fmt.Fprintf(w, "%-12s %12s %12s %12s %8s\n", "campaign", "budget_yen", "counter_yen", "actual_yen", "coupons")
	for _, c := range r.Campaigns {
		fmt.Fprintf(w, "%-12s %12d %12d %12d %8d\n", c.CampaignID, c.BudgetYen, c.CounterYen, c.ActualYen, c.Coupons)
	}
	fmt.Fprintf(w, "coupons %d; R2 duplicate pairs %d; R3 member-months over the cap (%d yen now) %d; usage drift %d; "+
		"coupons without outbox %d; outbox without coupon %d; redemption drift %d\n",
		r.Coupons, r.DuplicatePairs, r.CapYen, r.MembersOverCap, r.UsageDrift, r.CouponsWithoutOutbox, r.OutboxWithoutCoupon,
		r.RedemptionDrift)
	if f := r.Facts(); len(f) > 0 {
		fmt.Fprintf(w, "legacy facts (reported, not faults):\n  %s\n", strings.Join(f, "\n  "))
	}
	if v := r.Violations(); len(v) > 0 {
		fmt.Fprintf(w, "VIOLATIONS (%d):\n  %s\n", len(v), strings.Join(v, "\n  "))
		if len(r.MonthsNamed) > 0 {
			fmt.Fprintf(w, "R3 member-months (at most %d; couponctl coupon show --member M lists a member's coupons):\n", NamedMonths)
			for _, m := range r.MonthsNamed {
				fmt.Fprintln(w, "  "+m.String())
			}
		}
		return
	}
	fmt.Fprintln(w, "all rules held: R1 budget, R2 one per member, R3 monthly cap, counters, outbox")
}
