package hotbench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/time/rate"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// DryRunHerd is the dry-run cell: IssueCoupon on a campaign of 16 stripes for Config.Duration
// at the cell's clients, alone, then beside Herd more clients asking IssueCoupon's dry run
// (Config.DryRun) of the same campaign, each for a new member; Rounds times each, in turns, so
// that the machine's other load falls on both alike, a new campaign each turn. The herd asks
// PerIssue dry runs for each coupon the load issued a second alone (the median of the turns so
// far), or, PerIssue 0, each client its next as soon as the last is answered. Issue 33: the herd
// of dry runs must not lower the issuance's rate by more than 10%.
type DryRunHerd struct {
	Herd, Rounds int
	PerIssue     float64
}

// ButtonHerd is the cell of `couponctl bench --dry-runs`: 64 clients asking the app's button (its
// dry run) beside the load, one dry run per coupon issued (each member looks before tapping),
// three turns each.
var ButtonHerd = DryRunHerd{Herd: 64, Rounds: 3, PerIssue: 1}

// DryRunResult is one dry-run cell.
type DryRunResult struct {
	RTT     time.Duration `json:"rtt_ns"`
	Clients int           `json:"clients"`
	Herd    int           `json:"herd"`
	// Alone and Beside are the ISSUED answers per second of each turn, without and with the
	// dry runs; Ratio is Beside's median over Alone's.
	Alone  []float64 `json:"alone_per_s"`
	Beside []float64 `json:"beside_per_s"`
	Ratio  float64   `json:"ratio"`
	// DryRunsPerSec is the dry runs answered AVAILABLE per second beside the load, all turns;
	// DryP99Ms their 99th percentile latency; DryFailed those answered otherwise or not at all.
	DryRunsPerSec float64 `json:"dry_runs_per_s"`
	DryP99Ms      float64 `json:"dry_p99_ms"`
	DryFailed     int64   `json:"dry_failed"`
	// Failed is the issuance's requests answered other than ISSUED or without an answer.
	Failed int64 `json:"failed"`
	// Where the CPU went, in core-milliseconds (0 without Config.ServerCPU): PGPerCoupon is the
	// database server's per coupon issued alone (all turns); PGPerDryRun its CPU beside the load
	// less the coupons beside at PGPerCoupon, per dry run; PGHerdShare that part of its CPU
	// beside. ProcPerCoupon and ProcPerDryRun are the same for this process (the clients, the
	// latency proxy and IssueCoupon), from getrusage(2).
	PGPerCoupon   float64 `json:"pg_cpu_ms_per_coupon"`
	PGPerDryRun   float64 `json:"pg_cpu_ms_per_dry_run"`
	PGHerdShare   float64 `json:"pg_herd_share"`
	ProcPerCoupon float64 `json:"proc_cpu_ms_per_coupon"`
	ProcPerDryRun float64 `json:"proc_cpu_ms_per_dry_run"`
	// PGAlone and PGBeside are the database server's core-ms per coupon in each turn alone and
	// beside the herd (empty without Config.ServerCPU); ReplicaPerDryRun is the replica's
	// core-ms per dry run beside (Config.ReplicaCPU; 0 without it).
	PGAlone          []float64 `json:"pg_cpu_ms_per_coupon_alone_turns"`
	PGBeside         []float64 `json:"pg_cpu_ms_per_coupon_beside_turns"`
	ReplicaPerDryRun float64   `json:"replica_cpu_ms_per_dry_run"`
	// Rules is "held", or the broken rules and mismatches found after the cell.
	Rules string `json:"rules"`
}

