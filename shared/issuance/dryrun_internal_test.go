package issuance

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// dryQueued counts the dry runs of campaignID waiting in s's dry-run coalescer.
func dryQueued(s *Service, campaignID string) int {
	if s.dry == nil {
		return 0
	}
	s.dry.mu.Lock()
	defer s.dry.mu.Unlock()
	if q := s.dry.queues[campaignID]; q != nil {
		return len(q.waiting)
	}
	return 0
}

// sqlDryCallsRunning counts the sessions of the asking one's database, other than it, running a
// call of issue_dry_run_batch: the server's other databases are other tests', run beside it.
const sqlDryCallsRunning = `SELECT count(*)::int FROM pg_stat_activity
	WHERE datname = current_database() AND state = 'active' AND query LIKE '%FROM issue_dry_run_batch(%'
	  AND pid <> pg_backend_pid()`

// TestDryRunHerdHoldsOneConnection: a herd of dry runs of one campaign holds at most one pooled
// connection of an instance, however many ask at once (issue 33, item 4: a herd of dry runs
// beside a hot campaign had held the whole pool that the issuance waited for). 64 dry runs of
// campaign S, on a pool of 16, are released from a barrier while each call of
// issue_dry_run_batch is held: the test's slow variant reads stripe 0 FOR UPDATE, and another
// session holds the stripe. The test counts in pg_stat_activity the sessions running a call
// until every dry run is either in a call or queued in the coalescer: at most 1. Then the
// holder lets go and each is answered AVAILABLE (or RETRY_EXHAUSTED if its time ran out behind
// the held call). The broken variant is the same Service with its dry-run coalescer removed
// (every dry run its own call, as before this change, with coalescing on for the issuances):
// its calls fill the pool, and the test must see more than one.
func TestDryRunHerdHoldsOneConnection(t *testing.T) {
	t.Parallel()
	const herd, poolSize = 64, 16
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dbURL := pgtest.URL(t)
			owner, err := pgx.Connect(ctx, dbURL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { owner.Close(ctx) })
			if err := campaign.Create(ctx, owner, campaign.Campaign{ID: "S", DiscountYen: 100, BudgetYen: 1_000_000}); err != nil {
				t.Fatal(err)
			}
			pgtest.BreakFunction(t, owner, "issue_dry_run_batch",
				[2]string{" STABLE SECURITY DEFINER", " VOLATILE SECURITY DEFINER"},
				[2]string{"  SELECT * INTO v FROM campaign_judge(p_campaign_id, v_at);",
					"  PERFORM FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0 FOR UPDATE;\n  SELECT * INTO v FROM campaign_judge(p_campaign_id, v_at);"})
			cfg, err := pgxpool.ParseConfig(dbURL)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = poolSize
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			s, err := New(pool, Config{Budget: AppTimeout})
			if err != nil {
				t.Fatal(err)
			}
			if broken {
				s.dry = nil
			}
			hold := pgtest.HoldCampaign(t, dbURL, "S", 0)

			start := make(chan struct{})
			answers := make(chan dryAnswered, herd)
			var wg sync.WaitGroup
			for i := range herd {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					out, err := s.DryRun(ctx, fmt.Sprintf("m%d", i), "S")
					answers <- dryAnswered{out, err}
				}()
			}
			close(start)
			most, running, queued := 0, 0, 0
			pgtest.Eventually(t, pgtest.PollTimeout, func() error {
				if err := owner.QueryRow(ctx, sqlDryCallsRunning).Scan(&running); err != nil {
					return err
				}
				queued = dryQueued(s, "S")
				most = max(most, running)
				if most > 1 || running+queued == herd {
					return nil
				}
				return fmt.Errorf("%d calls running, %d dry runs queued, of %d", running, queued, herd)
			})
			hold.Release()
			wg.Wait()
			close(answers)
			results := map[Result]int{}
			for a := range answers {
				if a.err != nil {
					t.Errorf("a dry run: %v", a.err)
					continue
				}
				results[a.out.Result]++
			}
			switch {
			case broken && most <= 1:
				t.Errorf("the broken variant ran at most %d call at once: the test would not see it", most)
			case broken:
				t.Logf("the broken variant: %d calls of issue_dry_run_batch at once, one per dry run, on a pool of %d", most, poolSize)
			case most > 1:
				t.Errorf("%d calls of issue_dry_run_batch at once for one campaign; want at most 1", most)
			default:
				t.Logf("1 call running, %d dry runs queued behind it; answers %v", queued, results)
			}
			if results[ResultAvailable]+results[ResultRetryExhausted] != herd || results[ResultAvailable] == 0 {
				t.Errorf("answers %v; want %d of AVAILABLE or RETRY_EXHAUSTED, some AVAILABLE", results, herd)
			}
		})
	}
}

// TestDryRunAloneIsAGroupOfOne: with coalescing off (BatchMax 1) a dry run is one call of
// issue_dry_run_batch with one member, its answer the same as through the coalescer's.
func TestDryRunAloneIsAGroupOfOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	owner, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close(ctx) })
	if err := campaign.Create(ctx, owner, campaign.Campaign{ID: "S", DiscountYen: 100, BudgetYen: 1000}); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var outs []DryRunOutcome
	for _, batchMax := range []int{1, DefaultBatchMax} {
		s, err := New(pool, Config{BatchMax: batchMax})
		if err != nil {
			t.Fatal(err)
		}
		if (s.dry == nil) != (batchMax == 1) {
			t.Fatalf("BatchMax %d: dry-run coalescer %v", batchMax, s.dry)
		}
		out, err := s.DryRun(ctx, "m1", "S")
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, out)
	}
	for i, out := range outs {
		if out.Result != ResultAvailable || out.RemainingCoupons == nil || *out.RemainingCoupons != 10 || out.AmountYen != 100 {
			t.Errorf("dry run %d (BatchMax 1, then coalescing): %+v; want AVAILABLE, 100 yen, 10 remaining", i, out)
		}
	}
}
