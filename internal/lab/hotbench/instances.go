package hotbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/reconcile"
)

// Fleet is N serving processes of IssueCoupon, each with its own pool and coalescer, as Cloud
// Run's instances of one revision are.
type Fleet interface {
	// Issue sends one request to instance i (0 to N-1) and returns its result code.
	Issue(ctx context.Context, i int, memberID, campaignID string) (string, error)
	// CPU is the CPU the fleet's processes have used so far, user and system, summed.
	CPU() (time.Duration, error)
	// Close stops every process of the fleet.
	Close() error
}

// Load is the traffic of one instances cell.
type Load struct {
	Name string
	// Campaigns is how many campaigns the requests are spread over, uniformly at random; each
	// request is a new member.
	Campaigns int
	// Stripes is each campaign's budget stripes.
	Stripes int
}

// The loads of [RunInstances]: one hot campaign (1 and 16 stripes) and a cold mix.
var (
	Hot1  = Load{Name: "hot-1", Campaigns: 1, Stripes: 1}
	Hot16 = Load{Name: "hot-16", Campaigns: 1, Stripes: 16}
	Cold  = Load{Name: "cold", Campaigns: 500, Stripes: 1}
	// Loads are the loads by name, in the order the cells run them.
	Loads = []Load{Hot1, Hot16, Cold}
)

// InstancesConfig is one run of the instances cells.
type InstancesConfig struct {
	// DBURL is a migrated database, a postgres:// URL; the bench's own queries go to it.
	DBURL string
	// Start starts a fleet of n serving processes on DBURL.
	Start func(ctx context.Context, n int) (Fleet, error)
	// Cells are the (instances, clients) pairs, each run with every load of Loads.
	Cells []Shape
	// Loads are the loads of each cell.
	Loads []Load
	// Duration is the measured length of each cell, after a warm-up of [warmUp].
	Duration time.Duration
	// Progress, if not nil, gets one line per cell.
	Progress io.Writer
	// ServerCPU, if not nil, reads the CPU the database server has used so far.
	ServerCPU func() (time.Duration, error)
}

// Shape is a fleet of Instances processes and Clients clients spread over them.
type Shape struct{ Instances, Clients int }

// InstancesResult is one cell: a fleet, its clients and a load.
type InstancesResult struct {
	Shape
	Load   string
	Issued int64 // ISSUED answers
	Failed int64 // any other answer or a transport error
	TPS    float64
	P50Ms  float64
	P99Ms  float64
	// PGCPUMs and SvcCPUMs are the core-milliseconds the database server and the fleet's
	// processes used during the measured load (0 when not measured).
	PGCPUMs, SvcCPUMs float64
	// Calls, StripeUpdates and RolledBack are the database's transactions committed, updates of
	// campaign_budgets and transactions rolled back during the cell (pg_stat_database,
	// pg_stat_user_tables, read once the backends have gone idle: see [readCounters]).
	Calls, StripeUpdates, RolledBack int64
	// LockWaits is the share of the database's active sessions of the cell waiting on a lock,
	// sampled every [waitSample] during the load (pg_stat_activity).
	LockWaits float64
	Rules     string
}

// warmUp is the load each fleet gets on a campaign of its own before a cell is measured, so
// that its pools are full and its code paths warm.
const warmUp = time.Second

