package console

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// usageCampaign is the campaign of [usageShown] with its coupons; emptyCampaign has none.
const (
	usageCampaign = "USE"
	emptyCampaign = "NONE"
)

// usageShown is the check of 利用数, 利用率 and the funnel. Of eight coupons IssueCoupon issues
// for USE, the till (coupon_redeem and coupon_redemption_rollback, called as the owner) redeems
// five; it rolls two of them back, and one more is rolled back and redeemed again by another
// order; one is a legacy coupon, redeemed before the migration with no order; one is voided.
// Three pushes are sent and one outbox row is pruned. The list and the campaign page show 利用数
// and 利用率, and the funnel 配布 → 送信 → 利用, as SQL counts them on the tables (after the page
// is read); NONE, with nothing issued, shows 0 and "—", never NaN. breakIt makes the console a
// broken variant.
func usageShown(t *testing.T, v *verdict, breakIt func(*env)) {
	e := setup(t, verifiedIAP)
	breakIt(e)
	for _, id := range []string{usageCampaign, emptyCampaign} {
		e.createCampaign(t, campaign.Campaign{ID: id, DiscountYen: 1000, BudgetYen: 1_000_000})
	}
	e.seedUsage(t)
	if u := e.usageBySQL(t, usageCampaign); u != (usageCounts{live: 7, pushed: 4, redeemed: 4, rate: "57.1 %", pushedRate: "57.1 %"}) {
		t.Fatalf("SQL counts %+v of USE, want 7 live, 4 pushed, 4 redeemed (57.1 %%): the scenario was not made", u)
	}

	b := newBrowser(t)
	ctx := b.as(t, e.idp.assertion(t, viewerEmail))
	e.open(t, ctx, "/")
	rows := get(t, ctx, chromedp.Evaluate[[][3]string](`Array.from(document.querySelectorAll("tr[data-campaign]")).map(r =>
  [r.dataset.campaign, r.querySelector("[data-redeemed]").textContent, r.querySelector("[data-live]").textContent])`))
	listed := map[string][2]string{}
	for _, r := range rows {
		listed[r[0]] = [2]string{r[1], r[2]}
	}
	for _, id := range []string{usageCampaign, emptyCampaign} {
		want := e.usageBySQL(t, id)
		if got := listed[id]; got != [2]string{fmt.Sprint(want.redeemed), want.rate} {
			v.Errorf("the list shows %s's 利用数 and 利用率 as %q, SQL counts %d redeemed of %d live: %s",
				id, got, want.redeemed, want.live, want.rate)
		}
	}

	for _, id := range []string{usageCampaign, emptyCampaign} {
		e.open(t, ctx, "/campaigns/"+id)
		want := e.usageBySQL(t, id)
		shown := get(t, ctx, chromedp.Evaluate[[2]string](`[document.querySelector("dd[data-redeemed]").textContent, document.querySelector("dd.rate").textContent]`))
		if wantShown := [2]string{fmt.Sprintf("%d 枚", want.redeemed), want.rate}; shown != wantShown {
			v.Errorf("campaign %s's page shows 利用数 and 利用率 as %q, SQL counts %q", id, shown, wantShown)
		}
		funnel := get(t, ctx, chromedp.Evaluate[[][4]string](`Array.from(document.querySelectorAll(".funnel tr[data-stage]")).map(r =>
  [r.dataset.stage, r.querySelector("th").textContent, r.querySelectorAll("td")[0].textContent, r.querySelectorAll("td")[1].textContent])`))
		whole := "—"
		if want.live > 0 {
			whole = "100.0 %"
		}
		wantFunnel := [][4]string{{"issued", "配布", fmt.Sprint(want.live), whole},
			{"pushed", "送信（LINE 通知を送信済み）", fmt.Sprint(want.pushed), want.pushedRate},
			{"redeemed", "利用", fmt.Sprint(want.redeemed), want.rate}}
		if !slices.Equal(funnel, wantFunnel) {
			v.Errorf("campaign %s's funnel shows %q, SQL counts %q", id, funnel, wantFunnel)
		}
		if text := pageText(t, ctx); strings.Contains(text, "NaN") || strings.Contains(text, "Inf") {
			v.Errorf("campaign %s's page shows a figure that is not one:\n%s", id, text)
		}
		if id == usageCampaign {
			t.Logf("the funnel of %s as the page shows it:\n%s", id,
				get(t, ctx, chromedp.Evaluate[string](`document.querySelector(".funnel table").innerText`)))
		}
	}
}

