package redemption_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/pressly/goose/v3"

	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/redemption"
)

// TestLegacyRedeemedStayRedeemed: a coupon the migration found redeemed (redeemed_at set before
// 00032, no order known) stays redeemed after 00032: it has its history row, any order's redeem
// answers ALREADY_REDEEMED and its rollback NOT_REDEEMED, a void is refused, and reconcile finds
// no drift. The broken variant, 00032 without the legacy coupons' rows (such a coupon marked
// redeemed with no history, as the migration would leave it), is found by reconcile.
func TestLegacyRedeemedStayRedeemed(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%t", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := pgtest.EmptyURL(t)
			db, err := sql.Open("pgx", url)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			p, err := goose.NewProvider(goose.DialectPostgres, db, schema.Migrations())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.UpTo(ctx, 31); err != nil {
				t.Fatal(err)
			}
			legacy := func() {
				if _, err := db.ExecContext(ctx, `UPDATE issued_coupons SET redeemed_at = now() - interval '1 day' WHERE member_id = 'old'`); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := db.ExecContext(ctx, `SELECT campaign_create('OLD', 500, 100000, 1, NULL, NULL, NULL, NULL, 'before 00032');
				SELECT * FROM issue_coupons_batch_v3('OLD', ARRAY[gen_random_uuid()], ARRAY['old'], ARRAY[NULL::text])`); err != nil {
				t.Fatal(err)
			}
			if !broken {
				legacy()
			}
			if _, err := p.Up(ctx); err != nil {
				t.Fatal(err)
			}
			if broken {
				legacy()
			}
			var id string
			if err := db.QueryRowContext(ctx, `SELECT coupon_id FROM issued_coupons WHERE member_id = 'old'`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			svc, err := redemption.New(pgtest.PoolAt(t, pgtest.LoginAs(t, url, "coupon_redeem"), 2), issuance.Config{})
			if err != nil {
				t.Fatal(err)
			}
			owner := pgtest.PoolAt(t, url, 2)
			var problems []string
			for _, step := range []struct {
				r    redemption.Request
				want redemption.Result
			}{
				{req(redemption.Redeem, id, "old", "POS-9"), redemption.ResultAlreadyRedeemed},
				{req(redemption.Rollback, id, "old", "POS-9"), redemption.ResultNotRedeemed},
			} {
				if out, err := svc.Do(ctx, step.r); err != nil || out.Result != step.want {
					problems = append(problems, fmt.Sprintf("%s: %+v %v, want %s", step.r.Action, out, err, step.want))
				}
			}
			if _, err := coupon.Void(ctx, owner, id, "a legacy coupon", false); err == nil {
				problems = append(problems, "a void of the legacy redeemed coupon went through")
			}
			rep, err := reconcile.Check(ctx, owner)
			if err != nil {
				t.Fatal(err)
			}
			if rep.RedemptionDrift != 0 {
				problems = append(problems, fmt.Sprintf("reconcile: %d coupons whose redemption disagrees with their history", rep.RedemptionDrift))
			}
			pgtest.Verdict(t, broken, problems)
		})
	}
}