// runDryRuns runs the dry-run cell at round trip rtt (set on the proxy) with clients clients.
func (s *session) runDryRuns(ctx context.Context, rtt time.Duration, clients int) (DryRunResult, error) {
	dh := s.cfg.DryRuns
	r := DryRunResult{RTT: rtt, Clients: clients, Herd: dh.Herd}
	var alone, beside dryTurn // all turns of each kind, summed
	var dryLat []time.Duration
	var wrong []string
	for round := range dh.Rounds {
		for _, besides := range []bool{false, true} {
			// A campaign a turn: its members are new (closedLoop numbers them from 1).
			id := fmt.Sprintf("DRY-%dns-%d-%d-%t", rtt.Nanoseconds(), clients, round, besides)
			var herdRate float64
			if besides {
				herdRate = dh.PerIssue * median(r.Alone)
			}
			t, lat, err := s.dryTurn(ctx, id, clients, herdRate, besides)
			if err != nil {
				return r, err
			}
			if t.rules != "held" {
				wrong = append(wrong, t.rules)
			}
			r.Failed += t.failed
			perSec := float64(t.issued) / t.wall.Seconds()
			r.addTurnCPU(t, besides)
			if besides {
				r.Beside = append(r.Beside, perSec)
				dryLat = append(dryLat, lat...)
				r.DryFailed += t.dryFailed
				beside.add(t)
			} else {
				r.Alone = append(r.Alone, perSec)
				alone.add(t)
			}
		}
	}
	if a := median(r.Alone); a > 0 {
		r.Ratio = median(r.Beside) / a
	}
	r.DryRunsPerSec = float64(len(dryLat)) / beside.wall.Seconds()
	r.DryP99Ms = percentileMs(dryLat, 99)
	r.cpuSplit(alone, beside, len(dryLat))
	r.Rules = "held"
	if len(wrong) > 0 {
		r.Rules = strings.Join(wrong, "; ")
	}
	return r, nil
}

// dryTurn is one turn of the dry-run cell, or the sum of several: the coupons issued, the
// issuance's failed requests, the dry runs answered otherwise than AVAILABLE, the turn's
// length, the CPU the database server and this process used meanwhile (core-milliseconds), and
// the rules' check.
type dryTurn struct {
	issued, failed, dryFailed int64
	wall                      time.Duration
	pgMs, procMs, replicaMs   float64
	rules                     string
}

func (t *dryTurn) add(o dryTurn) {
	t.issued += o.issued
	t.failed += o.failed
	t.dryFailed += o.dryFailed
	t.wall += o.wall
	t.pgMs += o.pgMs
	t.procMs += o.procMs
	t.replicaMs += o.replicaMs
}

// dryTurn runs one turn on a new campaign id: the load of clients clients, beside a herd of dry
// runs at herdRate a second (unlimited at 0) when beside, and returns it with the latencies of the
// dry runs answered AVAILABLE.
func (s *session) dryTurn(ctx context.Context, id string, clients int, herdRate float64, beside bool) (dryTurn, []time.Duration, error) {
	var t dryTurn
	if err := campaign.Create(ctx, s.pool, benchCampaign(id, 16)); err != nil {
		return t, nil, err
	}
	stop := make(chan struct{})
	var herd sync.WaitGroup
	var lat []time.Duration
	if beside {
		limit := rate.NewLimiter(rate.Inf, 0)
		if herdRate > 0 {
			limit = rate.NewLimiter(rate.Limit(herdRate), 1)
		}
		herd.Go(func() { lat, t.dryFailed = dryRunLoop(ctx, s.cfg.DryRun, s.cfg.DryRuns.Herd, id, limit, stop) })
	}
	var done []time.Duration
	proc0, err := processCPU()
	if err != nil {
		return t, nil, err
	}
	var pgMs float64
	t.replicaMs, err = s.replicaCPU(func() (err error) {
		pgMs, err = s.serverCPU(func() (err error) {
			done, t.failed, t.wall, err = closedLoop(ctx, s.cfg.Issue, clients, s.cfg.Duration, id)
			return err
		})
		return err
	})
	proc1, perr := processCPU()
	close(stop)
	herd.Wait()
	if err = cmp.Or(err, perr); err != nil {
		return t, nil, err
	}
	t.procMs = float64(proc1-proc0) / float64(time.Millisecond)
	t.issued, t.pgMs = int64(len(done)), pgMs
	t.rules, err = checkRules(ctx, s.pool, id, t.issued)
	return t, lat, err
}

// cpuSplit sets r's CPU figures from the turns alone and beside, summed, and the dry runs
// answered beside. The dry runs' part of a server's CPU beside is what it used less the coupons
// beside at the cost of a coupon alone.
func (r *DryRunResult) cpuSplit(alone, beside dryTurn, dryRuns int) {
	if alone.issued == 0 || dryRuns == 0 {
		return
	}
	r.PGPerCoupon = alone.pgMs / float64(alone.issued)
	r.ProcPerCoupon = alone.procMs / float64(alone.issued)
	herdPG := beside.pgMs - float64(beside.issued)*r.PGPerCoupon
	r.PGPerDryRun = herdPG / float64(dryRuns)
	r.ProcPerDryRun = (beside.procMs - float64(beside.issued)*r.ProcPerCoupon) / float64(dryRuns)
	if beside.pgMs > 0 {
		r.PGHerdShare = herdPG / beside.pgMs
	}
	r.ReplicaPerDryRun = beside.replicaMs / float64(dryRuns)
}

