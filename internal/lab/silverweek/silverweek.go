// Package silverweek is the real input of docs/api.md ("The Silver Week scenario"): the Silver Week 2026 traffic (SW-A, SW-B,
// SW-C; every member asks for every campaign twice within tens of milliseconds, a double tap or
// a re-send after the app's timeout), and a driver that replays it from a barrier with a fixed
// number of concurrent workers.
package silverweek

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/shared/backoff"
	"github.com/mops/coupon-api/shared/db"
)

// Campaign is one campaign of the scenario, amounts in yen.
type Campaign struct {
	ID          string
	DiscountYen int
	BudgetYen   int // the campaign budget approval
}

// Campaigns are the three Silver Week campaigns (docs/design.md, "The incident"): SW-A early bird with a
// 100,000 yen budget, SW-B appliances and SW-C daily goods with 300,000 yen each, 1,000 yen coupons.
var Campaigns = []Campaign{
	{ID: "SW-A", DiscountYen: 1000, BudgetYen: 100_000},
	{ID: "SW-B", DiscountYen: 1000, BudgetYen: 300_000},
	{ID: "SW-C", DiscountYen: 1000, BudgetYen: 300_000},
}

// DefaultMembers is the scenario's member count: 300 members x 3 campaigns x 2 taps = 1,800
// requests, of which exactly 600 issue under the 2,000 yen cap.
const DefaultMembers = 300

// DefaultTapGap bounds the delay of the second tap after the first (50 ms): the incident's
// duplicates arrived "within tens of milliseconds".
const DefaultTapGap = 50 * time.Millisecond

// Request is one "クーポンを受け取る" tap. Delay is how long the worker that takes it waits before
// sending it (zero for a first tap).
type Request struct {
	MemberID, CampaignID string
	Delay                time.Duration
}

// MemberID names member i of the scenario, "m0001" for i = 1.
func MemberID(i int) string { return fmt.Sprintf("m%04d", i) }

// Requests builds the traffic: for each of members members, each campaign twice, the second tap
// delayed by up to tapGap; each member's taps shuffled among themselves and the members in random
// order, all from seed, so one seed replays the same traffic.
func Requests(members int, campaigns []Campaign, tapGap time.Duration, seed uint64) []Request {
	rng := rand.New(rand.NewPCG(seed, seed^0x5157))
	order := rng.Perm(members)
	reqs := make([]Request, 0, members*len(campaigns)*2)
	for _, m := range order {
		burst := make([]Request, 0, 2*len(campaigns))
		for _, c := range campaigns {
			second := time.Duration(0)
			if tapGap > 0 {
				second = time.Duration(rng.Int64N(int64(tapGap)))
			}
			burst = append(burst,
				Request{MemberID: MemberID(m + 1), CampaignID: c.ID},
				Request{MemberID: MemberID(m + 1), CampaignID: c.ID, Delay: second})
		}
		rng.Shuffle(len(burst), func(i, j int) { burst[i], burst[j] = burst[j], burst[i] })
		reqs = append(reqs, burst...)
	}
	return reqs
}

// IssueFunc sends one request and returns its result code (docs/api.md), or an error for a
// request that got no result (a 500, a broken connection).
type IssueFunc func(ctx context.Context, r Request) (string, error)

// Stats is what the driver saw. It is about responses and time only: whether the rules held is
// for the tables to say (package reconcile).
type Stats struct {
	Results   map[string]int // result code -> count
	Errors    int            // requests that got no result
	FirstErr  error          // the first of those errors
	Latencies []time.Duration
	Wall      time.Duration // from the barrier's release to the last response
}

// Percentile returns the p-th percentile (0 < p <= 100) of the latencies, nearest rank.
func (s Stats) Percentile(p float64) time.Duration {
	if len(s.Latencies) == 0 {
		return 0
	}
	l := slices.Clone(s.Latencies)
	slices.Sort(l)
	rank := int(float64(len(l))*p/100+0.999999) - 1
	return l[min(max(rank, 0), len(l)-1)]
}

// Throughput is requests per second of wall time.
func (s Stats) Throughput() float64 {
	if s.Wall <= 0 {
		return 0
	}
	return float64(len(s.Latencies)) / s.Wall.Seconds()
}

