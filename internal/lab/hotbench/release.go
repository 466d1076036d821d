package hotbench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"
)

// ReleaseHerd is the release-herd cell: a campaign of Coupons coupons of 1 yen on Stripes budget
// stripes, all released at one instant Lead after the campaign is made (the database's clock),
// and the cell's clients tapping through IssueCoupon from the campaign's making, each request a
// new member, until Window after the release: the herd at 10:00:00 of a daily release.
type ReleaseHerd struct {
	Coupons, Stripes int
	Lead, Window     time.Duration
}

// TenOClock is the cell of `couponctl bench --release-herd`: 300 coupons on 16 stripes (a release
// the herd takes inside its first second on the 2-core machine, so that the second also holds
// its refusals), released 2 s after the herd starts, its first second measured.
var TenOClock = ReleaseHerd{Coupons: 300, Stripes: 16, Lead: 2 * time.Second, Window: time.Second}

// ReleaseResult is one release-herd cell. Its window is [the release's instant, the instant plus
// ReleaseHerd.Window), on the database's clock; the bench's answers are placed on it by the
// offset between the two clocks read before the cell (one direct round trip: off by at most
// half of it).
type ReleaseResult struct {
	RTT     time.Duration `json:"rtt_ns"`
	Clients int           `json:"clients"`
	Coupons int           `json:"coupons"`
	// Issued is the coupons whose issue time (issued_at, the database's clock as the issuance
	// read it) is in the window; IssuedAll is the coupons of the cell in all.
	Issued    int64 `json:"issued"`
	IssuedAll int64 `json:"issued_all"`
	// Sent is the requests sent in the window; Refused is those answered BUDGET_EXCEEDED or
	// CAMPAIGN_NOT_ACTIVE, Failed those answered otherwise than ISSUED or without an answer.
	Sent    int64 `json:"sent"`
	Refused int64 `json:"refused"`
	Failed  int64 `json:"failed"`
	// P50Ms and P99Ms are the latencies of the requests sent in the window, every answer; Before99Ms
	// is the p99 of those sent before the release (answered NOT_STARTED).
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	Before99Ms float64 `json:"before_p99_ms"`
	// Rules is "held", or the broken rules and mismatches found after the cell: a coupon issued
	// before the release is one.
	Rules string `json:"rules"`
}

// runRelease runs the release-herd cell at round trip rtt (set on the proxy) with clients clients.
func (s *session) runRelease(ctx context.Context, rtt time.Duration, clients int) (ReleaseResult, error) {
	rh := s.cfg.Release
	r := ReleaseResult{RTT: rtt, Clients: clients, Coupons: rh.Coupons}
	id := fmt.Sprintf("TEN-%dns-%d", rtt.Nanoseconds(), clients)
	if _, err := s.pool.Exec(ctx, `SELECT count(*) FROM campaign_create($1, 1, $2, $3, NULL, NULL, NULL, NULL, 'bench',
		ARRAY[clock_timestamp() + $4::interval], ARRAY[$2::integer], false)`, id, rh.Coupons, rh.Stripes, rh.Lead.String()); err != nil {
		return r, err
	}
	var at, dbNow time.Time
	t0 := time.Now()
	if err := s.pool.QueryRow(ctx, `SELECT at, clock_timestamp() FROM campaign_releases WHERE campaign_id = $1`, id).Scan(&at, &dbNow); err != nil {
		return r, err
	}
	// The release's instant on this clock: the database's clock read half a round trip after t0.
	localAt := at.Add(-dbNow.Sub(t0.Add(time.Since(t0) / 2)))
	answers := timedLoop(ctx, s.cfg.Issue, clients, time.Until(localAt.Add(rh.Window)), id)
	var in, before []time.Duration
	var issued int64
	for _, a := range answers {
		if a.result == "ISSUED" {
			issued++
		}
		switch {
		case a.start.Before(localAt):
			before = append(before, a.latency)
			continue
		case !a.start.Before(localAt.Add(rh.Window)):
			continue
		}
		r.Sent++
		in = append(in, a.latency)
		switch a.result {
		case "ISSUED":
		case "BUDGET_EXCEEDED", "CAMPAIGN_NOT_ACTIVE":
			r.Refused++
		default:
			r.Failed++
		}
	}
	r.P50Ms, r.P99Ms, r.Before99Ms = percentileMs(in, 50), percentileMs(in, 99), percentileMs(before, 99)
	var early int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE issued_at >= $2 AND issued_at < $3), count(*) FILTER (WHERE issued_at < $2),
		count(*) FROM issued_coupons WHERE campaign_id = $1`, id, at, at.Add(rh.Window)).Scan(&r.Issued, &early, &r.IssuedAll); err != nil {
		return r, err
	}
	var wrong []string
	if early > 0 {
		wrong = append(wrong, fmt.Sprintf("%d coupons issued before the release", early))
	}
	var err error
	r.Rules, err = checkRules(ctx, s.pool, id, issued, wrong...)
	return r, err
}

// writeRelease writes the release-herd cells, if any, as a table after a blank line.
func writeRelease(w io.Writer, format string, cells []ReleaseResult) error {
	if len(cells) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	rows := [][]string{{"rtt", "clients", "released", "issued in window", "issued in all", "sent in window", "refused",
		"failed", "p50 ms", "p99 ms", "p99 ms before", "rules"}}
	for _, r := range cells {
		rows = append(rows, []string{rttLabel(r.RTT), strconv.Itoa(r.Clients), strconv.Itoa(r.Coupons),
			strconv.FormatInt(r.Issued, 10), strconv.FormatInt(r.IssuedAll, 10), strconv.FormatInt(r.Sent, 10),
			strconv.FormatInt(r.Refused, 10), strconv.FormatInt(r.Failed, 10), fmtFloat(r.P50Ms, 1), fmtFloat(r.P99Ms, 1),
			fmtFloat(r.Before99Ms, 1), r.Rules})
	}
	return writeRows(w, format, rows, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
}