// processCPU is the CPU this process has used so far, user and system (getrusage(2)).
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// dryRunLoop keeps up to clients dry runs of campaignID in flight, each for a new member, each
// sent when limit allows, until stop (see [herdLoop]), and returns the latencies of the
// AVAILABLE answers and the count of the others.
func dryRunLoop(ctx context.Context, dryRun IssueFunc, clients int, campaignID string, limit *rate.Limiter,
	stop <-chan struct{}) ([]time.Duration, int64) {
	var members atomic.Int64
	return herdLoop(ctx, clients, limit, stop, func() (bool, bool) {
		res, err := dryRun(ctx, fmt.Sprintf("d%s-%d", campaignID, members.Add(1)), campaignID)
		return err == nil && res == "AVAILABLE", true
	})
}

// herdLoop runs clients clients beside a cell's load, each sending one request after another
// with send when limit allows, until stop or send says there is nothing more to send, and returns
// the latencies of the requests send says succeeded and the count of the others. A client waiting
// for its turn at stop sends nothing: the limiter's wait ends at stop too, so no request is sent
// after the load it is measured beside.
func herdLoop(ctx context.Context, clients int, limit *rate.Limiter, stop <-chan struct{}, send func() (ok, more bool)) ([]time.Duration, int64) {
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-waitCtx.Done():
		}
	}()
	var (
		mu     sync.Mutex
		lat    []time.Duration
		failed atomic.Int64
		wg     sync.WaitGroup
	)
	for range clients {
		wg.Go(func() {
			var mine []time.Duration
			for limit.Wait(waitCtx) == nil {
				t0 := time.Now()
				ok, more := send()
				if !more {
					break
				}
				if !ok {
					failed.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return lat, failed.Load()
}

// median is the middle of rates (the mean of the middle two for an even count); 0 for none.
func median(rates []float64) float64 {
	if len(rates) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(rates))
	return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
}

// writeDryRuns writes the dry-run cells, if any, as a table after a blank line; with serverCPU,
// where the CPU went (DryRunResult's CPU figures).
func writeDryRuns(w io.Writer, format string, serverCPU bool, cells []DryRunResult) error {
	if len(cells) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	rows := [][]string{{"rtt", "clients", "dry-run clients", "issued/s alone", "issued/s beside", "beside / alone",
		"dry runs/s", "dry run p99 ms", "failed", "dry runs failed", "rules"}}
	align := "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
	if serverCPU {
		rows[0] = append(rows[0], "PG core-ms per coupon alone", "PG core-ms per dry run", "herd's share of PG CPU beside",
			"bench process core-ms per coupon alone", "per dry run")
		align += "---:|---:|---:|---:|---:|"
	}
	for _, r := range cells {
		row := []string{rttLabel(r.RTT), strconv.Itoa(r.Clients), strconv.Itoa(r.Herd), rateList(r.Alone), rateList(r.Beside),
			fmtFloat(r.Ratio, 2), fmtFloat(r.DryRunsPerSec, 0), fmtFloat(r.DryP99Ms, 1), strconv.FormatInt(r.Failed, 10),
			strconv.FormatInt(r.DryFailed, 10), r.Rules}
		if serverCPU {
			row = append(row, fmtFloat(r.PGPerCoupon, 3), fmtFloat(r.PGPerDryRun, 3), fmtFloat(100*r.PGHerdShare, 0)+"%",
				fmtFloat(r.ProcPerCoupon, 3), fmtFloat(r.ProcPerDryRun, 3))
		}
		rows = append(rows, row)
	}
	return writeRows(w, format, rows, align)
}

// rateList is rates per second as whole numbers in brackets, "[717 773 739]": the turns of a
// dry-run cell, in the table and the progress line alike.
func rateList(rates []float64) string {
	out := make([]string, len(rates))
	for i, r := range rates {
		out[i] = fmtFloat(r, 0)
	}
	return fmt.Sprint(out)
}
