package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/mops/coupon-api/internal/answerlog"
	"github.com/mops/coupon-api/internal/audit"
	"github.com/mops/coupon-api/internal/campaign"
	"github.com/mops/coupon-api/internal/reconcile"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/issuance"
)

type loadOptions struct {
	url                string
	campaigns, clients int
	members, budget    int
	duration           time.Duration
	seed               uint64
	record             string // the answer log's path, "" for none
}

func loadCmd() *cobra.Command {
	var o loadOptions
	c := &cobra.Command{
		Use:   "load --url URL [--campaigns N] [--clients N] [--duration D] [--record FILE]",
		Short: "Sustained load on a served IssueCoupon, then the rules checked by SQL",
		Long: `Send IssueCoupon requests to --url from --clients concurrent clients for --duration
(tsenart/vegeta, as fast as the service answers), spread over --campaigns campaigns and
--members members, then report throughput, latency percentiles and the answers, and check the
rules on DATABASE_URL (the database the served function uses) with reconcile.

The campaigns LOAD-0001.. are created on DATABASE_URL if missing (1,000 yen coupons, a budget
of --budget-yen each). Member ids carry the run's seed, so runs do not collide.

Exits 1 if an answer is outside the contract, docs/api.md (a 5xx other than 503 RETRY_EXHAUSTED, a transport
error) or a rule is broken. Start the service first, for example:

  DATABASE_URL=... FUNCTION_TARGET=IssueCoupon PORT=8080 couponctl serve &
  DATABASE_URL=... couponctl load --url http://127.0.0.1:8080/ --clients 256 --duration 1m

--record FILE also writes every answer to FILE, one JSON line each: {"t": send time
(RFC 3339), "ms": latency in milliseconds, "member_id", "campaign_id", "status": the HTTP status
or 0, "result": the body's result or "", "coupon_id": or "", "error": the transport error or ""}.
"couponctl audit FILE" then checks those answers against the tables: every ISSUED coupon
exists, no refusal is contradicted, every answer came within 3 s.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runLoad(cmd, o) },
	}
	f := c.Flags()
	f.StringVar(&o.url, "url", "", "IssueCoupon's URL, such as http://127.0.0.1:8080/ (required)")
	f.IntVar(&o.campaigns, "campaigns", 50, "campaigns to spread the requests over (1-9999)")
	f.IntVar(&o.clients, "clients", 64, "concurrent clients")
	f.IntVar(&o.members, "members", 100_000, "distinct members the requests are drawn from")
	f.DurationVar(&o.duration, "duration", time.Minute, "how long to send")
	f.Uint64Var(&o.seed, "seed", uint64(time.Now().Unix()), "seed of the request mix; also names the run's members")
	f.IntVar(&o.budget, "budget-yen", 1_000_000_000, "budget of each campaign created, in yen")
	f.StringVar(&o.record, "record", "", "write every answer to this file, one JSON line each, for couponctl audit")
	return c
}

func (o loadOptions) validate() error {
	var errs []error
	if u, err := url.Parse(o.url); o.url == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Fragment != "" {
		errs = append(errs, fmt.Errorf("--url %q: want the function's http(s) URL, without a #fragment", o.url))
	}
	if o.campaigns < 1 || o.campaigns > 9999 {
		errs = append(errs, fmt.Errorf("--campaigns %d: must be in 1..9999", o.campaigns))
	}
	if o.clients < 1 || o.members < 1 {
		errs = append(errs, errors.New("--clients and --members must be at least 1"))
	}
	if o.duration <= 0 {
		errs = append(errs, fmt.Errorf("--duration %s: must be positive", o.duration))
	}
	if o.budget < 1000 {
		errs = append(errs, fmt.Errorf("--budget-yen %d: must be at least one 1,000 yen coupon", o.budget))
	}
	return errors.Join(errs...)
}

func runLoad(cmd *cobra.Command, o loadOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	ctx := cmd.Context()
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if err := probeIssueCoupon(ctx, o.url); err != nil {
		return err
	}
	pool, closePool, err := db.OpenFromEnv(ctx)
	if err != nil {
		return fmt.Errorf("load checks the rules on the service's database: %w", err)
	}
	defer closePool()
	var record *answerlog.Writer
	if o.record != "" {
		if record, err = answerlog.Create(o.record); err != nil {
			return err
		}
	}
	campaigns := make([]string, o.campaigns)
	for i := range campaigns {
		campaigns[i] = fmt.Sprintf("LOAD-%04d", i+1)
		err := campaign.Create(ctx, pool, campaign.Campaign{ID: campaigns[i], DiscountYen: 1000, BudgetYen: o.budget})
		if err != nil && !errors.Is(err, campaign.ErrExists) {
			return err
		}
	}
	fmt.Fprintf(errOut, "load: %d clients for %s on %s, %d campaigns, %d members (seed %d)\n",
		o.clients, o.duration, o.url, o.campaigns, o.members, o.seed)

	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(o.seed, 0))
	header := http.Header{"Content-Type": []string{"application/json"}}
	run := strconv.FormatUint(o.seed, 36)
	targeter := func(t *vegeta.Target) error {
		mu.Lock()
		m, c := rng.IntN(o.members), rng.IntN(len(campaigns))
		mu.Unlock()
		member := fmt.Sprintf("ld%s-%d", run, m)
		// The URL's fragment names the request's member and campaign for the answer log: vegeta
		// gives a result its target's URL, and a fragment is never sent.
		t.Method, t.Header = http.MethodPost, header
		t.URL = o.url + "#" + url.Values{"m": {member}, "c": {campaigns[c]}}.Encode()
		t.Body = fmt.Appendf(nil, `{"member_id":"%s","campaign_id":"%s"}`, member, campaigns[c])
		return nil
	}
	attacker := vegeta.NewAttacker(vegeta.Workers(uint64(o.clients)), vegeta.MaxWorkers(uint64(o.clients)),
		vegeta.Connections(o.clients), vegeta.Timeout(issuance.AppTimeout))
	var metrics vegeta.Metrics
	answers := map[string]int{}
	outside := 0
	var examples []string
	for res := range attacker.Attack(targeter, vegeta.ConstantPacer{}, o.duration, "load") {
		metrics.Add(res)
		result := loadResultOf(res)
		label := fmt.Sprintf("%d %s", res.Code, result)
		if res.Code == 0 {
			label = "transport error"
		}
		answers[label]++
		if audit.Classify(int(res.Code), result) != audit.Determinate {
			if outside++; len(examples) < 5 {
				examples = append(examples, strings.TrimSpace(label+" "+res.Error))
			}
		}
		if record != nil {
			_ = record.Write(recordedAnswer(res)) // a failed write is Close's error
		}
	}
	metrics.Close()
	if record != nil {
		if err := record.Close(); err != nil {
			return err
		}
		fmt.Fprintf(errOut, "load: %d answers recorded in %s (couponctl audit %s checks them against the tables)\n",
			record.Count(), record.Name(), record.Name())
	}

	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	fmt.Fprintf(out, "requests %d in %s: %.0f req/s\n", metrics.Requests, metrics.Duration.Round(time.Millisecond), metrics.Rate)
	fmt.Fprintf(out, "latency ms: p50 %.1f  p95 %.1f  p99 %.1f  max %.1f\n",
		ms(metrics.Latencies.P50), ms(metrics.Latencies.P95), ms(metrics.Latencies.P99), ms(metrics.Latencies.Max))
	labels := make([]string, 0, len(answers))
	for label := range answers {
		labels = append(labels, label)
	}
	sort.Strings(labels)
	for _, label := range labels {
		fmt.Fprintf(out, "  %-26s %8d\n", label, answers[label])
	}

	var failures []string
	if outside > 0 {
		failures = append(failures, fmt.Sprintf("%d answers outside the contract, such as %q", outside, examples))
	}
	rep, err := reconcile.Check(context.WithoutCancel(ctx), pool, reconcile.Config{CapYen: issuance.DefaultMonthlyCapYen})
	if err != nil {
		return err
	}
	rep.Write(out)
	failures = append(failures, rep.Violations()...)
	if len(failures) > 0 {
		for _, f := range failures {
			fmt.Fprintln(out, "FAILED:", f)
		}
		return errViolations
	}
	fmt.Fprintln(out, "OK: every answer in the contract; every rule held.")
	return nil
}

// loadResultOf is the result code of a load answer's JSON body, or "".
func loadResultOf(res *vegeta.Result) string {
	var body struct {
		Result string `json:"result"`
	}
	_ = json.Unmarshal(res.Body, &body)
	return body.Result
}

// recordedAnswer is res as a line of the answer log, its member and campaign read from the
// fragment of its URL (see the targeter); vegeta's Error is the transport error only without a
// status (with one it is the status line).
func recordedAnswer(res *vegeta.Result) answerlog.Answer {
	var pair url.Values
	if u, err := url.Parse(res.URL); err == nil {
		pair, _ = url.ParseQuery(u.Fragment)
	}
	var transportErr error
	if res.Code == 0 {
		transportErr = errors.New(cmp.Or(res.Error, "no answer"))
	}
	return answerlog.New(res.Timestamp, res.Latency, pair.Get("m"), pair.Get("c"), int(res.Code), res.Body, transportErr)
}

// probeIssueCoupon sends one request that writes nothing (an empty object: INVALID_REQUEST) and
// refuses a URL that does not answer as IssueCoupon, before the load sends thousands to it.
func probeIssueCoupon(ctx context.Context, target string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, strings.NewReader(`{}`))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("--url %s: %w", target, err)
	}
	defer resp.Body.Close()
	var body struct {
		Result string `json:"result"`
	}
	if resp.StatusCode != http.StatusBadRequest || json.NewDecoder(resp.Body).Decode(&body) != nil || body.Result != "INVALID_REQUEST" {
		return fmt.Errorf("--url %s does not answer as IssueCoupon (HTTP %d to an empty request, want 400 INVALID_REQUEST); "+
			"with couponctl serve serving both functions the URL ends in /IssueCoupon", target, resp.StatusCode)
	}
	return nil
}
