package isolationlab

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/ops/rules"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/issuance"
)

// Load is the traffic of one run: members x campaigns x two taps, shuffled
// ([silverweek.Requests]).
type Load struct {
	Members   int
	Campaigns []silverweek.Campaign
	// CapYen is R3's monthly cap in yen.
	CapYen int
	// TapGap bounds the delay of each second tap (a duration); zero sends both taps at once.
	TapGap time.Duration
	// Seed picks the shuffle; each run adds its workers and run number to it.
	Seed uint64
}

// SilverWeek is the default load of docs/api.md ("The Silver Week scenario"): 300 members, SW-A/SW-B/SW-C, 2,000 yen cap,
// second taps within 50 ms. Its right answer is exactly 600 coupons.
func SilverWeek() Load {
	return Load{
		Members:   silverweek.DefaultMembers,
		Campaigns: append([]silverweek.Campaign(nil), silverweek.Campaigns...),
		CapYen:    issuance.DefaultMonthlyCapYen,
		TapGap:    silverweek.DefaultTapGap,
		Seed:      2026_09_19,
	}
}

// FreshDB makes a new migrated database for one run and returns its URL and a function that
// drops it.
type FreshDB func(ctx context.Context) (dbURL string, drop func(), err error)

// OnServer returns a [FreshDB] that creates each database on the PostgreSQL server at serverURL
// (a postgres:// URL whose user may CREATE DATABASE), applies the schema migrations, and drops it
// with DROP DATABASE ... WITH (FORCE).
func OnServer(serverURL string) (FreshDB, error) {
	base, err := url.Parse(serverURL)
	if err != nil || (base.Scheme != "postgres" && base.Scheme != "postgresql") {
		return nil, fmt.Errorf("isolationlab: server %q: want a postgres:// URL", redact(serverURL))
	}
	var n atomic.Int64
	return func(ctx context.Context) (string, func(), error) {
		name := fmt.Sprintf("isolationlab_%d_%d", os.Getpid(), n.Add(1))
		ident := pgx.Identifier{name}.Sanitize()
		admin, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			return "", nil, fmt.Errorf("isolationlab: connect to server: %w", err)
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
			return "", nil, fmt.Errorf("isolationlab: create database %s: %w", name, err)
		}
		drop := func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if c, err := pgx.Connect(ctx, serverURL); err == nil {
				_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
				_ = c.Close(ctx)
			}
		}
		u := *base
		u.Path = "/" + name
		if _, err := schema.MigrateURL(ctx, u.String()); err != nil {
			drop()
			return "", nil, err
		}
		return u.String(), drop, nil
	}, nil
}

func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		return u.Redacted()
	}
	return s
}

// CampaignFigures is one campaign's R1 figures after a run, in yen.
type CampaignFigures struct {
	CampaignID   string `json:"campaign_id"`
	BudgetYen    int64  `json:"budget_yen"`
	CounterYen   int64  `json:"counter_yen"`
	ActualYen    int64  `json:"actual_yen"`
	OvershootYen int64  `json:"overshoot_yen"` // max(0, actual - budget): R1 broken
}