// seedUsage issues USE's coupons for m0 to m7 by IssueCoupon and makes what usageShown says of
// them with SQL as the owner: the redemptions, the rollbacks, the legacy redemption, the void,
// the pushes sent and the row pruned. It returns the coupon ids by member.
func (e *env) seedUsage(t *testing.T) map[string]string {
	t.Helper()
	ids := map[string]string{}
	for i := range 8 {
		m := fmt.Sprintf("m%d", i)
		r, id := e.issueCoupon(t, m, usageCampaign)
		if r != "ISSUED" {
			t.Fatalf("IssueCoupon for %s: %s", m, r)
		}
		ids[m] = id
	}
	ctx := context.Background()
	exec := func(want, sql string, args ...any) {
		t.Helper()
		var got string
		if err := e.owner.QueryRow(ctx, sql, args...).Scan(&got); err != nil || got != want {
			t.Fatalf("%s %v: %q %v, want %s", sql, args, got, err, want)
		}
	}
	redeem := func(m, order string) {
		exec("REDEEMED", `SELECT result FROM coupon_redeem($1, $2, $3)`, ids[m], m, order)
	}
	rollback := func(m, order, reason string) {
		exec("ROLLED_BACK", `SELECT result FROM coupon_redemption_rollback($1, $2, $3, $4)`, ids[m], m, order, reason)
	}
	redeem("m0", "ORDER-0")
	redeem("m1", "ORDER-1")
	redeem("m2", "ORDER-2A")
	rollback("m2", "ORDER-2A", "返品")
	redeem("m2", "ORDER-2B")
	redeem("m3", "ORDER-3")
	rollback("m3", "ORDER-3", "注文キャンセル")
	redeem("m4", "ORDER-4")
	rollback("m4", "ORDER-4", "二重計上の取消")
	// m5 is a legacy coupon: redeemed before the migration, which wrote its row with no order.
	exec("1", `WITH c AS (UPDATE issued_coupons SET redeemed_at = now() WHERE coupon_id = $1 RETURNING coupon_id, redeemed_at)
INSERT INTO coupon_redemptions (coupon_id, action, order_id, at) SELECT coupon_id, 'redeem', NULL, redeemed_at FROM c RETURNING 1`, ids["m5"])
	exec("VOIDED", `SELECT result FROM coupon_void($1, '誤配布', false)`, ids["m6"])
	exec("3", `WITH s AS (UPDATE notification_outbox SET sent_at = now() WHERE coupon_id = ANY ($1::uuid[]) RETURNING 1) SELECT count(*)::text FROM s`,
		[]string{ids["m0"], ids["m1"], ids["m7"]})
	// m3's push was sent, and its row deleted by couponctl outbox prune, which kept the outcome.
	exec("1", `WITH d AS (DELETE FROM notification_outbox WHERE coupon_id = $1 RETURNING coupon_id),
 p AS (UPDATE issued_coupons c SET outbox_pruned_at = now(), outbox_outcome = 'sent' FROM d WHERE c.coupon_id = d.coupon_id RETURNING 1)
SELECT count(*)::text FROM p`, ids["m3"])
	return ids
}

// usageCounts is a campaign's usage as SQL counts it on the tables.
type usageCounts struct {
	live, pushed, redeemed int
	// rate and pushedRate are 利用率 and 送信's share of 配布 as the page should write them,
	// rounded by PostgreSQL: "57.1 %", or "—" when nothing is live.
	rate, pushedRate string
}

