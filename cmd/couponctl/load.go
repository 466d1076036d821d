package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/mops/coupon-api/internal/lab/answerlog"
	"github.com/mops/coupon-api/internal/lab/audit"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/shared/issuance"
)

type loadOptions struct {
	url                string
	campaigns, clients int
	members, budget    int
	duration           time.Duration
	seed               uint64
	record             string   // the answer log's path, "" for none
	headers            []string // --header "Name: value", each sent with every request
}

func loadCmd() *cobra.Command {
	var o loadOptions
	c := &cobra.Command{
		Use:   "load --url URL [--campaigns N] [--clients N] [--duration D] [--header 'Name: value'] [--record FILE]",
		Short: "Sustained load on a served IssueCoupon, then the rules checked by SQL",
		Long: `Send IssueCoupon requests to --url from --clients concurrent clients for --duration
(tsenart/vegeta, as fast as the service answers), spread over --campaigns campaigns and
--members members, then report throughput, latency percentiles and the answers, and check the
rules on DATABASE_URL (the database the served function uses) with reconcile, R3 at the
database's cap ("couponctl rules show"). DATABASE_URL must be migrated ("couponctl
migrate"); it is checked before anything is sent or written.

The campaigns LOAD-0001.. are created on DATABASE_URL if missing (1,000 yen coupons, a budget
of --budget-yen each). Member ids carry the run's seed, and the default seed is the start time in
nanoseconds, so two runs with different seeds never share a member. A run given an earlier run's
--seed sends that run's members again: they are answered ALREADY_ISSUED (or refused), which
"couponctl audit" accepts, their coupons being older than its log.

--header 'Name: value' (repeatable) is sent with every request, the probe included: a deployed
IssueCoupon takes only the gateway's Google ID token, as
  --header "Authorization: Bearer $(gcloud auth print-identity-token \
      --impersonate-service-account=coupon-gateway@PROJECT.iam.gserviceaccount.com --audiences=URL)"
(docs/operations.md, "Fault drill"; the token lasts an hour).

Exits 1 if an answer is outside the contract, docs/api.md (a 5xx other than 503 RETRY_EXHAUSTED, a transport
error), a coupon answered ISSUED or ALREADY_ISSUED is not in DATABASE_URL's issued_coupons (is
DATABASE_URL the service's database?), or a rule is broken. Start the service first, for example:

  DATABASE_URL=... FUNCTION_TARGET=IssueCoupon PORT=8080 couponctl serve &
  DATABASE_URL=... couponctl load --url http://127.0.0.1:8080/ --clients 256 --duration 1m

--record FILE also writes every answer to FILE, one JSON line each: {"t": send time
(RFC 3339), "ms": latency in milliseconds, "member_id", "campaign_id", "status": the HTTP status
or 0, "result": the body's result or "", "coupon_id": or "", "reason": CAMPAIGN_NOT_ACTIVE's, absent otherwise, "error": the transport error or ""}.
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
	f.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "seed of the request mix; also names the run's members (default: the start time in nanoseconds)")
	f.IntVar(&o.budget, "budget-yen", 1_000_000_000, "budget of each campaign created, in yen")
	f.StringVar(&o.record, "record", "", "write every answer to this file, one JSON line each, for couponctl audit")
	f.StringArrayVar(&o.headers, "header", nil, `a header sent with every request, "Name: value" (repeatable), such as "Authorization: Bearer TOKEN"`)
	return c
}

func (o loadOptions) validate() error {
	var errs []error
	if !functionURL(o.url) {
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
	if _, err := parseHeaders(o.headers); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// functionURL reports whether raw is an http(s) URL without a #fragment, as --url must be.
func functionURL(raw string) bool {
	u, err := url.Parse(raw)
	return raw != "" && err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Fragment == ""
}

// parseHeaders reads each --header "Name: value" into the header of every request: a JSON
// Content-Type unless one is given. A name that is not an HTTP token, or a value with a control
// character, is refused.
func parseHeaders(lines []string) (http.Header, error) {
	h := http.Header{}
	for _, line := range lines {
		name, value, ok := strings.Cut(line, ":")
		value = strings.TrimSpace(value)
		if !ok || !validHeaderName(name) || strings.ContainsFunc(value, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
			return nil, fmt.Errorf(`--header %q: want "Name: value", a name of letters, digits and !#$%%&'*+-.^_|~ and a value without control characters`, line)
		}
		h.Add(name, value)
	}
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/json")
	}
	return h, nil
}

// validHeaderName reports whether name is an HTTP field name (RFC 9110, 5.1: a token).
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if r >= 0x7f || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

func runLoad(cmd *cobra.Command, o loadOptions) error {
	if err := o.validate(); err != nil {
		return usageError{err}
	}
	ld := &load{o: o, out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr(), answers: map[string]int{}, claimed: map[string]struct{}{}}
	defer ld.close()
	ctx := cmd.Context()
	if err := ld.setUp(ctx); err != nil {
		return err
	}
	if err := ld.run(); err != nil {
		return err
	}
	return ld.report(context.WithoutCancel(ctx))
}