// Measurement is one run of one strategy at one worker count. The rule figures come from SQL on
// the tables after the run, never from the responses; the timing figures from the driver.
type Measurement struct {
	Strategy string `json:"strategy"`
	Workers  int    `json:"workers"`
	Run      int    `json:"run"`
	Requests int    `json:"requests"`
	// Coupons is how many coupons exist (600 is right for the Silver Week load).
	Coupons   int64             `json:"coupons"`
	Campaigns []CampaignFigures `json:"campaigns"`
	// CounterDriftYen is R1's counters against their coupons: SUM over campaigns of
	// |issued_yen - SUM(amount_yen)|, in yen (the lost update leaves it non-zero).
	CounterDriftYen int64 `json:"counter_drift_yen"`
	// DuplicatePairs is R2: (campaign, member) pairs holding more than one coupon.
	DuplicatePairs int64 `json:"r2_duplicate_pairs"`
	// MembersOverCap is R3: member x month pairs whose coupons sum above the cap.
	MembersOverCap int64 `json:"r3_members_over_cap"`
	// Pushes counts notifications: pushes sent inside a transaction plus outbox rows (which the
	// relay sends after COMMIT). PushesWithoutCoupon counts those whose coupon does not exist.
	Pushes              int64 `json:"pushes"`
	PushesWithoutCoupon int64 `json:"pushes_without_coupon"`
	// Retries is the transactions started beyond the first of each request.
	Retries int64 `json:"retries"`
	// Exhausted is the requests answered RETRY_EXHAUSTED (SYSTEM_ERROR for the Before code).
	Exhausted int `json:"retry_exhausted"`
	// Errors is the requests that got no result code at all (a 500).
	Errors   int    `json:"errors"`
	FirstErr string `json:"first_error,omitempty"`
	// Results counts the answers by result code.
	Results map[string]int `json:"results"`
	// Throughput is requests per second of wall time; P50Ms and P99Ms are request latencies in
	// milliseconds.
	Throughput float64 `json:"throughput_rps"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
}

// OvershootYen is R1's overshoot summed over the campaigns, in yen.
func (m Measurement) OvershootYen() int64 {
	var s int64
	for _, c := range m.Campaigns {
		s += c.OvershootYen
	}
	return s
}

// RetriedPct is [Measurement.Retries] as a percentage of the requests.
func (m Measurement) RetriedPct() float64 {
	if m.Requests == 0 {
		return 0
	}
	return 100 * float64(m.Retries) / float64(m.Requests)
}

// Violations counts the broken rules: R1 overshoot or counter drift (per campaign), R2 duplicate
// pairs, R3 members over the cap, pushes for coupons that do not exist. Zero means every rule held.
func (m Measurement) Violations() int64 {
	var v int64
	for _, c := range m.Campaigns {
		if c.OvershootYen > 0 || c.CounterYen != c.ActualYen {
			v++
		}
	}
	return v + m.DuplicatePairs + m.MembersOverCap + m.PushesWithoutCoupon
}

// Plan is a whole lab session: every strategy x every worker count x Runs runs.
type Plan struct {
	Strategies []Strategy
	Workers    []int
	Runs       int
	Load       Load
	Fresh      FreshDB
	// Progress, if not nil, gets one line per run.
	Progress io.Writer
}

// Run runs the plan and returns one measurement per run, in the plan's order. It stops at the
// first error (a database that cannot be created, a strategy that cannot start).
func Run(ctx context.Context, p Plan) ([]Measurement, error) {
	var ms []Measurement
	total := len(p.Strategies) * len(p.Workers) * p.Runs
	for _, s := range p.Strategies {
		for _, w := range p.Workers {
			for run := 1; run <= p.Runs; run++ {
				t0 := time.Now()
				m, err := RunOne(ctx, s, w, run, p.Load, p.Fresh)
				if err != nil {
					return ms, err
				}
				ms = append(ms, m)
				if p.Progress != nil {
					fmt.Fprintf(p.Progress, "sim [%d/%d] %s workers=%d run=%d: %d coupons, R1 over %d yen, drift %d yen, "+
						"R2 %d, R3 %d, pushes w/o coupon %d, retried %.1f%%, exhausted %d, errors %d (%.1f s)\n",
						len(ms), total, s.Name, w, run, m.Coupons, m.OvershootYen(), m.CounterDriftYen,
						m.DuplicatePairs, m.MembersOverCap, m.PushesWithoutCoupon, m.RetriedPct(), m.Exhausted,
						m.Errors, time.Since(t0).Seconds())
				}
			}
		}
	}
	return ms, nil
}

// openRun makes a fresh database for one run and a pool of workers connections on it; the
// returned function closes the pool and drops the database.
func openRun(ctx context.Context, fresh FreshDB, workers int) (*pgxpool.Pool, func(), error) {
	dbURL, drop, err := fresh(ctx)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		drop()
		return nil, nil, fmt.Errorf("isolationlab: pool config: %w", err)
	}
	cfg.MaxConns = int32(workers)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, nil, fmt.Errorf("isolationlab: pool: %w", err)
	}
	return pool, func() { pool.Close(); drop() }, nil
}

// RunOne runs load once through strategy s with workers concurrent workers, on a fresh database
// from fresh, and measures the tables afterwards.
func RunOne(ctx context.Context, s Strategy, workers, run int, load Load, fresh FreshDB) (Measurement, error) {
	m := Measurement{Strategy: s.Name, Workers: workers, Run: run}
	pool, closeRun, err := openRun(ctx, fresh, workers)
	if err != nil {
		return m, err
	}
	defer closeRun()
	if err := silverweek.CreateCampaigns(ctx, pool, load.Campaigns); err != nil {
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
	pushes := &PushLog{Delay: DefaultPushDelay}
	issue, err := s.New(Env{Pool: pool, CapYen: load.CapYen, Now: time.Now(), Push: pushes.Push})
	if err != nil {
		return m, fmt.Errorf("isolationlab: %s: %w", s.Name, err)
	}

	reqs := silverweek.Requests(load.Members, load.Campaigns, load.TapGap, load.Seed+uint64(workers*1000+run))
	var retries atomic.Int64
	stats := silverweek.Run(ctx, reqs, workers, func(ctx context.Context, r silverweek.Request) (string, error) {
		out, err := issue(ctx, r.MemberID, r.CampaignID)
		retries.Add(int64(max(out.Attempts-1, 0)))
		return out.Result, err
	}, nil)
	if err := ctx.Err(); err != nil {
		return m, err
	}

	m.Requests = len(reqs)
	m.Retries = retries.Load()
	m.Results = stats.Results
	m.Errors = stats.Errors
	if stats.FirstErr != nil {
		m.FirstErr = stats.FirstErr.Error()
	}
	for res, n := range stats.Results {
		if GaveUp(res) {
			m.Exhausted += n
		}
	}
	m.Throughput = stats.Throughput()
	m.P50Ms = ms(stats.Percentile(50))
	m.P99Ms = ms(stats.Percentile(99))
	return m, measureTables(ctx, pool, load.CapYen, pushes.CouponIDs(), &m)
}

// setCap sets R3's cap of the run's database to capYen (coupon_rules), which the production
// path and reconcile read.
func setCap(ctx context.Context, pool *pgxpool.Pool, capYen int) error {
	if _, _, err := rules.SetMonthlyCap(ctx, pool, capYen, "isolation lab: the load's cap"); err != nil {
		return fmt.Errorf("isolationlab: %w", err)
	}
	return nil
}

// measureTables fills m's rule figures from the tables (package reconcile) and counts the pushes:
// the recorded in-transaction pushes plus the outbox rows, and those of either whose coupon does
// not exist.
func measureTables(ctx context.Context, pool *pgxpool.Pool, capYen int, pushed []string, m *Measurement) error {
	rep, err := reconcile.Check(ctx, pool)
	if err != nil {
		return err
	}
	m.Coupons = rep.Coupons
	m.DuplicatePairs = rep.DuplicatePairs
	m.MembersOverCap = rep.MembersOverCap
	for _, c := range rep.Campaigns {
		m.Campaigns = append(m.Campaigns, CampaignFigures{CampaignID: c.CampaignID, BudgetYen: c.BudgetYen,
			CounterYen: c.CounterYen, ActualYen: c.ActualYen, OvershootYen: max(0, c.ActualYen-c.BudgetYen)})
		m.CounterDriftYen += abs(c.CounterYen - c.ActualYen)
	}
	err = pool.QueryRow(ctx, sqlPushes, pushed).Scan(&m.Pushes, &m.PushesWithoutCoupon)
	if err != nil {
		return fmt.Errorf("isolationlab: count pushes: %w", err)
	}
	return nil
}

// sqlPushes counts the pushes: $1 the coupon ids pushed inside transactions (one per push), plus
// the outbox rows. The second column is those whose coupon is not in issued_coupons.
const sqlPushes = `
WITH pushed AS (
  SELECT p.coupon_id FROM unnest($1::uuid[]) AS p(coupon_id)
  UNION ALL
  SELECT o.coupon_id FROM notification_outbox o
)
SELECT count(*),
       count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM issued_coupons i WHERE i.coupon_id = pushed.coupon_id))
  FROM pushed`

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// CampaignIDs returns the campaign ids of ms in the order of the first measurement.
func CampaignIDs(ms []Measurement) []string {
	var ids []string
	if len(ms) > 0 {
		for _, c := range ms[0].Campaigns {
			ids = append(ids, c.CampaignID)
		}
	}
	return ids
}

// CampaignLetters names n campaigns for a custom load: SW-A, SW-B, ... up to SW-Z.
func CampaignLetters(n int) ([]string, error) {
	if n < 1 || n > 26 {
		return nil, fmt.Errorf("isolationlab: %d campaigns: want 1 to 26", n)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "SW-" + string(rune('A'+i))
	}
	return ids, nil
}