// RunInstances runs every cell of cfg with every load, on one fleet per instance count (started
// once, cells of the same count in a row), and returns the results in order.
func RunInstances(ctx context.Context, cfg InstancesConfig) ([]InstancesResult, error) {
	if cfg.Start == nil || len(cfg.Cells) == 0 || len(cfg.Loads) == 0 {
		return nil, errors.New("hotbench: the instances cells need a fleet, cells and loads")
	}
	pool, err := pgxpool.New(ctx, cfg.DBURL)
	if err != nil {
		return nil, fmt.Errorf("hotbench: pool: %w", err)
	}
	defer pool.Close()
	var out []InstancesResult
	total := len(cfg.Cells) * len(cfg.Loads)
	var fleet Fleet
	defer func() {
		if fleet != nil {
			fleet.Close()
		}
	}()
	for i, shape := range cfg.Cells {
		if i == 0 || cfg.Cells[i-1].Instances != shape.Instances {
			if fleet != nil {
				fleet.Close()
			}
			if fleet, err = cfg.Start(ctx, shape.Instances); err != nil {
				fleet = nil
				return out, fmt.Errorf("hotbench: starting %d instances: %w", shape.Instances, err)
			}
		}
		for _, load := range cfg.Loads {
			r, err := runInstancesCell(ctx, cfg, pool, fleet, shape, load, len(out))
			if err != nil {
				return out, fmt.Errorf("hotbench: %s, %s, %s: %w", Plural(shape.Instances, "instance"), Plural(shape.Clients, "client"), load.Name, err)
			}
			out = append(out, r)
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "bench [%d/%d] %s, %s, %s: %.0f/s, p50 %.1f ms, p99 %.1f ms, PG %s core-ms/coupon, service %s, %s calls/coupon, lock-waiting %.2f, failed %d, rules %s\n",
					len(out), total, Plural(shape.Instances, "instance"), Plural(shape.Clients, "client"), load.Name, r.TPS, r.P50Ms, r.P99Ms,
					perCoupon(r.PGCPUMs, r.Issued), perCoupon(r.SvcCPUMs, r.Issued), perCoupon(float64(r.Calls), r.Issued), r.LockWaits, r.Failed, r.Rules)
			}
		}
	}
	return out, nil
}

// runInstancesCell runs load on fleet with shape's clients, on campaigns of its own (the n-th
// cell's), after a warm-up, and checks the rules afterwards.
func runInstancesCell(ctx context.Context, cfg InstancesConfig, pool *pgxpool.Pool, fleet Fleet, shape Shape, load Load, n int) (InstancesResult, error) {
	r := InstancesResult{Shape: shape, Load: load.Name}
	prefix := fmt.Sprintf("INST-%d-%d-%d-%s", n, shape.Instances, shape.Clients, load.Name)
	ids, err := createCampaigns(ctx, pool, prefix, load)
	if err != nil {
		return r, err
	}
	warm, err := createCampaigns(ctx, pool, prefix+"-warm", Load{Campaigns: 1, Stripes: load.Stripes})
	if err != nil {
		return r, err
	}
	if _, _, _, err := spreadLoop(ctx, fleet, shape, warmUp, warm); err != nil {
		return r, err
	}
	before, err := settledCounters(ctx, pool, cfg.ServerCPU, fleet)
	if err != nil {
		return r, err
	}
	var lat []time.Duration
	var failed int64
	var wall time.Duration
	var samples int64
	r.LockWaits, samples, err = sampleWaits(ctx, pool, func() error {
		var err error
		lat, failed, wall, err = spreadLoop(ctx, fleet, shape, cfg.Duration, ids)
		return err
	})
	if err != nil {
		return r, err
	}
	mid, err := readCounters(ctx, pool, cfg.ServerCPU, fleet) // the CPU at once, the counters after the flush
	if err != nil {
		return r, err
	}
	after, err := settledCounters(ctx, pool, nil, nil)
	if err != nil {
		return r, err
	}
	r.Issued, r.Failed = int64(len(lat)), failed
	r.TPS = float64(r.Issued) / wall.Seconds()
	r.P50Ms, r.P99Ms = percentileMs(lat, 50), percentileMs(lat, 99)
	r.PGCPUMs, r.SvcCPUMs = ms(mid.pg-before.pg), ms(mid.svc-before.svc)
	// The samples and the read between the two are the bench's own commits (with the few of
	// settledCounters' ending the sessions, flushed or not: not subtracted).
	r.Calls = after.commits - before.commits - samples - 1
	r.StripeUpdates, r.RolledBack = after.stripeUpdates-before.stripeUpdates, after.rolledBack-before.rolledBack
	r.Rules, err = checkCampaigns(ctx, pool, ids, r.Issued)
	return r, err
}

