package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestExpiredCampaignShowsEnded: a campaign whose fixed coupon expiry has passed (moved to the
// database's now, as the clock would) is ended in campaign show and campaign list, with when its
// coupons expired; outbox status counts skipped rows by reason, a row the previous release
// skipped (no skip_reason) by its last_error. The broken variant, the judge blind to the coupons'
// expiry as before 82220a1 (pgtest.BlindToExpiry), shows the campaign active: the check finds it.
func TestExpiredCampaignShowsEnded(t *testing.T) {
	checkAndBreak(t, expiredShowsEndedCheck, brokenVariant{"the state blind to the coupons' expiry", func(t *testing.T) {
		swap(t, &expiredBreak, func(t *testing.T, owner *pgxpool.Pool) { pgtest.BlindToExpiry(t, owner) })
	}})
}

// expiredBreak installs expiredShowsEndedCheck's broken variant in the database owner connects
// to: nothing, unless TestExpiredCampaignShowsEnded swaps the variant in.
var expiredBreak = func(*testing.T, *pgxpool.Pool) {}

// expiredShowsEndedCheck is TestExpiredCampaignShowsEnded's check: it records in v each output
// that lacks what it should say.
func expiredShowsEndedCheck(t *testing.T, v *verdict) {
	url := pgtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	ctx := context.Background()
	expires := time.Now().Add(time.Hour).Format(time.RFC3339)
	if out, err := couponctl("campaign", "create", "--id", "EXP", "--discount-yen", "1000", "--budget-yen", "10000",
		"--coupons-expire", expires); err != nil {
		t.Fatalf("campaign create: %v\n%s", err, out)
	}
	owner, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	expiredBreak(t, owner)
	if _, err := owner.Exec(ctx, `UPDATE campaign_budgets SET coupons_expire_at = now() WHERE campaign_id = 'EXP';
WITH c AS (
  INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
  SELECT 'EXP', 'm' || g, to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 1000 FROM generate_series(1, 5) g
  RETURNING coupon_id, member_id)
INSERT INTO notification_outbox (coupon_id, member_id, skipped_at, skip_reason, last_error)
SELECT coupon_id, member_id, now(), (ARRAY['expired', 'expired', 'voided', 'no_line_account', NULL])[substr(member_id, 2)::int],
       CASE WHEN member_id = 'm5' THEN 'skipped: the coupon was voided (couponctl coupon show)' END
  FROM c`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"campaign", "show", "EXP"}, []string{"state      ended (its coupons expired 20"}},
		{[]string{"campaign", "list"}, []string{"EXP", "ended (its coupons expired 20"}},
		{[]string{"outbox", "status"}, []string{"skipped    5 (never pushed)", "no LINE account  1", "voided           2", "expired          2"}},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(ctx, c.args, &stdout, &stderr); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", c.args, code, stdout.String(), stderr.String())
		}
		for _, w := range c.want {
			if !strings.Contains(stdout.String(), w) {
				v.Errorf("%v: output lacks %q:\n%s", c.args, w, stdout.String())
			}
		}
	}
}
