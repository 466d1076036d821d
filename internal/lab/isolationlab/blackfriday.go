package isolationlab

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/shared/issuance"
)

// BlackFridayCampaign is the id of the first-come campaign of the black-friday scenario.
const BlackFridayCampaign = "BF-2026"

// FirstCome is the black-friday load (docs/hot-campaigns.md): one first-come campaign of
// BudgetCoupons coupons of DiscountYen yen, and Members members who each ask for it once, in a
// shuffled order, from a barrier. Right answer: exactly the budget issued, nothing over it.
type FirstCome struct {
	Members       int
	BudgetCoupons int
	DiscountYen   int
	// CapYen is R3's monthly cap in yen.
	CapYen int
	// Seed picks the shuffle; each run adds its workers and run number to it.
	Seed uint64
	// Instances, LeaseCoupons and KillAfter shape the preallocated option ([Preallocated]):
	// instances leasing slices of LeaseCoupons coupons, instance 0 dying after it issued
	// KillAfter coupons (0: none dies).
	Instances, LeaseCoupons, KillAfter int
}

// BlackFriday is the default black-friday load: 1,000 coupons of 1,000 yen for 20,000 members,
// 2,000 yen cap; for preallocated 8 instances leasing 25 coupons (2.5% of the budget) at a time,
// instance 0 dying halfway through its first slice.
func BlackFriday() FirstCome {
	return FirstCome{Members: 20_000, BudgetCoupons: 1_000, DiscountYen: 1_000,
		CapYen: issuance.DefaultMonthlyCapYen, Seed: 2026_11_27, Instances: 8, LeaseCoupons: 25, KillAfter: 12}
}

// Validate refuses a load the scenario cannot run.
func (l FirstCome) Validate() error {
	switch {
	case l.Members < 1 || l.BudgetCoupons < 1 || l.DiscountYen < 1:
		return fmt.Errorf("isolationlab: black-friday: members, budget coupons and discount must be at least 1")
	case l.Instances < 1 || l.LeaseCoupons < 1 || l.KillAfter < 0:
		return fmt.Errorf("isolationlab: black-friday: instances and lease must be at least 1, kill-after not negative")
	case l.KillAfter > 0 && l.Instances < 2:
		return fmt.Errorf("isolationlab: black-friday: an instance can die only if another one is left (instances >= 2)")
	case l.DiscountYen > l.CapYen:
		return fmt.Errorf("isolationlab: black-friday: a %d yen coupon is above the %d yen monthly cap", l.DiscountYen, l.CapYen)
	}
	return nil
}

// BudgetYen is the campaign's budget in yen.
func (l FirstCome) BudgetYen() int { return l.BudgetCoupons * l.DiscountYen }

// FirstComeEnv is what a first-come strategy gets for one run: a fresh database with the campaign
// created (and broken by [BreakSchema] for a strategy with BeforeSchema).
type FirstComeEnv struct {
	Pool *pgxpool.Pool
	Load FirstCome
	Now  time.Time
}

// FirstComeStrategy is one of the options the black-friday scenario compares.
type FirstComeStrategy struct {
	Name    string
	Summary string
	// Stripes is how many budget stripes the campaign is created with.
	Stripes int
	// BeforeSchema runs it on the incident's schema ([BreakSchema]).
	BeforeSchema bool
	// Leases says the budget row counts leased slices, not coupons: a positive counter drift
	// after the run is the stranded slices of dead instances, measured rather than a fault.
	Leases bool
	// New returns the issue function for one run, and finish, called once the load is through
	// (nil: nothing to do), which returns the coupons it gave back to the budget.
	New func(env FirstComeEnv) (issue IssueFunc, finish func(context.Context) (int, error), err error)
}

