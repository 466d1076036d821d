package console

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/shared/outbox/outboxdb"
)

// previousPrune is the prune of the release before 00035, kept here as the broken variant: it
// deletes the row and marks the coupon pruned, and forgets what the push came to.
const previousPrune = `
WITH old AS MATERIALIZED (
  SELECT coupon_id FROM notification_outbox
   WHERE (sent_at IS NOT NULL OR skipped_at IS NOT NULL) AND COALESCE(sent_at, skipped_at) < now() - interval '1 day'
   FOR UPDATE SKIP LOCKED
), deleted AS (
  DELETE FROM notification_outbox o USING old WHERE o.coupon_id = old.coupon_id RETURNING o.coupon_id
)
UPDATE issued_coupons i SET outbox_pruned_at = now() FROM deleted d WHERE i.coupon_id = d.coupon_id`

// prunedTruth is the check of the push state after a prune: coupons whose push was sent, skipped
// for want of a LINE account, and skipped because voided, their rows pruned two days later, read
// 送信済み, 送信対象外 with that reason, and 送信対象外 (voided) on their pages; the funnel counts
// the sent one alone; none pushed is read as sent; a void of the sent one then says its push was
// pruned (not "no outbox row", a legacy coupon's).
func prunedTruth(t *testing.T, v *verdict, prune func(context.Context, *env) error) {
	ctx := context.Background()
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: "PRUNE", DiscountYen: 1000, BudgetYen: 100_000})
	ids := map[string]string{}
	for _, m := range []string{"m-sent", "m-noline", "m-void"} {
		r, id := e.issueCoupon(t, m, "PRUNE")
		if r != "ISSUED" {
			t.Fatalf("IssueCoupon %s: %s", m, r)
		}
		ids[m] = id
	}
	// What the relay would have done, two days ago: sent one, skipped one (no LINE account); the
	// third was voided (coupon_void closes its row, skipped: voided).
	for _, sql := range []string{
		`UPDATE notification_outbox SET sent_at = now() - interval '2 days' WHERE coupon_id = '` + ids["m-sent"] + `'`,
		`UPDATE notification_outbox SET skipped_at = now() - interval '2 days', skip_reason = 'no_line_account' WHERE coupon_id = '` + ids["m-noline"] + `'`,
		`SELECT coupon_void('` + ids["m-void"] + `', '誤配布', false)`,
		`UPDATE notification_outbox SET skipped_at = now() - interval '2 days' WHERE coupon_id = '` + ids["m-void"] + `'`,
	} {
		if _, err := e.owner.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := prune(ctx, e); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, `SELECT count(*) FROM notification_outbox`); n != 0 {
		t.Fatalf("%d outbox rows left after the prune, want 0", n)
	}
	c := client(t)
	for m, want := range map[string]string{"m-sent": `data-push="sent">送信済み`, "m-noline": `data-push="skipped">送信対象外: LINE アカウントの連携がないため`,
		"m-void": `data-push="skipped">送信対象外: 無効化されたため`} {
		_, body := e.do(t, c, http.MethodGet, "/coupons/"+ids[m], e.idp.assertion(t, viewerEmail), nil)
		if !strings.Contains(body, want) {
			_, push, _ := strings.Cut(body, `class="push"`)
			v.Errorf("%s's pruned push: the page shows %.120q, want %q", m, push, want)
		}
	}
	_, body := e.do(t, c, http.MethodGet, "/campaigns/PRUNE", e.idp.assertion(t, viewerEmail), nil)
	if want := `<tr data-stage="pushed"><th scope="row" data-label="段階">送信（LINE 通知を送信済み）</th><td class="num" data-label="枚数">1</td>`; !strings.Contains(body, want) {
		v.Errorf("the funnel's 送信 is not the 1 coupon sent")
	}
	var push string
	if err := e.owner.QueryRow(ctx, `SELECT push FROM coupon_void($1, '誤配布', false)`, ids["m-sent"]).Scan(&push); err != nil {
		t.Fatal(err)
	}
	if push != "pruned" {
		v.Errorf("the void of m-sent's pruned coupon says push %q, want pruned", push)
	}
}

// TestPrunedPushTellsTheTruth: a pruned push keeps its outcome (prunedTruth; 00035). Before, a
// coupon never pushed (no LINE account, or voided) read 送信済み（整理済み） once its row was
// pruned. Also run with the previous release's prune, which forgets the outcome: found.
func TestPrunedPushTellsTheTruth(t *testing.T) {
	checkAndBreak(t, func(t *testing.T, v *verdict) {
		prunedTruth(t, v, func(ctx context.Context, e *env) error {
			_, err := outboxdb.Prune(ctx, e.owner, 24*time.Hour, 100)
			return err
		})
	}, brokenVariant{"a prune that forgets what the push came to", func(t *testing.T, v *verdict) {
		prunedTruth(t, v, func(ctx context.Context, e *env) error {
			_, err := e.owner.Exec(ctx, previousPrune)
			return err
		})
	}})
}
