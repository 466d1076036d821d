package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/lab/answerlog"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/shared/issuance"
)

type pair struct{ campaign, member string }

type memberMonth struct{ member, month string }

// pairCoupon is a coupon of one of the log's pairs that is not a legacy duplicate: its id,
// issued_at (the database's clock when it issued it, issue_now()), and when it was voided (nil
// when live).
type pairCoupon struct {
	id       string
	issuedAt time.Time
	voidedAt *time.Time
	// grantedBy is the login of the `couponctl grant` that issued it ("" for IssueCoupon's).
	grantedBy string
}

// coupon is a row of issued_coupons that an answer named.
type coupon struct {
	campaign, member string
	live             bool       // voided_at IS NULL AND NOT legacy_duplicate
	voidedAt         *time.Time // when an operator voided it, nil when it was not
}

// campaignRow is what the refusal checks read of a campaign: its stripe 0 (every campaign has
// one; the issuance's judge reads it) and whether any stripe has room for one more coupon.
type campaignRow struct {
	createdAt                  time.Time
	discountYen                int
	startsAt, endsAt, pausedAt *time.Time
	couponsExpireAt            *time.Time // the fixed coupon expiry, which ends the campaign
	room                       bool
	history                    *history   // its state over time, from campaign_changes
	lastVoidAt                 *time.Time // the latest void of one of its coupons (yen given back)
	firstRelease               *time.Time // its first scheduled release (campaign_releases), nil without releases
}

// tables is what the audit reads, for the log's coupons, pairs, campaigns and member-months.
type tables struct {
	byID       map[string]coupon     // by coupon id, the coupons the answers name
	byPair     map[pair][]pairCoupon // the coupons of the log's pairs, live and voided
	campaigns  map[string]campaignRow
	usedYen    map[memberMonth]int       // member_monthly_usage.used_yen; absent is 0
	lastVoidAt map[memberMonth]time.Time // the latest void of a coupon of the member-month
	capYen     int                       // R3's cap in force (coupon_rules)
	capSetAt   time.Time                 // when it was last set
	invariants reconcile.Report
}

const sqlCap = `SELECT monthly_cap_yen, changed_at FROM coupon_rules`

const sqlCouponsByID = `
SELECT coupon_id::text, campaign_id, member_id, voided_at IS NULL AND NOT legacy_duplicate,
       CASE WHEN NOT legacy_duplicate THEN voided_at END
  FROM issued_coupons WHERE coupon_id = ANY($1::uuid[])`

const sqlCouponsOfPairs = `
SELECT i.coupon_id::text, i.campaign_id, i.member_id, i.issued_at, i.voided_at, coalesce(i.granted_by, '')
  FROM issued_coupons i
  JOIN unnest($1::text[], $2::text[]) AS p(campaign_id, member_id)
    ON i.campaign_id = p.campaign_id AND i.member_id = p.member_id
 WHERE NOT i.legacy_duplicate`

const sqlCampaigns = `
SELECT z.campaign_id, c.created_at, z.discount_yen, z.starts_at, z.ends_at, z.paused_at, z.coupons_expire_at,
       EXISTS (SELECT 1 FROM campaign_budgets s
                WHERE s.campaign_id = z.campaign_id AND s.issued_yen + s.discount_yen <= s.budget_yen),
       (SELECT max(i.voided_at) FROM issued_coupons i WHERE i.campaign_id = z.campaign_id AND NOT i.legacy_duplicate),
       (SELECT min(r.at) FROM campaign_releases r WHERE r.campaign_id = z.campaign_id)
  FROM campaign_budgets z JOIN campaigns c USING (campaign_id)
 WHERE z.stripe = 0 AND z.campaign_id = ANY($1::text[])`

const sqlChanges = `
SELECT campaign_id, changed_at, what, before, after
  FROM campaign_changes WHERE campaign_id = ANY($1::text[]) ORDER BY change_id`

const sqlUsage = `
SELECT k.member_id, k.month, coalesce(u.used_yen, 0),
       (SELECT max(i.voided_at) FROM issued_coupons i
         WHERE i.member_id = k.member_id AND i.month = k.month AND NOT i.legacy_duplicate)
  FROM unnest($1::text[], $2::text[]) AS k(member_id, month)
  LEFT JOIN member_monthly_usage u USING (member_id, month)`

