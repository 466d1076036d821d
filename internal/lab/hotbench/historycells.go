package hotbench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/shared/issuance"
)

// The cells of a history bench.
const (
	HistoryHot  = "hot campaign, 16 stripes"
	HistoryCold = "cold mix"
)

// HistoryBench measures the issuance on an empty database against one holding a history
// ([BuildHistory]), in alternating turns (empty, history, empty, history...), both databases
// ANALYZEd before each turn: in each turn a
// hot campaign of 16 stripes, then a cold mix of [ColdCampaigns] campaigns of one stripe, each
// for Duration (after a turn 0 of at most 5 s a cell, unreported, that warms both up) with
// Clients clients in a closed loop calling issuance.Service (coalescing as
// ISSUE_BATCH_MAX says) straight on a pool of Clients connections. Every request is a member of
// the history drawn without repeat (on the empty database too), so the history's members'
// coupons and usage rows are the ones the cells read and write.
type HistoryBench struct {
	Empty, Full string // the databases: migrated, and migrated with the history
	History     History
	Clients     int
	Duration    time.Duration
	Turns       int
	Progress    io.Writer
}

// ColdCampaigns is the cold mix's campaigns: each request goes to one of them at random.
const ColdCampaigns = 200

// HistoryTurn is one cell of one turn.
type HistoryTurn struct {
	DB     string  `json:"db"` // "empty" or "history"
	Cell   string  `json:"cell"`
	Turn   int     `json:"turn"`
	Issued int64   `json:"issued"`
	Failed int64   `json:"failed"`
	Rate   float64 `json:"rate"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	// Calls is the issue_coupons_batch_v3 calls of the cell (pg_stat_statements; 0 without
	// it); ReadPerCall and DirtiedPerCall its shared blocks read from outside shared_buffers
	// and dirtied, per call.
	Calls          int64   `json:"calls"`
	ReadPerCall    float64 `json:"blks_read_per_call"`
	DirtiedPerCall float64 `json:"blks_dirtied_per_call"`
	MsPerCall      float64 `json:"exec_ms_per_call"`
	Load1          float64 `json:"load1"`
	Rules          string  `json:"rules"`
}

// Run runs b's turns and returns every cell in run order.
func (b HistoryBench) Run(ctx context.Context) ([]HistoryTurn, error) {
	cfg, err := issuance.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	dbs := []struct{ name, url string }{{"empty", b.Empty}, {"history", b.Full}}
	svcs := make([]*issuance.Service, len(dbs))
	pools := make([]*pgxpool.Pool, len(dbs))
	defer func() {
		for _, p := range pools {
			if p != nil {
				p.Close()
			}
		}
	}()
	for i, d := range dbs {
		pc, err := pgxpool.ParseConfig(d.url)
		if err != nil {
			return nil, err
		}
		pc.MaxConns = int32(b.Clients) + 2
		if pools[i], err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return nil, err
		}
		if _, err := pools[i].Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			fmt.Fprintf(b.progressOut(), "history bench: no pg_stat_statements (%v): blocks per call not measured\n", err)
		}
		if svcs[i], err = issuance.New(pools[i], cfg); err != nil {
			return nil, err
		}
	}
	draw := &memberDraw{members: b.History.Members(), next: rand.Int64N(max(1, b.History.Members()))}
	var out []HistoryTurn
	for turn := 0; turn <= b.Turns; turn++ { // turn 0 warms both databases up, unreported
		if err := analyzeAll(ctx, pools); err != nil {
			return out, err
		}
		for i, db := range dbs {
			for _, cell := range []string{HistoryHot, HistoryCold} {
				d := b.Duration
				if turn == 0 {
					d = min(d, 5*time.Second)
				}
				r, err := b.cell(ctx, pools[i], svcs[i], draw, cell, turn, d)
				if err != nil {
					return out, fmt.Errorf("hotbench: %s on the %s database, turn %d: %w", cell, db.name, turn, err)
				}
				r.DB = db.name
				if turn == 0 {
					continue
				}
				out = append(out, r)
				fmt.Fprintf(b.progressOut(), "history bench turn %d/%d, %s database, %s: %.0f/s, p50 %.1f ms, p99 %.1f ms, %.2f blocks read and %.2f dirtied per call, load %.2f, rules %s\n",
					turn, b.Turns, db.name, cell, r.Rate, r.P50Ms, r.P99Ms, r.ReadPerCall, r.DirtiedPerCall, r.Load1, r.Rules)
			}
		}
	}
	return out, nil
}

// analyzeAll ANALYZEs each pool's database, so that each turn's plans come from fresh statistics
// on both: the history was analyzed as it was built, and the empty database's tables, grown by
// the turns before, would otherwise keep the plans of empty tables (which slowed it turn after
// turn, 5.8 to 10 ms a call at N=200,000, the history's 1.2 ms).
func analyzeAll(ctx context.Context, pools []*pgxpool.Pool) error {
	for _, p := range pools {
		if _, err := p.Exec(ctx, "ANALYZE"); err != nil {
			return fmt.Errorf("hotbench: ANALYZE before a turn: %w", err)
		}
	}
	return nil
}

func (b HistoryBench) progressOut() io.Writer {
	if b.Progress == nil {
		return io.Discard
	}
	return b.Progress
}

// memberDraw hands out the history's members without repeat: the i-th draw is member
// (next+i)*p mod members, p a prime above any member count.
type memberDraw struct {
	members int64
	next    int64
	mu      sync.Mutex
}

func (d *memberDraw) member() string {
	d.mu.Lock()
	i := d.next
	d.next++
	d.mu.Unlock()
	return fmt.Sprintf("hm%d", (i%d.members)*4294967291%d.members)
}

// cell runs one cell on pool's database through svc: its campaigns, the closed loop, the
// statement statistics around it, and the count of its coupons against its ISSUED answers.
func (b HistoryBench) cell(ctx context.Context, pool *pgxpool.Pool, svc *issuance.Service, draw *memberDraw, cell string, turn int, d time.Duration) (HistoryTurn, error) {
	r := HistoryTurn{Cell: cell, Turn: turn}
	prefix := fmt.Sprintf("HB-%d-%d-%s", os.Getpid(), turn, map[string]string{HistoryHot: "hot", HistoryCold: "cold"}[cell])
	ids := []string{prefix}
	stripes := 16
	if cell == HistoryCold {
		ids, stripes = make([]string, ColdCampaigns), 1
		for i := range ids {
			ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		}
	}
	for _, id := range ids {
		if err := campaign.Create(ctx, pool, campaign.Campaign{ID: id, DiscountYen: 1, BudgetYen: math.MaxInt32, Stripes: stripes}); err != nil {
			return r, err
		}
	}
	before, err := readStatements(ctx, pool)
	if err != nil {
		return r, err
	}
	lat, failed, wall := historyLoop(ctx, svc, b.Clients, d, ids, draw)
	if err := ctx.Err(); err != nil {
		return r, err
	}
	after, err := readStatements(ctx, pool)
	if err != nil {
		return r, err
	}
	r.Issued, r.Failed = int64(len(lat)), failed
	r.Rate = float64(r.Issued) / wall.Seconds()
	r.P50Ms, r.P99Ms = percentileMs(lat, 50), percentileMs(lat, 99)
	if r.Calls = after.calls - before.calls; r.Calls > 0 {
		n := float64(r.Calls)
		r.ReadPerCall, r.DirtiedPerCall = float64(after.read-before.read)/n, float64(after.dirtied-before.dirtied)/n
		r.MsPerCall = (after.ms - before.ms) / n
	}
	r.Load1 = load1()
	var coupons int64
	// A campaign at a time, through R2's partial index (whose predicate every coupon of a cell
	// meets: none is reissued or legacy): one count over the cold mix's 200 campaigns was planned
	// as a scan of the whole history, 20M rows read after each cell.
	if err := pool.QueryRow(ctx, `SELECT sum((SELECT count(*) FROM issued_coupons c
                    WHERE c.campaign_id = id AND NOT c.legacy_duplicate AND NOT c.reissue_allowed))::bigint
  FROM unnest($1::text[]) id`, ids).Scan(&coupons); err != nil {
		return r, err
	}
	r.Rules = "held"
	if coupons != r.Issued {
		r.Rules = fmt.Sprintf("%d coupons for %d ISSUED", coupons, r.Issued)
	}
	return r, nil
}

// historyLoop keeps clients requests in flight for d, each for a new member of draw and one of
// campaigns at random, and returns the ISSUED answers' latencies, the other answers and errors,
// and the wall time.
func historyLoop(ctx context.Context, svc *issuance.Service, clients int, d time.Duration, campaigns []string, draw *memberDraw) ([]time.Duration, int64, time.Duration) {
	lat, failed, wall, _ := clientLoop(ctx, clients, d, func(ctx context.Context) bool {
		out, err := svc.Issue(ctx, draw.member(), campaigns[rand.IntN(len(campaigns))])
		return err == nil && out.Result == issuance.ResultIssued
	})
	return lat, failed, wall
}

type statements struct {
	calls, read, dirtied int64
	ms                   float64
}

// readStatements sums pg_stat_statements over the database's issue_coupons_batch_v3 calls; all
// zero without the extension.
func readStatements(ctx context.Context, pool *pgxpool.Pool) (statements, error) {
	var s statements
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('pg_stat_statements') IS NOT NULL`).Scan(&ok); err != nil || !ok {
		return s, err
	}
	err := pool.QueryRow(ctx, `
SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(shared_blks_read), 0)::bigint, coalesce(sum(shared_blks_dirtied), 0)::bigint,
       coalesce(sum(total_exec_time), 0)::float8
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE '%issue_coupons_batch_v3(%'`).Scan(
		&s.calls, &s.read, &s.dirtied, &s.ms)
	return s, err
}