// load is one run of couponctl load: what it set up and what the answers said.
type load struct {
	o           loadOptions
	out, errOut io.Writer
	header      http.Header
	pool        *pgxpool.Pool
	closePool   func()
	record      *answerlog.Writer
	campaigns   []string

	metrics  vegeta.Metrics
	answers  map[string]int      // answers by "status result"
	outside  int                 // answers outside the contract
	examples []string            // the first few of them
	claimed  map[string]struct{} // the coupon ids answered ISSUED or ALREADY_ISSUED
}

// setUp checks what the load needs before it sends anything: that --url
// answers as IssueCoupon, the database (migrated), then the answer log, then the campaigns.
func (ld *load) setUp(ctx context.Context) error {
	ld.header, _ = parseHeaders(ld.o.headers) // validate refused a bad one
	var err error
	if err := probeIssueCoupon(ctx, ld.o.url, ld.header); err != nil {
		return err
	}
	// The database first, then the answer log: a load that cannot check its rules writes nothing.
	if ld.pool, ld.closePool, err = openMigrated(ctx); err != nil {
		return fmt.Errorf("load checks the rules on the service's database: %w", err)
	}
	if ld.o.record != "" {
		if ld.record, err = answerlog.Create(ld.o.record); err != nil {
			return err
		}
	}
	ld.campaigns = make([]string, ld.o.campaigns)
	for i := range ld.campaigns {
		ld.campaigns[i] = fmt.Sprintf("LOAD-%04d", i+1)
		err := campaign.Create(ctx, ld.pool, campaign.Campaign{ID: ld.campaigns[i], DiscountYen: 1000, BudgetYen: ld.o.budget})
		if err != nil && !errors.Is(err, campaign.ErrExists) {
			return err
		}
	}
	fmt.Fprintf(ld.errOut, "load: %d clients for %s on %s, %d campaigns, %d members (seed %d)\n",
		ld.o.clients, ld.o.duration, ld.o.url, ld.o.campaigns, ld.o.members, ld.o.seed)
	return nil
}

// run sends the load with vegeta and tallies every answer, recording it when asked.
func (ld *load) run() error {
	attacker := vegeta.NewAttacker(vegeta.Workers(uint64(ld.o.clients)), vegeta.MaxWorkers(uint64(ld.o.clients)),
		vegeta.Connections(ld.o.clients), vegeta.Timeout(issuance.AppTimeout))
	for res := range attacker.Attack(ld.targeter(), vegeta.ConstantPacer{}, ld.o.duration, "load") {
		ld.tally(res)
		if ld.record != nil {
			_ = ld.record.Write(recordedAnswer(res)) // a failed write is Close's error
		}
	}
	ld.metrics.Close()
	if ld.record == nil {
		return nil
	}
	if err := ld.record.Close(); err != nil {
		return err
	}
	fmt.Fprintf(ld.errOut, "load: %d answers recorded in %s (couponctl audit %s checks them against the tables)\n",
		ld.record.Count(), ld.record.Name(), ld.record.Name())
	ld.record = nil
	return nil
}

// targeter draws each request's member and campaign from the run's seed.
func (ld *load) targeter() vegeta.Targeter {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(ld.o.seed, 0))
	run := strconv.FormatUint(ld.o.seed, 36)
	return func(t *vegeta.Target) error {
		mu.Lock()
		m, c := rng.IntN(ld.o.members), rng.IntN(len(ld.campaigns))
		mu.Unlock()
		member := fmt.Sprintf("ld%s-%d", run, m)
		// The URL's fragment names the request's member and campaign for the answer log: vegeta
		// gives a result its target's URL, and a fragment is never sent.
		t.Method, t.Header = http.MethodPost, ld.header
		t.URL = ld.o.url + "#" + url.Values{"m": {member}, "c": {ld.campaigns[c]}}.Encode()
		t.Body = fmt.Appendf(nil, `{"member_id":"%s","campaign_id":"%s"}`, member, ld.campaigns[c])
		return nil
	}
}

// tally counts one answer: by status and result, the coupon it claims, or outside the contract.
func (ld *load) tally(res *vegeta.Result) {
	ld.metrics.Add(res)
	result := loadResultOf(res)
	label := fmt.Sprintf("%d %s", res.Code, result)
	if res.Code == 0 {
		label = "transport error"
	}
	ld.answers[label]++
	switch class := audit.Classify(int(res.Code), result); {
	case class != audit.Determinate:
		if ld.outside++; len(ld.examples) < 5 {
			ld.examples = append(ld.examples, strings.TrimSpace(label+" "+res.Error))
		}
	case result == string(issuance.ResultIssued) || result == string(issuance.ResultAlreadyIssued):
		ld.claimed[loadCouponOf(res)] = struct{}{}
	}
}

