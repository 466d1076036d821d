package console

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// bigCampaign is the campaign of [seedMillion]: 1,000,000 coupons of 100 yen over three days.
const (
	bigCampaign = "BIG"
	bigCoupons  = 1_000_000
)

// seedMillion creates bigCampaign with 1,000,000 live coupons issued over the three days before
// now, each with its outbox row, sent, one in ten redeemed, its R1 counter equal to their sum:
// written by SQL as the owner (the page reads them; how they were issued does not matter to it).
func seedMillion(b *testing.B, e *env) {
	b.Helper()
	e.createCampaign(b, campaign.Campaign{ID: bigCampaign, DiscountYen: 100, BudgetYen: 120_000_000})
	exec := func(sql string, args ...any) {
		b.Helper()
		if _, err := e.owner.Exec(context.Background(), sql, args...); err != nil {
			b.Fatal(err)
		}
	}
	exec(`
INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, redeemed_at)
SELECT gen_random_uuid(), $1, 'big' || g, to_char(t AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 100, t, CASE WHEN g % 10 = 0 THEN t END
  FROM generate_series(1, $2::int) g, LATERAL (SELECT now() - make_interval(secs => 3 * 86400.0 * g / $2)) AS x(t)`,
		bigCampaign, bigCoupons)
	exec(`INSERT INTO notification_outbox (coupon_id, member_id, created_at, sent_at)
SELECT coupon_id, member_id, issued_at, issued_at FROM issued_coupons WHERE campaign_id = $1`, bigCampaign)
	exec(`UPDATE campaign_budgets SET issued_yen = $2 WHERE campaign_id = $1`, bigCampaign, 100*bigCoupons)
	exec(`VACUUM ANALYZE issued_coupons, notification_outbox`)
}

// get fetches the console's path as viewer and fails b on anything but 200.
func (e *env) fetch(b testing.TB, c *http.Client, path, assertion string) {
	req, err := http.NewRequest(http.MethodGet, e.console.URL+path, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set(AssertionHeader, assertion)
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, err = io.Copy(io.Discard, resp.Body) // the whole page, or the whole export as it streams
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %s %v", path, resp.Status, err)
	}
}

// BenchmarkPageAtAMillionCoupons is the time of the console's pages over a campaign of
// 1,000,000 coupons: the campaign page (its one scan of the campaign's coupons with their outbox
// rows, for the burn-down and the funnel, with the aggregates' cache emptied before each request,
// and reused as a refresh within aggregateTTL reuses it), its burndown.json, and the list (the
// last 5 minutes' rate and the usage, in one scan of every coupon).
//
//	go test ./console -run '^$' -bench PageAtAMillion -benchtime 20x
func BenchmarkPageAtAMillionCoupons(b *testing.B) {
	e := setup(b, verifiedIAP)
	seedMillion(b, e)
	assertion := e.idp.assertion(b, viewerEmail)
	c := &http.Client{}
	for _, bc := range []struct {
		name, path string
		cached     bool
	}{
		{"campaign/uncached", "/campaigns/" + bigCampaign, false},
		{"campaign/cached", "/campaigns/" + bigCampaign, true},
		{"burndown.json/uncached", "/campaigns/" + bigCampaign + "/burndown.json", false},
		{"list/uncached", "/", false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e.fetch(b, c, bc.path, assertion)
			for b.Loop() {
				if !bc.cached {
					e.srv.reads.forget()
				}
				e.fetch(b, c, bc.path, assertion)
			}
		})
	}
}

