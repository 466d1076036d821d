package hotbench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// Changes is the live-changes cell: IssueCoupon on a campaign of 16 budget stripes while an
// operator, at the same round trip, changes it every Every, in turn: a budget raise, a re-stripe
// (16 to 17 stripes, then back), and a pause followed at once by a resume.
type Changes struct {
	Every time.Duration
}

// LiveChanges is the cell of `couponctl bench --changes`: a change every 500 ms.
var LiveChanges = Changes{Every: 500 * time.Millisecond}

// The kinds of change of the live-changes cell, and the requests that overlapped none.
const (
	ChangeRaise   = "budget raise"
	ChangeStripes = "re-stripe"
	ChangePause   = "pause + resume"
	ChangeNone    = "(no change)"
)

// ChangesResult is one live-changes cell.
type ChangesResult struct {
	RTT     time.Duration `json:"rtt_ns"`
	Clients int           `json:"clients"`
	// Kinds has a row per kind of change, then [ChangeNone].
	Kinds []ChangeKind `json:"kinds"`
	// Rules is "held", or the broken rules and mismatches found after the cell.
	Rules string `json:"rules"`
}

// ChangeKind is what one kind of change cost.
type ChangeKind struct {
	Kind string `json:"kind"`
	// Changes is how many were made; CallP50Ms and CallMaxMs are how long one took, from the
	// operator's call to its answer, one round trip included: an upper bound on how long it held
	// the campaign's stripes (it commits in the server as its pipeline ends).
	Changes   int     `json:"changes"`
	CallP50Ms float64 `json:"call_p50_ms"`
	CallMaxMs float64 `json:"call_max_ms"`
	// Requests is the IssueCoupon requests in flight during one of these changes, and P99Ms their
	// 99th percentile latency in milliseconds (for ChangeNone: the requests during no change).
	Requests int     `json:"requests"`
	P99Ms    float64 `json:"p99_ms"`
}

// window is one change as the operator saw it.
type window struct {
	kind       string
	start, end time.Time
}

// timed is one IssueCoupon request: when it was sent, how long it took, what it answered.
type timed struct {
	start   time.Time
	latency time.Duration
	result  string
}

// runChanges runs the live-changes cell at round trip rtt with clients clients.
func (s *session) runChanges(ctx context.Context, rtt time.Duration, clients int) (ChangesResult, error) {
	r := ChangesResult{RTT: rtt, Clients: clients}
	id := fmt.Sprintf("LIVE-%dns-%d", rtt.Nanoseconds(), clients)
	// 1 yen coupons and room for every request and every raise, within PostgreSQL's integer.
	if err := campaign.Create(ctx, s.pool, campaign.Campaign{ID: id, DiscountYen: 1, BudgetYen: 1_000_000_000, Stripes: 16}); err != nil {
		return r, err
	}
	operator, err := pgxpool.New(ctx, s.pgbenchURL) // through the proxy, as the clients
	if err != nil {
		return r, err
	}
	defer operator.Close()
	stop := make(chan struct{})
	var windows []window
	var changeErr error
	var wg sync.WaitGroup
	wg.Go(func() { windows, changeErr = changeEvery(ctx, operator, id, s.cfg.Changes.Every, stop) })
	answers := timedLoop(ctx, s.cfg.Issue, clients, s.cfg.Duration, id)
	close(stop)
	wg.Wait()
	if changeErr != nil {
		return r, changeErr
	}
	r.Kinds = costs(windows, answers)
	var issued int64
	for _, a := range answers {
		if a.result == "ISSUED" {
			issued++
		}
	}
	r.Rules, err = checkRules(ctx, s.pool, id, issued)
	return r, err
}

