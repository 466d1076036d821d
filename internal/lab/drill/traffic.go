package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/mops/coupon-api/internal/lab/answerlog"
	"github.com/mops/coupon-api/internal/lab/audit"
	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/shared/issuance"
)

// campaigns are the drill's campaigns, 1,000 yen coupons as in the Silver Week scenario
// (docs/api.md): DR-A's 100,000 yen sell out within the first seconds (BUDGET_EXCEEDED from then
// on), DR-B and DR-C never do. Under the 2,000 yen cap each member gets two coupons and a
// MONTHLY_CAP or BUDGET_EXCEEDED for the third.
var campaigns = []silverweek.Campaign{
	{ID: "DR-A", DiscountYen: 1000, BudgetYen: 100_000},
	{ID: "DR-B", DiscountYen: 1000, BudgetYen: 1_000_000_000},
	{ID: "DR-C", DiscountYen: 1000, BudgetYen: 1_000_000_000},
}

// hotCampaign is the drill's first-come campaign of one budget stripe that only the
// [HotCampaign] step asks for: every client at once, so that IssueCoupon coalesces its requests
// into batches; its 500 coupons sell out during the step.
var hotCampaign = silverweek.Campaign{ID: "DR-H", DiscountYen: 1000, BudgetYen: 500_000}

// clientTimeout is how long a drill client waits for an answer: past the app's 3 s
// ([issuance.AppTimeout]) so that a late answer is recorded with its real latency, which the
// audit then reports as late, rather than as a timeout.
const clientTimeout = issuance.AppTimeout + 2*time.Second

// pauseAfterTransportError is how long a client waits after a request that got no answer, as the
// app shows an error before the member taps again: without it 32 clients would spin on a refused
// connection while the serving process is down and write hundreds of thousands of lines.
const pauseAfterTransportError = 200 * time.Millisecond

// membersPerSecond sizes the members the drill links to LINE up front, per second of load: 500
// members are 3,000 requests a second, above what the demo's machine serves
// (docs/operations.md). A faster machine wraps around to the first members, whose requests are
// then re-sends.
const membersPerSecond = 500

// memberID names the drill's member i.
func memberID(i int) string { return fmt.Sprintf("dm%06d", i) }

// traffic is the drill's load: members taking their turn, each asking for every campaign twice
// (a double tap within tapGap), shuffled, from a fixed number of clients that each send one
// request at a time, as the Silver Week scenario does, and record every answer.
type traffic struct {
	url     string // IssueCoupon
	client  *http.Client
	log     *answerlog.Writer
	members int // the members linked to LINE: member ids wrap around after them
	tapGap  time.Duration

	mu      sync.Mutex
	rng     *rand.Rand
	next    int                  // the next member
	burst   []silverweek.Request // the current member's requests not yet taken
	wrapped bool
	counts  map[string]int // answers by progress class (see classOf)
	// issuedSent is the latest send time of a request answered ISSUED.
	issuedSent time.Time
	err        error  // the first failure to record an answer
	hot        string // while set, every member asks for this campaign alone (HotCampaign)
}

// setHot makes every new member ask for campaign alone, twice (a double tap), until called with "".
func (t *traffic) setHot(campaign string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.hot = campaign
	t.burst = nil
}

func newTraffic(url string, clients, members int, log *answerlog.Writer, seed uint64) *traffic {
	return &traffic{
		url:     url,
		client:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}, Timeout: clientTimeout},
		log:     log,
		members: members,
		tapGap:  silverweek.DefaultTapGap,
		rng:     rand.New(rand.NewPCG(seed, seed^0xd811)),
		counts:  map[string]int{},
	}
}

// run sends requests from clients goroutines until stop is closed; each finishes the request it
// has in hand, so that every request sent has its answer in the log.
func (t *traffic) run(clients int, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := t.take()
				time.Sleep(r.Delay)
				if a := t.send(r); a.Status == 0 {
					time.Sleep(pauseAfterTransportError)
				}
			}
		})
	}
	wg.Wait()
}

// take returns the next request, starting the next member's shuffled burst when the current one
// is used up.
func (t *traffic) take() silverweek.Request {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.burst) == 0 {
		member := memberID(t.next%t.members + 1)
		if t.next++; t.next > t.members {
			t.wrapped = true
		}
		asks := []string{campaigns[0].ID, campaigns[1].ID, campaigns[2].ID}
		if t.hot != "" {
			asks = []string{t.hot}
		}
		for _, c := range asks {
			second := time.Duration(t.rng.Int64N(int64(t.tapGap)))
			t.burst = append(t.burst,
				silverweek.Request{MemberID: member, CampaignID: c},
				silverweek.Request{MemberID: member, CampaignID: c, Delay: second})
		}
		t.rng.Shuffle(len(t.burst), func(i, j int) { t.burst[i], t.burst[j] = t.burst[j], t.burst[i] })
	}
	r := t.burst[0]
	t.burst = t.burst[1:]
	return r
}

// send sends r to IssueCoupon, records the answer and returns it.
func (t *traffic) send(r silverweek.Request) answerlog.Answer {
	body, _ := json.Marshal(map[string]string{"member_id": r.MemberID, "campaign_id": r.CampaignID})
	sent := time.Now()
	status, answer, err := t.post(body)
	a := answerlog.New(sent, time.Since(sent), r.MemberID, r.CampaignID, status, answer, err)
	werr := t.log.Write(a)
	t.mu.Lock()
	t.counts[classOf(a)]++
	if classOf(a) == string(issuance.ResultIssued) && sent.After(t.issuedSent) {
		t.issuedSent = sent
	}
	if werr != nil && t.err == nil {
		t.err = werr
	}
	t.mu.Unlock()
	return a
}

// post sends one request and reads its whole answer.
func (t *traffic) post(body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, t.url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, answer, nil
}

// classOf sorts an answer for the progress lines: its result when the caller can rely on it,
// "indeterminate" when not, "outside" when it is outside the contract.
func classOf(a answerlog.Answer) string {
	switch audit.Classify(a.Status, a.Result) {
	case audit.Indeterminate:
		return "indeterminate"
	case audit.Outside:
		return "outside"
	}
	return a.Result
}

// issuedSentAfter reports whether a request sent after at has been answered ISSUED.
func (t *traffic) issuedSentAfter(at time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.issuedSent.After(at)
}

// snapshot returns the answers so far by progress class and their total.
func (t *traffic) snapshot() (map[string]int, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := make(map[string]int, len(t.counts))
	total := 0
	for k, v := range t.counts {
		c[k] = v
		total += v
	}
	return c, total
}