// BenchmarkHotLoadBesideAViewer is a hot campaign's IssueCoupon load (8 clients, one new member
// per request, over HTTP) beside the campaign of 1,000,000 coupons, in rounds of 15 s: alone,
// with a viewer refreshing that campaign's page every second (as built: the burn-down's scan
// reused), with that viewer's every refresh scanning (the cache emptied before each), and
// with an export of that campaign always running (its hourly series and the campaign list over
// its three days, back to back, as fast as they come). The four kinds of round alternate, three
// times each, so that whatever else loads the machine
// falls on all three alike; it reports each kind's median p50 and p99 in ms and requests per
// second, and logs every round.
//
//	go test ./console -run '^$' -bench HotLoadBeside -benchtime 1x -v
func BenchmarkHotLoadBesideAViewer(b *testing.B) {
	e := setup(b, verifiedIAP)
	seedMillion(b, e)
	e.createCampaign(b, campaign.Campaign{ID: "HOT", DiscountYen: 1, BudgetYen: 2_000_000_000, Stripes: 8})
	assertion := e.idp.assertion(b, viewerEmail)
	const window = 15 * time.Second
	kinds := []struct {
		name                   string
		viewer, forget, export bool
	}{{"alone", false, false, false}, {"viewer", true, false, false}, {"viewer_uncached", true, true, false},
		{"export", false, false, true}}
	for b.Loop() {
		p50, p99, rate := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
		for round := range 3 {
			for _, k := range kinds {
				stop := make(chan struct{})
				var viewer sync.WaitGroup
				switch {
				case k.viewer:
					viewer.Go(func() { e.refreshEverySecond(b, stop, assertion, k.forget) })
				case k.export:
					viewer.Go(func() { e.exportOverAndOver(b, stop, assertion) })
				}
				lat, n := e.hotLoad(b, fmt.Sprintf("%s%d", k.name, round), 8, window)
				close(stop)
				viewer.Wait()
				ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
				p50[k.name] = append(p50[k.name], ms(percentile(lat, 50)))
				p99[k.name] = append(p99[k.name], ms(percentile(lat, 99)))
				rate[k.name] = append(rate[k.name], float64(n)/window.Seconds())
				b.Logf("round %d %-15s p50 %6.2f ms  p99 %6.2f ms  %6.1f req/s", round+1, k.name,
					ms(percentile(lat, 50)), ms(percentile(lat, 99)), float64(n)/window.Seconds())
			}
		}
		for _, k := range kinds {
			b.ReportMetric(median(p50[k.name]), k.name+"_p50_ms")
			b.ReportMetric(median(p99[k.name]), k.name+"_p99_ms")
			b.ReportMetric(median(rate[k.name]), k.name+"_req/s")
		}
	}
}

// exportOverAndOver downloads the big campaign's hourly series and the campaign list over its
// three days, one after the other, until stop: an export always running beside the load.
func (e *env) exportOverAndOver(b *testing.B, stop chan struct{}, assertion string) {
	c := &http.Client{}
	today := time.Now().In(tokyo)
	list := fmt.Sprintf("/exports/campaigns.csv?from=%s&to=%s", today.AddDate(0, 0, -3).Format(time.DateOnly), today.Format(time.DateOnly))
	for {
		for _, path := range []string{"/campaigns/" + bigCampaign + "/series.csv?step=hour", list} {
			e.fetch(b, c, path, assertion)
		}
		select {
		case <-stop:
			return
		default:
		}
	}
}

// refreshEverySecond GETs the big campaign's page every second until stop, emptying the
// aggregates' cache before each when forget.
func (e *env) refreshEverySecond(b *testing.B, stop chan struct{}, assertion string, forget bool) {
	c := &http.Client{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if forget {
			e.srv.reads.forget()
		}
		e.fetch(b, c, "/campaigns/"+bigCampaign, assertion)
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// hotLoad runs clients asking for HOT for new members (prefix, a counter) for d, and returns
// every request's latency. Every answer must be ISSUED.
func (e *env) hotLoad(b *testing.B, prefix string, clients int, d time.Duration) ([]time.Duration, int) {
	var mu sync.Mutex
	var all []time.Duration
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			var mine []time.Duration
			for i := 0; time.Now().Before(end); i++ {
				start := time.Now()
				r, _, err := e.ask(fmt.Sprintf("%s-%d-%d", prefix, w, i), "HOT")
				mine = append(mine, time.Since(start))
				if err != nil || r != "ISSUED" {
					b.Errorf("IssueCoupon: %s %v", r, err)
					return
				}
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all, len(all)
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// forget empties the cache: the next read of each aggregate scans.
func (r *reads) forget() {
	r.mu.Lock()
	r.cache = nil
	r.mu.Unlock()
}