// createCampaigns creates load's campaigns, named prefix-1.., and returns their ids.
func createCampaigns(ctx context.Context, pool *pgxpool.Pool, prefix string, load Load) ([]string, error) {
	ids := make([]string, load.Campaigns)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i+1)
		if err := campaign.Create(ctx, pool, benchCampaign(ids[i], load.Stripes)); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// spreadLoop keeps shape.Clients requests in flight for d, each for a new member of one of
// campaigns (at random), each sent to the next instance of the fleet in turn (round robin over
// all clients' requests, as Cloud Run's load balancer spreads a service's requests over its
// instances), and returns the latencies of the ISSUED answers, the other answers and failures,
// and the wall time.
func spreadLoop(ctx context.Context, fleet Fleet, shape Shape, d time.Duration, campaigns []string) ([]time.Duration, int64, time.Duration, error) {
	var next, members atomic.Int64
	return clientLoop(ctx, shape.Clients, d, func(ctx context.Context) bool {
		id := campaigns[rand.IntN(len(campaigns))]
		member := fmt.Sprintf("i%s-%d", campaigns[0], members.Add(1))
		res, err := fleet.Issue(ctx, int(next.Add(1)%int64(shape.Instances)), member, id)
		return err == nil && res == "ISSUED"
	})
}

// waitSample is how often [sampleWaits] reads pg_stat_activity.
const waitSample = 100 * time.Millisecond

// sqlWaits counts the database's other client sessions that are active, and those of them
// waiting on a heavyweight lock.
const sqlWaits = `
SELECT count(*) FILTER (WHERE state = 'active'), count(*) FILTER (WHERE state = 'active' AND wait_event_type = 'Lock')
  FROM pg_stat_activity
 WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`

// sampleWaits runs load while sampling pg_stat_activity every [waitSample], and returns the
// share of the active sessions seen that waited on a lock, and the samples taken.
func sampleWaits(ctx context.Context, pool *pgxpool.Pool, load func() error) (float64, int64, error) {
	done := make(chan struct{})
	var active, waiting, samples int64
	var sampleErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(waitSample)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			var a, w int64
			if sampleErr = pool.QueryRow(ctx, sqlWaits).Scan(&a, &w); sampleErr != nil {
				return
			}
			active, waiting, samples = active+a, waiting+w, samples+1
		}
	})
	err := load()
	close(done)
	wg.Wait()
	if err = errors.Join(err, sampleErr); err != nil || active == 0 {
		return 0, samples, err
	}
	return float64(waiting) / float64(active), samples, nil
}

// counters are the cumulative figures a cell reads before and after its load.
type counters struct {
	pg, svc                            time.Duration
	commits, stripeUpdates, rolledBack int64
}

// sqlCounters reads the database's committed and rolled-back transactions and the updates of
// the budget stripes.
const sqlCounters = `
SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
       (SELECT coalesce(sum(n_tup_upd), 0)::bigint FROM pg_stat_user_tables
         WHERE schemaname = 'public' AND relname = 'campaign_budgets'),
       (SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database())`