// Run replays reqs with workers concurrent workers. All workers are started and wait on a
// barrier; when every one is ready they are released together and take requests in order.
// progress, if not nil, is called after each response with the number done so far.
func Run(ctx context.Context, reqs []Request, workers int, issue IssueFunc, progress func(done int)) Stats {
	var (
		next, done atomic.Int64
		mu         sync.Mutex
		ready      sync.WaitGroup
		finished   sync.WaitGroup
		barrier    = make(chan struct{})
		stats      = Stats{Results: map[string]int{}, Latencies: make([]time.Duration, 0, len(reqs))}
	)
	ready.Add(workers)
	finished.Add(workers)
	for range workers {
		go func() {
			defer finished.Done()
			ready.Done()
			<-barrier
			for {
				i := int(next.Add(1)) - 1
				if i >= len(reqs) || ctx.Err() != nil {
					return
				}
				r := reqs[i]
				if r.Delay > 0 {
					time.Sleep(r.Delay)
				}
				t0 := time.Now()
				res, err := issue(ctx, r)
				lat := time.Since(t0)
				mu.Lock()
				stats.Latencies = append(stats.Latencies, lat)
				if err != nil {
					stats.Errors++
					if stats.FirstErr == nil {
						stats.FirstErr = err
					}
				} else {
					stats.Results[res]++
				}
				mu.Unlock()
				if progress != nil {
					progress(int(done.Add(1)))
				}
			}
		}()
	}
	ready.Wait()
	start := time.Now()
	close(barrier)
	finished.Wait()
	stats.Wall = time.Since(start)
	return stats
}

// CreateCampaigns creates the scenario's campaigns, always active.
func CreateCampaigns(ctx context.Context, conn campaign.Querier, campaigns []Campaign) error {
	for _, c := range campaigns {
		if err := campaign.Create(ctx, conn, campaign.Campaign{ID: c.ID, DiscountYen: c.DiscountYen, BudgetYen: c.BudgetYen}); err != nil {
			return err
		}
	}
	return nil
}

// Verify counts the tables after a whole run of the scenario (its [Campaigns], members members,
// the database's R3 cap at its default, 2,000 yen, with 1,000 yen coupons, so two coupons per
// member) and returns every way they
// differ from the right outcome: each broken rule of [reconcile.Report.Violations], a coupon count
// other than two per member, a member holding other than two coupons, and SW-A's counter other
// than exactly its budget. Empty means the run was right.
func Verify(ctx context.Context, q db.Querier, members int) ([]string, error) {
	rep, err := reconcile.Check(ctx, q)
	if err != nil {
		return nil, err
	}
	wrong := rep.Violations()
	if want := int64(2 * members); rep.Coupons != want {
		wrong = append(wrong, fmt.Sprintf("coupons: %d, want exactly %d (two per member)", rep.Coupons, want))
	}
	var notTwo int
	if err := q.QueryRow(ctx, `SELECT count(*) FROM (SELECT member_id FROM issued_coupons
		GROUP BY member_id HAVING count(*) <> 2) x`).Scan(&notTwo); err != nil {
		return nil, fmt.Errorf("silverweek: members: %w", err)
	}
	if notTwo != 0 {
		wrong = append(wrong, fmt.Sprintf("%d members do not hold exactly two coupons", notTwo))
	}
	for _, c := range rep.Campaigns {
		if c.CampaignID == Campaigns[0].ID && c.CounterYen != int64(Campaigns[0].BudgetYen) {
			wrong = append(wrong, fmt.Sprintf("%s: counter %d yen, want exactly its budget %d yen",
				c.CampaignID, c.CounterYen, Campaigns[0].BudgetYen))
		}
	}
	return wrong, nil
}

// MaxResends bounds how often [Resending] re-sends one request that answered RETRY_EXHAUSTED.
const MaxResends = 20

// Resending wraps issue as the app behaves on RETRY_EXHAUSTED ("nothing was written; safe to
// re-send", docs/api.md): it re-sends after a full-jitter wait (10 ms base, capped at 1 s, the
// Retry-After IssueCoupon sends), at most [MaxResends] times, and counts the re-sends in resends.
func Resending(issue IssueFunc, resends *atomic.Int64) IssueFunc {
	return func(ctx context.Context, r Request) (string, error) {
		for n := 1; ; n++ {
			res, err := issue(ctx, r)
			if err != nil || res != "RETRY_EXHAUSTED" || n > MaxResends {
				return res, err
			}
			resends.Add(1)
			select {
			case <-time.After(backoff.FullJitter(10*time.Millisecond, time.Second, n)):
			case <-ctx.Done():
				return res, ctx.Err()
			}
		}
	}
}