// changeEvery changes campaign id every every until stop, each kind in turn, and returns the
// changes made.
func changeEvery(ctx context.Context, db *pgxpool.Pool, id string, every time.Duration, stop <-chan struct{}) ([]window, error) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	var windows []window
	for n := 0; ; n++ {
		select {
		case <-stop:
			return windows, nil
		case <-ctx.Done():
			return windows, ctx.Err()
		case <-tick.C:
		}
		w := window{start: time.Now()}
		var err error
		switch n % 3 {
		case 0:
			w.kind = ChangeRaise
			_, err = campaign.Update(ctx, db, id, campaign.Changes{AddBudgetYen: ptr[int64](1000), Reason: "bench"})
		case 1:
			w.kind = ChangeStripes
			_, err = campaign.Update(ctx, db, id, campaign.Changes{Stripes: ptr(17 - (n/3)%2), Reason: "bench"})
		case 2:
			w.kind = ChangePause
			if _, err = campaign.Pause(ctx, db, id, "bench"); err == nil {
				_, err = campaign.Resume(ctx, db, id, "bench")
			}
		}
		if err != nil {
			return windows, fmt.Errorf("%s: %w", w.kind, err)
		}
		w.end = time.Now()
		windows = append(windows, w)
	}
}

func ptr[T any](v T) *T { return &v }

// timedLoop keeps clients requests in flight for d, each for a new member, and returns every
// answer with its timing (a failed request's result is "").
func timedLoop(ctx context.Context, issue IssueFunc, clients int, d time.Duration, campaignID string) []timed {
	var (
		mu  sync.Mutex
		all []timed
		wg  sync.WaitGroup
	)
	stop := time.Now().Add(d)
	for c := range clients {
		wg.Go(func() {
			var mine []timed
			for n := 0; time.Now().Before(stop) && ctx.Err() == nil; n++ {
				a := timed{start: time.Now()}
				res, err := issue(ctx, fmt.Sprintf("l%s-%d-%d", campaignID, c, n), campaignID)
				if err == nil {
					a.result = res
				}
				a.latency = time.Since(a.start)
				mine = append(mine, a)
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all
}

// costs is a row per kind of change: the changes' call times, and the requests in flight during
// them with their p99; then the requests during no change.
func costs(windows []window, answers []timed) []ChangeKind {
	var out []ChangeKind
	during := make([]bool, len(answers))
	for _, kind := range []string{ChangeRaise, ChangeStripes, ChangePause} {
		k := ChangeKind{Kind: kind}
		var calls, lat []time.Duration
		for _, w := range windows {
			if w.kind == kind {
				calls = append(calls, w.end.Sub(w.start))
			}
		}
		for i, a := range answers {
			for _, w := range windows {
				if w.kind == kind && a.start.Before(w.end) && a.start.Add(a.latency).After(w.start) {
					lat = append(lat, a.latency)
					during[i] = true
					break
				}
			}
		}
		k.Changes, k.Requests = len(calls), len(lat)
		k.CallP50Ms, k.P99Ms = percentileMs(calls, 50), percentileMs(lat, 99)
		if len(calls) > 0 {
			k.CallMaxMs = float64(slices.Max(calls)) / float64(time.Millisecond)
		}
		out = append(out, k)
	}
	var quiet []time.Duration
	for i, a := range answers {
		if !during[i] {
			quiet = append(quiet, a.latency)
		}
	}
	return append(out, ChangeKind{Kind: ChangeNone, Requests: len(quiet), P99Ms: percentileMs(quiet, 99)})
}

// writeChanges writes the live-changes cells as a table.
func writeChanges(w io.Writer, format string, cells []ChangesResult) error {
	rows := [][]string{{"rtt", "clients", "change", "changes", "call p50 ms", "call max ms", "requests in flight", "their p99 ms", "rules"}}
	for _, r := range cells {
		for _, k := range r.Kinds {
			rows = append(rows, []string{rttLabel(r.RTT), strconv.Itoa(r.Clients), k.Kind, strconv.Itoa(k.Changes),
				fmtFloat(k.CallP50Ms, 1), fmtFloat(k.CallMaxMs, 1), strconv.Itoa(k.Requests), fmtFloat(k.P99Ms, 1), r.Rules})
		}
	}
	return writeRows(w, format, rows, "|---|---:|---|---:|---:|---:|---:|---:|---|")
}