// report prints throughput, latency and the answers, then checks them against the tables: the
// claimed coupons exist, and the rules hold. It returns errViolations if anything failed.
func (ld *load) report(ctx context.Context) error {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	m := ld.metrics
	fmt.Fprintf(ld.out, "requests %d in %s: %.0f req/s\n", m.Requests, m.Duration.Round(time.Millisecond), m.Rate)
	fmt.Fprintf(ld.out, "latency ms: p50 %.1f  p95 %.1f  p99 %.1f  max %.1f\n",
		ms(m.Latencies.P50), ms(m.Latencies.P95), ms(m.Latencies.P99), ms(m.Latencies.Max))
	labels := slices.Sorted(maps.Keys(ld.answers))
	for _, label := range labels {
		fmt.Fprintf(ld.out, "  %-26s %8d\n", label, ld.answers[label])
	}
	var failures []string
	if ld.outside > 0 {
		failures = append(failures, fmt.Sprintf("%d answers outside the contract, such as %q", ld.outside, ld.examples))
	}
	missing, err := missingCoupons(ctx, ld.pool, ld.claimed)
	if err != nil {
		return err
	}
	if missing > 0 {
		failures = append(failures, fmt.Sprintf("%d of the %d coupons answered ISSUED or ALREADY_ISSUED are not in issued_coupons of "+
			"DATABASE_URL's database: is DATABASE_URL the service's database?", missing, len(ld.claimed)))
	}
	rep, err := reconcile.Check(ctx, ld.pool)
	if err != nil {
		return err
	}
	rep.Write(ld.out)
	if failures = append(failures, rep.Violations()...); len(failures) > 0 {
		for _, f := range failures {
			fmt.Fprintln(ld.out, "FAILED:", f)
		}
		return errViolations
	}
	fmt.Fprintln(ld.out, "OK: every answer in the contract; every rule held.")
	return nil
}

// close releases what setUp opened: an answer log left open by a failure, and the pool.
func (ld *load) close() {
	if ld.record != nil {
		_ = ld.record.Close()
	}
	if ld.closePool != nil {
		ld.closePool()
	}
}

// loadResultOf is the result code of a load answer's JSON body, or "".
func loadResultOf(res *vegeta.Result) string {
	var body struct {
		Result string `json:"result"`
	}
	_ = json.Unmarshal(res.Body, &body)
	return body.Result
}

// loadCouponOf is the coupon id of a load answer's JSON body, or "".
func loadCouponOf(res *vegeta.Result) string {
	var body struct {
		CouponID string `json:"coupon_id"`
	}
	_ = json.Unmarshal(res.Body, &body)
	return body.CouponID
}

// missingCoupons counts the coupon ids of claimed that issued_coupons does not hold (an id that
// is not a UUID included): the service answered them, so a database without them is not the
// service's, or lost them.
func missingCoupons(ctx context.Context, pool *pgxpool.Pool, claimed map[string]struct{}) (int, error) {
	const batch = 10_000
	var ids []string
	missing := 0
	for id := range claimed {
		if _, err := uuid.Parse(id); err != nil {
			missing++
			continue
		}
		ids = append(ids, id)
	}
	for len(ids) > 0 {
		n := min(len(ids), batch)
		var found int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM issued_coupons WHERE coupon_id = ANY($1::uuid[])`, ids[:n]).Scan(&found)
		if err != nil {
			return 0, fmt.Errorf("load: the answered coupons in issued_coupons: %w", err)
		}
		missing += n - found
		ids = ids[n:]
	}
	return missing, nil
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
func probeIssueCoupon(ctx context.Context, target string, header http.Header) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, strings.NewReader(`{}`))
	if err != nil {
		return err
	}
	req.Header = header.Clone()
	if host := header.Get("Host"); host != "" {
		req.Host = host // as vegeta sends it
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("--url %s: %w", target, err)
	}
	defer resp.Body.Close()
	var body struct {
		Result string `json:"result"`
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return fmt.Errorf("--url %s refused the caller (HTTP %d to an empty request): a deployed IssueCoupon takes only the gateway's "+
			"ID token; send it with --header \"Authorization: Bearer $(gcloud auth print-identity-token "+
			"--impersonate-service-account=GATEWAY_SA --audiences=URL)\" (docs/operations.md, \"Fault drill\")", target, resp.StatusCode)
	}
	if resp.StatusCode != http.StatusBadRequest || json.NewDecoder(resp.Body).Decode(&body) != nil || body.Result != "INVALID_REQUEST" {
		return fmt.Errorf("--url %s does not answer as IssueCoupon (HTTP %d to an empty request, want 400 INVALID_REQUEST); "+
			"with couponctl serve serving both functions the URL ends in /IssueCoupon", target, resp.StatusCode)
	}
	return nil
}
