package hotbench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	// Rules is "held", or the broken rules and mismatches found after the cell.
	Rules string `json:"rules"`
}

// runDryRuns runs the dry-run cell at round trip rtt (set on the proxy) with clients clients.
func (s *session) runDryRuns(ctx context.Context, rtt time.Duration, clients int) (DryRunResult, error) {
	dh := s.cfg.DryRuns
	r := DryRunResult{RTT: rtt, Clients: clients, Herd: dh.Herd}
	var dryLat []time.Duration
	var dryWall time.Duration
	var wrong []string
	for round := range dh.Rounds {
		for _, beside := range []bool{false, true} {
			// A campaign a turn: its members are new (closedLoop numbers them from 1).
			id := fmt.Sprintf("DRY-%dns-%d-%d-%t", rtt.Nanoseconds(), clients, round, beside)
			if err := campaign.Create(ctx, s.pool, benchCampaign(id, 16)); err != nil {
				return r, err
			}
			stop := make(chan struct{})
			var herd sync.WaitGroup
			var lat []time.Duration
			var failed int64
			if beside {
				limit := rate.NewLimiter(rate.Inf, 0)
				if dh.PerIssue > 0 {
					limit = rate.NewLimiter(rate.Limit(dh.PerIssue*median(r.Alone)), 1)
				}
				herd.Go(func() { lat, failed = dryRunLoop(ctx, s.cfg.DryRun, dh.Herd, id, limit, stop) })
			}
			done, miss, wall, err := closedLoop(ctx, s.cfg.Issue, clients, s.cfg.Duration, id)
			close(stop)
			herd.Wait()
			if err != nil {
				return r, err
			}
			r.Failed += miss
			rules, err := checkRules(ctx, s.pool, id, int64(len(done)))
			if err != nil {
				return r, err
			}
			if rules != "held" {
				wrong = append(wrong, rules)
			}
			rate := float64(len(done)) / wall.Seconds()
			if beside {
				r.Beside = append(r.Beside, rate)
				dryLat = append(dryLat, lat...)
				dryWall += wall
				r.DryFailed += failed
			} else {
				r.Alone = append(r.Alone, rate)
			}
		}
	}
	if a := median(r.Alone); a > 0 {
		r.Ratio = median(r.Beside) / a
	}
	r.DryRunsPerSec = float64(len(dryLat)) / dryWall.Seconds()
	r.DryP99Ms = percentileMs(dryLat, 99)
	r.Rules = "held"
	if len(wrong) > 0 {
		r.Rules = strings.Join(wrong, "; ")
	}
	return r, nil
}

// dryRunLoop keeps up to clients dry runs of campaignID in flight, each for a new member, each
// sent when limit allows, until stop, and returns the latencies of the AVAILABLE answers and the
// count of the others.
func dryRunLoop(ctx context.Context, dryRun IssueFunc, clients int, campaignID string, limit *rate.Limiter,
	stop <-chan struct{}) ([]time.Duration, int64) {
	var (
		mu      sync.Mutex
		lat     []time.Duration
		failed  atomic.Int64
		members atomic.Int64
		wg      sync.WaitGroup
	)
	for range clients {
		wg.Go(func() {
			var mine []time.Duration
			for ctx.Err() == nil {
				select {
				case <-stop:
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
					return
				default:
				}
				if limit.Wait(ctx) != nil {
					continue
				}
				t0 := time.Now()
				res, err := dryRun(ctx, fmt.Sprintf("d%s-%d", campaignID, members.Add(1)), campaignID)
				if err != nil || res != "AVAILABLE" {
					failed.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
			}
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

// writeDryRuns writes the dry-run cells, if any, as a table after a blank line.
func writeDryRuns(w io.Writer, format string, cells []DryRunResult) error {
	if len(cells) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	rows := [][]string{{"rtt", "clients", "dry-run clients", "issued/s alone", "issued/s beside", "beside / alone",
		"dry runs/s", "dry run p99 ms", "failed", "dry runs failed", "rules"}}
	list := func(rates []float64) string {
		var out []string
		for _, r := range rates {
			out = append(out, fmtFloat(r, 0))
		}
		return fmt.Sprint(out)
	}
	for _, r := range cells {
		rows = append(rows, []string{rttLabel(r.RTT), strconv.Itoa(r.Clients), strconv.Itoa(r.Herd), list(r.Alone), list(r.Beside),
			fmtFloat(r.Ratio, 2), fmtFloat(r.DryRunsPerSec, 0), fmtFloat(r.DryP99Ms, 1), strconv.FormatInt(r.Failed, 10),
			strconv.FormatInt(r.DryFailed, 10), r.Rules})
	}
	return writeRows(w, format, rows, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
}