// load1 is the machine's 1-minute load average (0 when /proc/loadavg cannot be read).
func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	_, _ = fmt.Sscanf(string(b), "%f", &l)
	return l
}

// WriteHistoryTable writes every turn, then per cell the medians on each database, the spread
// over the turns, and the history's median over the empty's.
func WriteHistoryTable(w io.Writer, turns []HistoryTurn) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "turn\tdatabase\tcell\tissued/s\tp50 ms\tp99 ms\tcalls\tblks read/call\tdirtied/call\texec ms/call\tload\tfailed\trules\t")
	for _, t := range turns {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.0f\t%.1f\t%.1f\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%s\t\n", t.Turn, t.DB, t.Cell, t.Rate, t.P50Ms, t.P99Ms,
			t.Calls, t.ReadPerCall, t.DirtiedPerCall, t.MsPerCall, t.Load1, t.Failed, t.Rules)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "cell\tdatabase\tissued/s median (min-max)\tp99 ms median (min-max)\tblks read/call\tdirtied/call\trate ratio\tp99 ratio\t")
	for _, cell := range []string{HistoryHot, HistoryCold} {
		var base [2]float64
		for _, db := range []string{"empty", "history"} {
			rate, p99 := pick(turns, cell, db, func(t HistoryTurn) float64 { return t.Rate }), pick(turns, cell, db, func(t HistoryTurn) float64 { return t.P99Ms })
			read, dirt := pick(turns, cell, db, func(t HistoryTurn) float64 { return t.ReadPerCall }), pick(turns, cell, db, func(t HistoryTurn) float64 { return t.DirtiedPerCall })
			ratio := "1.00\t1.00"
			if db == "empty" {
				base = [2]float64{median(rate), median(p99)}
			} else {
				ratio = fmt.Sprintf("%.2f\t%.2f", median(rate)/base[0], median(p99)/base[1])
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%.2f\t%s\t\n", cell, db, spread(rate, 0), spread(p99, 1), median(read), median(dirt), ratio)
		}
	}
	return tw.Flush()
}

func pick(turns []HistoryTurn, cell, db string, f func(HistoryTurn) float64) []float64 {
	var out []float64
	for _, t := range turns {
		if t.Cell == cell && t.DB == db {
			out = append(out, f(t))
		}
	}
	return out
}

// spread is "median (min-max)" of xs with prec decimals.
func spread(xs []float64, prec int) string {
	if len(xs) == 0 {
		return "-"
	}
	return fmt.Sprintf("%s (%s-%s)", fmtFloat(median(xs), prec), fmtFloat(slices.Min(xs), prec), fmtFloat(slices.Max(xs), prec))
}