// FirstComeStrategies are the options of the Black Friday question (docs/hot-campaigns.md):
// the production path on one budget row, on 16 budget stripes, the budget pre-allocated per
// instance, and SERIALIZABLE.
var FirstComeStrategies = []FirstComeStrategy{
	{Name: "good", Summary: "the production path on one budget row", Stripes: 1, New: production},
	{Name: "stripes-16", Summary: "the production path on 16 budget stripes (FOR UPDATE SKIP LOCKED)", Stripes: 16, New: production},
	{Name: "preallocated", Summary: "each instance leases a slice of the budget and issues from memory", Stripes: 1, Leases: true,
		New: func(env FirstComeEnv) (IssueFunc, func(context.Context) (int, error), error) {
			p := &Preallocated{Pool: env.Pool, CapYen: env.Load.CapYen, Now: func() time.Time { return env.Now },
				Instances: env.Load.Instances, LeaseCoupons: env.Load.LeaseCoupons, KillAfter: env.Load.KillAfter}
			return p.Issue, func(ctx context.Context) (int, error) { return p.Release(ctx, BlackFridayCampaign) }, nil
		}},
	{Name: "serializable", Summary: "read-judge-write at SERIALIZABLE, 40001 retried with full jitter", Stripes: 1, BeforeSchema: true,
		New: func(env FirstComeEnv) (IssueFunc, func(context.Context) (int, error), error) {
			s := &Serializable{Pool: env.Pool, CapYen: env.Load.CapYen, Month: issuance.Month(env.Now)}
			return s.Issue, nil, nil
		}},
}

func production(env FirstComeEnv) (IssueFunc, func(context.Context) (int, error), error) {
	svc, err := issuance.New(env.Pool, issuance.Config{})
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, memberID, campaignID string) (Outcome, error) {
		out, err := svc.Issue(ctx, memberID, campaignID)
		return Outcome{Result: string(out.Result), Attempts: out.Attempts}, err
	}, nil, nil
}