// settledCounters is [readCounters] once every other session of the database and role has
// ended, so that the counters hold all those sessions did: a PostgreSQL 15 backend idle within
// a second of its last flush holds its counters up to 10 s, and flushes them all as it exits
// (see [settledStats]; waiting a fixed 1.2 s undercounted the calls of a short cell up to 50
// times). The sessions are the fleet's pooled connections and pool's, reset first; the fleet's
// pools replace theirs as pgxpool pings a connection idle over a second, so the counters (and
// the CPU) are read once that second has passed: a cell's load starts on new connections.
func settledCounters(ctx context.Context, pool *pgxpool.Pool, serverCPU func() (time.Duration, error), fleet Fleet) (counters, error) {
	pool.Reset()
	ended := time.Now()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return counters{}, err
	}
	err = endSessions(ctx, conn.Conn())
	conn.Release()
	if err != nil {
		return counters{}, err
	}
	time.Sleep(time.Until(ended.Add(pgxpoolPingIdle)))
	return readCounters(ctx, pool, serverCPU, fleet)
}

// readCounters reads the database's counters and, when given, the server's and the fleet's CPU.
// The counters hold what the backends have flushed (see [settledCounters]). The bench's own
// reads count as commits too, a few per cell.
func readCounters(ctx context.Context, pool *pgxpool.Pool, serverCPU func() (time.Duration, error), fleet Fleet) (counters, error) {
	var c counters
	var err error
	if serverCPU != nil {
		if c.pg, err = serverCPU(); err != nil {
			return c, err
		}
	}
	if fleet != nil {
		if c.svc, err = fleet.CPU(); err != nil {
			return c, err
		}
	}
	err = pool.QueryRow(ctx, sqlCounters).Scan(&c.commits, &c.stripeUpdates, &c.rolledBack)
	return c, err
}

// Plural is n and the noun one, with an s unless n is 1: "1 instance", "4 instances".
func Plural(n int, one string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %ss", n, one)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// checkCampaigns runs package reconcile over the whole database and checks that campaigns hold
// exactly want coupons together; it returns "held", or what broke.
func checkCampaigns(ctx context.Context, pool *pgxpool.Pool, campaigns []string, want int64) (string, error) {
	var coupons int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM issued_coupons WHERE campaign_id = ANY($1)`, campaigns).Scan(&coupons); err != nil {
		return "", err
	}
	rep, err := reconcile.Check(ctx, pool)
	if err != nil {
		return "", err
	}
	wrong := rep.Violations()
	if coupons != want {
		wrong = append(wrong, fmt.Sprintf("%d coupons for %d issued", coupons, want))
	}
	if len(wrong) == 0 {
		return "held", nil
	}
	return strings.Join(wrong, "; "), nil
}

// WriteInstances writes the instances cells as a table: per cell the rate, p50 and p99, the
// database's and the fleet's core-ms per coupon (when measured), per coupon the database's
// transactions (calls: 1 over the coalesced group's size) and budget-stripe updates, the
// rollbacks, and the share of active sessions waiting on a lock.
func WriteInstances(w io.Writer, format string, cpu bool, cells []InstancesResult) error {
	if !slices.Contains(Formats, format) {
		return fmt.Errorf("hotbench: format %q: want one of %s", format, strings.Join(Formats, ", "))
	}
	rows := [][]string{{"instances", "clients", "load", "issued/s", "p50 ms", "p99 ms", CPUColumn, "service core-ms per coupon",
		"calls per coupon", "stripe updates per coupon", "rolled back", "lock-waiting share", "failed", "rules"}}
	for _, r := range cells {
		pg, svc := "", ""
		if cpu {
			pg, svc = perCoupon(r.PGCPUMs, r.Issued), perCoupon(r.SvcCPUMs, r.Issued)
		}
		rows = append(rows, []string{strconv.Itoa(r.Instances), strconv.Itoa(r.Clients), r.Load, fmtFloat(r.TPS, 0),
			fmtFloat(r.P50Ms, 1), fmtFloat(r.P99Ms, 1), pg, svc, perCoupon(float64(r.Calls), r.Issued),
			perCoupon(float64(r.StripeUpdates), r.Issued), strconv.FormatInt(r.RolledBack, 10), fmtFloat(r.LockWaits, 2),
			strconv.FormatInt(r.Failed, 10), r.Rules})
	}
	return writeRows(w, format, rows, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
}
