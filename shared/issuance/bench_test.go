package issuance_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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

// BenchmarkDryRunsBesideAHotCampaign is issue 33's measure of the dry run: the hot campaign's
// issuance load of [BenchmarkIssueHotCampaign] (fk=static), alone ("dry runs=0") and with 32
// goroutines sending dry runs for the same campaign without pause through a service on a pool of
// their own, as other instances would ("dry runs=32"). ns/op is wall time per coupon issued; the
// dry runs must not lower the issuance's rate by more than 10% (docs/performance.md). dryruns/s
// is the herd's own rate.
func BenchmarkDryRunsBesideAHotCampaign(b *testing.B) {
	for _, herd := range []int{0, 32} {
		b.Run(fmt.Sprintf("dry runs=%d", herd), func(b *testing.B) {
			ctx := context.Background()
			pool := pgtest.Pool(b, 64)
			if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "HOT", DiscountYen: 1, BudgetYen: 1 << 30}); err != nil {
				b.Fatal(err)
			}
			svc, err := issuance.New(pool, issuance.Config{})
			if err != nil {
				b.Fatal(err)
			}
			dryPool, err := pgxpool.New(ctx, pool.Config().ConnString())
			if err != nil {
				b.Fatal(err)
			}
			defer dryPool.Close()
			drySvc, err := issuance.New(dryPool, issuance.Config{})
			if err != nil {
				b.Fatal(err)
			}
			stop := make(chan struct{})
			var dryRuns atomic.Int64
			var wg sync.WaitGroup
			for i := range herd {
				wg.Go(func() {
					for n := 0; ; n++ {
						select {
						case <-stop:
							return
						default:
						}
						if out, err := drySvc.DryRun(ctx, fmt.Sprintf("d%d-%d", i, n), "HOT"); err != nil || out.Result != issuance.ResultAvailable {
							b.Errorf("dry run: %+v %v", out, err)
							return
						}
						dryRuns.Add(1)
					}
				})
			}
			var member atomic.Int64
			b.SetParallelism(16)
			b.ResetTimer()
			dryRuns.Store(0)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					out, err := svc.Issue(ctx, fmt.Sprintf("b%d", member.Add(1)), "HOT")
					if err != nil || out.Result != issuance.ResultIssued {
						b.Errorf("%+v %v", out, err)
						return
					}
				}
			})
			b.StopTimer()
			close(stop)
			wg.Wait()
			b.ReportMetric(float64(dryRuns.Load())/time.Since(start).Seconds(), "dryruns/s")
		})
	}
}