// readTables reads, through q, what the answers need to be judged.
func readTables(ctx context.Context, q pgx.Tx, answers []answerlog.Answer, cfg Config) (tables, error) {
	t := tables{byID: map[string]coupon{}, byPair: map[pair][]pairCoupon{}, campaigns: map[string]campaignRow{}, usedYen: map[memberMonth]int{},
		lastVoidAt: map[memberMonth]time.Time{}}
	var ids, pairCampaigns, pairMembers, campaignIDs, members, months []string
	seenPair, seenCampaign, seenMonth := map[pair]bool{}, map[string]bool{}, map[memberMonth]bool{}
	for _, a := range answers {
		if _, err := uuid.Parse(a.CouponID); err == nil && claimsCoupon(a) {
			ids = append(ids, a.CouponID)
		}
		if p := pairOf(a); !seenPair[p] {
			seenPair[p] = true
			pairCampaigns, pairMembers = append(pairCampaigns, p.campaign), append(pairMembers, p.member)
		}
		if !seenCampaign[a.CampaignID] {
			seenCampaign[a.CampaignID] = true
			campaignIDs = append(campaignIDs, a.CampaignID)
		}
		if a.Result == string(issuance.ResultMonthlyCap) {
			k := memberMonth{member: a.MemberID, month: issuance.Month(a.T)}
			if !seenMonth[k] {
				seenMonth[k] = true
				members, months = append(members, k.member), append(months, k.month)
			}
		}
	}
	err := scan(ctx, q, "the monthly cap", sqlCap, nil, func(r pgx.Rows) error { return r.Scan(&t.capYen, &t.capSetAt) })
	if err != nil {
		return t, err
	}
	err = scan(ctx, q, "coupons", sqlCouponsByID, []any{ids}, func(r pgx.Rows) error {
		var id string
		var c coupon
		if err := r.Scan(&id, &c.campaign, &c.member, &c.live, &c.voidedAt); err != nil {
			return err
		}
		t.byID[id] = c
		return nil
	})
	if err == nil {
		err = scan(ctx, q, "coupons of the pairs", sqlCouponsOfPairs, []any{pairCampaigns, pairMembers}, func(r pgx.Rows) error {
			var c pairCoupon
			var p pair
			if err := r.Scan(&c.id, &p.campaign, &p.member, &c.issuedAt, &c.voidedAt, &c.grantedBy); err != nil {
				return err
			}
			t.byPair[p] = append(t.byPair[p], c)
			return nil
		})
	}
	if err == nil {
		err = scan(ctx, q, "campaigns", sqlCampaigns, []any{campaignIDs}, func(r pgx.Rows) error {
			var id string
			var c campaignRow
			if err := r.Scan(&id, &c.createdAt, &c.discountYen, &c.startsAt, &c.endsAt, &c.pausedAt, &c.couponsExpireAt, &c.room, &c.lastVoidAt, &c.firstRelease); err != nil {
				return err
			}
			t.campaigns[id] = c
			return nil
		})
	}
	changes := map[string][]change{}
	if err == nil {
		err = scan(ctx, q, "campaign changes", sqlChanges, []any{campaignIDs}, func(r pgx.Rows) error {
			var id string
			var c change
			if err := r.Scan(&id, &c.at, &c.what, &c.before, &c.after); err != nil {
				return err
			}
			changes[id] = append(changes[id], c)
			return nil
		})
	}
	for id, c := range t.campaigns {
		if err != nil {
			break
		}
		if c.history, err = newHistory(stateSpan{startsAt: c.startsAt, endsAt: c.endsAt, pausedAt: c.pausedAt, expireAt: c.couponsExpireAt}, changes[id]); err == nil {
			t.campaigns[id] = c
		}
	}
	if err == nil {
		err = scan(ctx, q, "usage", sqlUsage, []any{members, months}, func(r pgx.Rows) error {
			var k memberMonth
			var used int
			var voided *time.Time
			if err := r.Scan(&k.member, &k.month, &used, &voided); err != nil {
				return err
			}
			t.usedYen[k] = used
			if voided != nil {
				t.lastVoidAt[k] = *voided
			}
			return nil
		})
	}
	if err != nil {
		return t, err
	}
	t.invariants, err = reconcile.Check(ctx, q)
	return t, err
}

// scan runs query with args through q and calls each for every row; errors name what.
func scan(ctx context.Context, q pgx.Tx, what, query string, args []any, each func(pgx.Rows) error) error {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("audit: %s: %w", what, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return fmt.Errorf("audit: %s: %w", what, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("audit: %s: %w", what, err)
	}
	return nil
}
