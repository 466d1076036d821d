package issuance_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// BenchmarkIssueHotCampaign issues coupons to new members of one campaign from
// 16 x GOMAXPROCS goroutines (32 on the 2-core build machine): every transaction updates the same
// campaign budget row, the case docs/hot-row.md measured. ns/op is wall time per coupon across
// all goroutines, so 1e9/(ns/op) is coupons per second. The test server runs with fsync off, so
// compare figures only within one run.
//
// The sub-benchmarks move the foreign key of issued_coupons.campaign_id, to weigh the schema's
// choice: "static" is the schema as migrated (the key points at the campaigns row nobody
// updates); "hot" points it at the campaign_budgets row every transaction updates, so each
// insert's KEY SHARE lock piles onto the row being updated; "none" drops it.
func BenchmarkIssueHotCampaign(b *testing.B) {
	for _, fk := range []struct{ name, alter string }{
		{"fk=static", ``},
		{"fk=hot", `ALTER TABLE issued_coupons DROP CONSTRAINT issued_coupons_campaign_id_fkey;
ALTER TABLE issued_coupons ADD FOREIGN KEY (campaign_id) REFERENCES campaign_budgets`},
		{"fk=none", `ALTER TABLE issued_coupons DROP CONSTRAINT issued_coupons_campaign_id_fkey`},
	} {
		b.Run(fk.name, func(b *testing.B) {
			ctx := context.Background()
			pool := pgtest.Pool(b, 64)
			if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "HOT", DiscountYen: 1, BudgetYen: 1 << 30}); err != nil {
				b.Fatal(err)
			}
			if fk.alter != "" {
				if _, err := pool.Exec(ctx, fk.alter); err != nil {
					b.Fatal(err)
				}
			}
			svc, err := issuance.New(pool, issuance.Config{})
			if err != nil {
				b.Fatal(err)
			}
			var member atomic.Int64
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					out, err := svc.Issue(ctx, fmt.Sprintf("b%d", member.Add(1)), "HOT")
					if err != nil || out.Result != issuance.ResultIssued {
						b.Errorf("%+v %v", out, err)
						return
					}
				}
			})
		})
	}
}