// FirstComeStrategyNamed returns the first-come strategy called name, or an error listing them.
func FirstComeStrategyNamed(name string) (FirstComeStrategy, error) {
	names := make([]string, 0, len(FirstComeStrategies))
	for _, s := range FirstComeStrategies {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return FirstComeStrategy{}, fmt.Errorf("isolationlab: unknown black-friday strategy %q (known: %v)", name, names)
}

// FirstComeMeasurement is one black-friday run. Coupons, overshoot and stranded yen come from SQL
// on the tables after the run; the answers and timing from the driver.
type FirstComeMeasurement struct {
	Strategy      string `json:"strategy"`
	Workers       int    `json:"workers"`
	Run           int    `json:"run"`
	Requests      int    `json:"requests"`
	BudgetCoupons int    `json:"budget_coupons"`
	// Coupons is the campaign's live coupons; right is exactly BudgetCoupons.
	Coupons int64 `json:"coupons"`
	// OvershootYen is the coupons' yen above the budget (R1 broken).
	OvershootYen int64 `json:"overshoot_yen"`
	// StrandedYen is the budget counter minus the coupons' yen: budget counted as spent that no
	// coupon holds (a dead instance's slice). Negative would be coupons the counter missed.
	StrandedYen int64 `json:"stranded_yen"`
	// ReleasedCoupons is what the strategy gave back to the budget after the run.
	ReleasedCoupons int `json:"released_coupons"`
	// FalseRejections is the BUDGET_EXCEEDED answers after which the committed coupons were still
	// below the budget. Coupons only grow during a run, so room after the answer means room before
	// it: this never over-counts. A stranded slice keeps the coupons below the budget for good, so
	// every refusal after it counts.
	FalseRejections int64 `json:"false_rejections"`
	// RefusedBeforeLaterIssue is the BUDGET_EXCEEDED answers after which the committed coupons
	// were still below the run's final count: a later request got a coupon this one was refused.
	// It never over-counts either, and leaves stranded budget out.
	RefusedBeforeLaterIssue int64 `json:"refused_before_later_issue"`
	// RetryExhausted is every RETRY_EXHAUSTED answer, each re-sent as the app does
	// ([silverweek.Resending]); GaveUp is the requests still RETRY_EXHAUSTED after the re-sends.
	RetryExhausted int64 `json:"retry_exhausted"`
	GaveUp         int   `json:"gave_up"`
	// SoldOutMs is from the first request to the last ISSUED answer, in ms; IssueRate is the
	// coupons issued per second of it: how fast the campaign sold out.
	SoldOutMs float64 `json:"sold_out_ms"`
	IssueRate float64 `json:"issue_rate"`
	// Violations counts the rules broken: R2 duplicate pairs, R3 members over the cap, outbox
	// rows against coupons (the member x month counters are left out: SERIALIZABLE keeps none), an overshoot, and counter drift other than the stranded slices of a
	// strategy that leases.
	Violations int64          `json:"violations"`
	Results    map[string]int `json:"results"`
	Errors     int            `json:"errors"`
	FirstErr   string         `json:"first_error,omitempty"`
	Throughput float64        `json:"throughput_rps"`
	P50Ms      float64        `json:"p50_ms"`
	P99Ms      float64        `json:"p99_ms"`
}

// LostCoupons is the budget that no member got: BudgetCoupons minus Coupons, 0 at best.
func (m FirstComeMeasurement) LostCoupons() int64 { return max(int64(m.BudgetCoupons)-m.Coupons, 0) }

// FirstComePlan is a black-friday session: every strategy x every worker count x Runs runs.
type FirstComePlan struct {
	Strategies []FirstComeStrategy
	Workers    []int
	Runs       int
	Load       FirstCome
	Fresh      FreshDB
	// Progress, if not nil, gets one line per run.
	Progress io.Writer
}

// RunFirstComePlan runs the plan and returns one measurement per run, in the plan's order. It
// stops at the first error.
func RunFirstComePlan(ctx context.Context, p FirstComePlan) ([]FirstComeMeasurement, error) {
	if err := p.Load.Validate(); err != nil {
		return nil, err
	}
	var ms []FirstComeMeasurement
	total := len(p.Strategies) * len(p.Workers) * p.Runs
	for _, s := range p.Strategies {
		for _, w := range p.Workers {
			for run := 1; run <= p.Runs; run++ {
				t0 := time.Now()
				m, err := RunFirstCome(ctx, s, w, run, p.Load, p.Fresh)
				if err != nil {
					return ms, err
				}
				ms = append(ms, m)
				if p.Progress != nil {
					fmt.Fprintf(p.Progress, "black-friday [%d/%d] %s workers=%d run=%d: %d/%d coupons, over %d yen, stranded %d yen, "+
						"false rejections %d (before a later issue %d), RETRY_EXHAUSTED %d, violations %d, errors %d, %.0f req/s, sold out in %.2f s (%.1f s)\n",
						len(ms), total, s.Name, w, run, m.Coupons, m.BudgetCoupons, m.OvershootYen, m.StrandedYen,
						m.FalseRejections, m.RefusedBeforeLaterIssue, m.RetryExhausted, m.Violations, m.Errors, m.Throughput, m.SoldOutMs/1000, time.Since(t0).Seconds())
				}
			}
		}
	}
	return ms, nil
}

// RunFirstCome runs load once through s with workers concurrent workers (and pool connections)
// on a fresh database from fresh, and measures the tables afterwards.
func RunFirstCome(ctx context.Context, s FirstComeStrategy, workers, run int, load FirstCome, fresh FreshDB) (FirstComeMeasurement, error) {
	m := FirstComeMeasurement{Strategy: s.Name, Workers: workers, Run: run, BudgetCoupons: load.BudgetCoupons}
	if err := load.Validate(); err != nil {
		return m, err
	}
	pool, closeRun, err := openRun(ctx, fresh, workers)
	if err != nil {
		return m, err
	}
	defer closeRun()
	if err := campaign.Create(ctx, pool, campaign.Campaign{ID: BlackFridayCampaign, DiscountYen: load.DiscountYen,
		BudgetYen: load.BudgetYen(), Stripes: s.Stripes}); err != nil {
		return m, err
	}
	if err := setCap(ctx, pool, load.CapYen); err != nil {
		return m, err
	}
	if s.BeforeSchema {
		if err := BreakSchema(ctx, pool); err != nil {
			return m, fmt.Errorf("isolationlab: break schema: %w", err)
		}
	}
	issue, finish, err := s.New(FirstComeEnv{Pool: pool, Load: load, Now: time.Now()})
	if err != nil {
		return m, fmt.Errorf("isolationlab: %s: %w", s.Name, err)
	}

	reqs := firstComeRequests(load.Members, load.Seed+uint64(workers*1000+run))
	var exhausted, resends atomic.Int64
	seen := &refusals{budget: load.BudgetCoupons}
	var first sync.Once
	var start time.Time
	var lastIssued atomic.Int64 // ns after start
	once := func(ctx context.Context, r silverweek.Request) (string, error) {
		first.Do(func() { start = time.Now() })
		out, err := issue(ctx, r.MemberID, r.CampaignID)
		if err != nil {
			return "", err
		}
		switch out.Result {
		case string(issuance.ResultIssued):
			for at := int64(time.Since(start)); ; {
				prev := lastIssued.Load()
				if at <= prev || lastIssued.CompareAndSwap(prev, at) {
					break
				}
			}
		case ResultRetryExhausted:
			exhausted.Add(1)
		case string(issuance.ResultBudgetExceeded):
			if err := seen.observe(ctx, pool, r.CampaignID); err != nil {
				return "", err
			}
		}
		return out.Result, nil
	}
	stats := silverweek.Run(ctx, reqs, workers, silverweek.Resending(once, &resends), nil)
	if err := ctx.Err(); err != nil {
		return m, err
	}
	if finish != nil {
		if m.ReleasedCoupons, err = finish(ctx); err != nil {
			return m, err
		}
	}

	m.Requests = len(reqs)
	m.Results = stats.Results
	m.Errors = stats.Errors
	if stats.FirstErr != nil {
		m.FirstErr = stats.FirstErr.Error()
	}
	m.RetryExhausted = exhausted.Load()
	m.GaveUp = stats.Results[ResultRetryExhausted]
	m.Throughput = stats.Throughput()
	m.P50Ms = ms(stats.Percentile(50))
	m.P99Ms = ms(stats.Percentile(99))
	if err := measureFirstCome(ctx, pool, load.CapYen, s.Leases, &m); err != nil {
		return m, err
	}
	m.FalseRejections, m.RefusedBeforeLaterIssue = seen.judge(m.Coupons)
	if soldOut := time.Duration(lastIssued.Load()); soldOut > 0 {
		m.SoldOutMs = ms(soldOut)
		m.IssueRate = float64(m.Coupons) / soldOut.Seconds()
	}
	return m, nil
}

// refusals records, after each BUDGET_EXCEEDED answer, the campaign's committed coupons, until a
// count reaches the budget: counts only grow, so every later answer is then a right one.
type refusals struct {
	budget int
	full   atomic.Bool
	mu     sync.Mutex
	counts []int64 // the committed coupons seen after each answer, while below the budget
	right  int64   // answers after the budget was seen reached
}

func (r *refusals) observe(ctx context.Context, pool *pgxpool.Pool, campaignID string) error {
	if r.full.Load() {
		r.mu.Lock()
		r.right++
		r.mu.Unlock()
		return nil
	}
	var n int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM issued_coupons WHERE campaign_id = $1`, campaignID).Scan(&n); err != nil {
		return fmt.Errorf("isolationlab: count coupons: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n >= int64(r.budget) {
		r.full.Store(true)
		r.right++
		return nil
	}
	r.counts = append(r.counts, n)
	return nil
}

// judge returns the answers given below the budget, and those given below final, the run's
// final coupon count.
func (r *refusals) judge(final int64) (belowBudget, belowFinal int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.counts {
		belowBudget++
		if n < final {
			belowFinal++
		}
	}
	return belowBudget, belowFinal
}

// firstComeRequests is one request per member for [BlackFridayCampaign], shuffled by seed.
func firstComeRequests(members int, seed uint64) []silverweek.Request {
	rng := rand.New(rand.NewPCG(seed, seed^0xB1AC))
	reqs := make([]silverweek.Request, members)
	for i, m := range rng.Perm(members) {
		reqs[i] = silverweek.Request{MemberID: silverweek.MemberID(m + 1), CampaignID: BlackFridayCampaign}
	}
	return reqs
}

// measureFirstCome fills m's table figures from package reconcile's report. leases says the
// strategy counts leased slices on the budget row, so a positive counter drift is its stranded
// yen rather than a fault.
func measureFirstCome(ctx context.Context, pool *pgxpool.Pool, capYen int, leases bool, m *FirstComeMeasurement) error {
	rep, err := reconcile.Check(ctx, pool)
	if err != nil {
		return err
	}
	m.Violations = rep.DuplicatePairs + rep.MembersOverCap + rep.CouponsWithoutOutbox + rep.OutboxWithoutCoupon
	for _, c := range rep.Campaigns {
		if c.CampaignID != BlackFridayCampaign {
			continue
		}
		m.Coupons = c.Coupons
		m.OvershootYen = c.OverBudgetYen()
		m.StrandedYen = c.DriftYen()
		if m.OvershootYen > 0 {
			m.Violations++
		}
		if m.StrandedYen < 0 || (m.StrandedYen > 0 && !leases) {
			m.Violations++
		}
	}
	return nil
}

// WriteFirstComeTable writes ms to w in format (see [Formats]): "text", "markdown", "csv" or
// "json" (an array of [FirstComeMeasurement]). Amounts are yen, latencies ms.
func WriteFirstComeTable(w io.Writer, format string, ms []FirstComeMeasurement) error {
	cols := []column[FirstComeMeasurement]{
		{"strategy", "strategy", func(m FirstComeMeasurement) string { return m.Strategy }},
		{"workers", "workers", func(m FirstComeMeasurement) string { return strconv.Itoa(m.Workers) }},
		{"run", "run", func(m FirstComeMeasurement) string { return strconv.Itoa(m.Run) }},
		{"budget", "budget_coupons", func(m FirstComeMeasurement) string { return strconv.Itoa(m.BudgetCoupons) }},
		{"coupons", "coupons", func(m FirstComeMeasurement) string { return strconv.FormatInt(m.Coupons, 10) }},
		{"lost coupons", "lost_coupons", func(m FirstComeMeasurement) string { return strconv.FormatInt(m.LostCoupons(), 10) }},
		{"overshoot (yen)", "overshoot_yen", func(m FirstComeMeasurement) string { return strconv.FormatInt(m.OvershootYen, 10) }},
		{"stranded (yen)", "stranded_yen", func(m FirstComeMeasurement) string { return strconv.FormatInt(m.StrandedYen, 10) }},
		{"false rejections", "false_rejections", func(m FirstComeMeasurement) string { return strconv.FormatInt(m.FalseRejections, 10) }},
		{"refused before a later issue", "refused_before_later_issue", func(m FirstComeMeasurement) string {
			return strconv.FormatInt(m.RefusedBeforeLaterIssue, 10)
		}},
		{"RETRY_EXHAUSTED", "retry_exhausted", func(m FirstComeMeasurement) string { return strconv.FormatInt(m.RetryExhausted, 10) }},
		{"gave up", "gave_up", func(m FirstComeMeasurement) string { return strconv.Itoa(m.GaveUp) }},
		{"violations", "violations", func(m FirstComeMeasurement) string { return strconv.FormatInt(m.Violations, 10) }},
		{"errors", "errors", func(m FirstComeMeasurement) string { return strconv.Itoa(m.Errors) }},
		{"sold out s", "sold_out_ms", func(m FirstComeMeasurement) string { return strconv.FormatFloat(m.SoldOutMs/1000, 'f', 2, 64) }},
		{"coupons/s", "issue_rate", func(m FirstComeMeasurement) string { return strconv.FormatFloat(m.IssueRate, 'f', 0, 64) }},
		{"req/s", "throughput_rps", func(m FirstComeMeasurement) string { return strconv.FormatFloat(m.Throughput, 'f', 0, 64) }},
		{"p50 ms", "p50_ms", func(m FirstComeMeasurement) string { return strconv.FormatFloat(m.P50Ms, 'f', 1, 64) }},
		{"p99 ms", "p99_ms", func(m FirstComeMeasurement) string { return strconv.FormatFloat(m.P99Ms, 'f', 1, 64) }},
	}
	return writeColumns(w, format, cols, ms)
}