// usageBySQL counts campaign id's live coupons, those pushed (a sent outbox row, or one pruned)
// and those redeemed now, and rounds the shares in PostgreSQL.
func (e *env) usageBySQL(t *testing.T, id string) usageCounts {
	t.Helper()
	var u usageCounts
	err := e.owner.QueryRow(context.Background(), `
WITH n AS (
  SELECT count(*) AS live, count(*) FILTER (WHERE pushed) AS pushed, count(*) FILTER (WHERE c.redeemed_at IS NOT NULL) AS redeemed
    FROM issued_coupons c,
         LATERAL (SELECT EXISTS (SELECT FROM notification_outbox o WHERE o.coupon_id = c.coupon_id AND o.sent_at IS NOT NULL)
                      OR c.outbox_outcome = 'sent') AS x(pushed)
   WHERE c.campaign_id = $1 AND c.voided_at IS NULL)
SELECT live, pushed, redeemed,
       coalesce(round(100.0 * redeemed / nullif(live, 0), 1)::text || ' %', '—'),
       coalesce(round(100.0 * pushed / nullif(live, 0), 1)::text || ' %', '—')
  FROM n`, id).Scan(&u.live, &u.pushed, &u.redeemed, &u.rate, &u.pushedRate)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestUsageIsCountedAsTheTablesSay: the list's and the campaign page's 利用数, 利用率 and funnel
// are the tables' counts (usageShown). Also run on a console that counts a coupon whose
// redemption was rolled back as used (any redeem row in coupon_redemptions): the check finds it.
func TestUsageIsCountedAsTheTablesSay(t *testing.T) {
	checkAndBreak(t, func(t *testing.T, v *verdict) { usageShown(t, v, func(*env) {}) },
		brokenVariant{"rolled-back coupons counted as used", func(t *testing.T, v *verdict) {
			usageShown(t, v, func(e *env) {
				e.srv.reads.redeemed = `EXISTS (SELECT FROM coupon_redemptions r WHERE r.coupon_id = c.coupon_id AND r.action = 'redeem')`
			})
		}})
}

// TestCouponPageShowsItsRedemptions: a coupon's page lists its redemption history, oldest first,
// as coupon_redemptions holds it: each row's time (+09:00), 利用 or 取消, the order, a rollback's
// reason and the database login; a legacy coupon's row, its order unknown, reads
// 移行前の利用（注文番号不明）; a coupon never redeemed says 利用はありません.
func TestCouponPageShowsItsRedemptions(t *testing.T) {
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: usageCampaign, DiscountYen: 1000, BudgetYen: 1_000_000})
	ids := e.seedUsage(t)

	b := newBrowser(t)
	ctx := b.as(t, e.idp.assertion(t, operatorEmail))
	for _, m := range []string{"m2", "m5", "m7"} {
		e.open(t, ctx, "/coupons/"+ids[m])
		shown := get(t, ctx, chromedp.Evaluate[[][]string](`Array.from(document.querySelectorAll(".redemptions tbody tr")).map(r =>
  Array.from(r.querySelectorAll("td")).map(td => td.textContent))`))
		want := e.redemptionsBySQL(t, ids[m])
		if len(want) == 0 {
			want = [][]string{{"利用はありません。"}}
		}
		if !slices.EqualFunc(shown, want, slices.Equal) {
			t.Errorf("coupon %s (%s): the page's redemption history is\n%q\nwant, as coupon_redemptions holds it,\n%q", ids[m], m, shown, want)
		}
	}
	e.open(t, ctx, "/members/m2")
	if n := get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll(".redemptions").length`)); n != 0 {
		t.Errorf("a member's page shows %d redemption histories, want none (the coupon's page shows it)", n)
	}
}

// redemptionsBySQL is coupon id's redemption history, oldest first, as the page should write
// each row: time at +09:00, 利用 or 取消, the order (or the legacy words), the reason, the login.
func (e *env) redemptionsBySQL(t *testing.T, id string) [][]string {
	t.Helper()
	rows, err := e.owner.Query(context.Background(), `
SELECT at, CASE action WHEN 'redeem' THEN '利用' WHEN 'rollback' THEN '取消' END,
       coalesce(order_id, '移行前の利用（注文番号不明）'), coalesce(reason, ''), by_login
  FROM coupon_redemptions WHERE coupon_id = $1 ORDER BY redemption_id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out [][]string
	for rows.Next() {
		var at time.Time
		r := make([]string, 5)
		if err := rows.Scan(&at, &r[1], &r[2], &r[3], &r[4]); err != nil {
			t.Fatal(err)
		}
		r[0] = tokyoTime(at)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPercentRoundsHalfUp: 利用率's writing rounds half up to one decimal, as PostgreSQL's
// round(numeric, 1) does, and writes "—" when nothing was issued.
func TestPercentRoundsHalfUp(t *testing.T) {
	for _, tc := range []struct {
		part, whole int
		want        string
	}{
		{0, 0, "—"}, {0, 7, "0.0 %"}, {4, 7, "57.1 %"}, {1, 16, "6.3 %"}, {1, 3, "33.3 %"}, {2, 3, "66.7 %"},
		{7, 7, "100.0 %"}, {999_999, 1_000_000, "100.0 %"}, {1, 2_000_000, "0.0 %"}, {3, 2_000, "0.2 %"},
	} {
		if got := percent(tc.part, tc.whole); got != tc.want {
			t.Errorf("percent(%d, %d) = %q, want %q", tc.part, tc.whole, got, tc.want)
		}
	}
}
