package lifecycletest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"pgregory.net/rapid"

	"github.com/mops/coupon-api/console"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/issuance"
)

// The agreement of the one judge (issue 39, 00031_one_judge_one_clock.sql): random campaigns of
// every kind (periods, releases, audiences, fixed expiries, budget stripes) are paused, resumed,
// ended, moved, given a later expiry and sold out while the database's clock (issue_now(),
// pgtest.SetClock) jumps to random instants and onto each campaign's own; at each check, for a
// campaign and its members (a fresh one, one whose month is at R3's cap, one holding its coupon,
// one outside its audience), the dry run, grant's pre-check (grant_check), the issuance (IssueCoupon's
// or the grant's) must answer alike, and campaign show's state and the console's must be the
// state that a fresh member's dry run implies.

// agreeStart is the database's clock when a check starts: each check moves it forward.
var agreeStart = time.Date(2026, 12, 7, 10, 0, 0, 0, issuance.Tokyo)

// TestEveryPathAgrees runs the agreement on the production judge and readers. Its bounds keep it
// near 20 s on a quiet 2-core machine (15 checks of 40 steps took 30 s, 2026-12-07);
// -rapid.checks and -rapid.steps run it longer. The agreement tests set rapid's flags, which are
// global: they do not run in parallel.
func TestEveryPathAgrees(t *testing.T) {
	rapidBounds(t, map[string]string{"rapid.checks": "10", "rapid.steps": "30", "rapid.shrinktime": "15s", "rapid.nofailfile": "true"})
	a := newAgreement(t)
	rapid.Check(t, a.property(showState))
	t.Logf("%d checks compared %d answers", a.checks.Load(), a.compared.Load())
}

// TestAgreementFindsADryRunOfItsOwnOrder: the dry run written again with a refusal order of its
// own (00028's body, which judged the campaign's state before the audience: an outsider of a
// paused audience-only campaign told CAMPAIGN_NOT_ACTIVE where the issuance says NOT_ELIGIBLE),
// kept as a fixture, is found.
func TestAgreementFindsADryRunOfItsOwnOrder(t *testing.T) {
	rapidBounds(t, map[string]string{"rapid.checks": "100", "rapid.steps": "40", "rapid.shrinktime": "5s", "rapid.nofailfile": "true"})
	a := newAgreement(t)
	if _, err := a.owner.Exec(context.Background(), dryRunOfItsOwnOrder(t)); err != nil {
		t.Fatal(err)
	}
	report, failed := failures(t, a.property(showState))
	if !failed || !strings.Contains(report, "the dry run answered") {
		t.Fatalf("rapid found no disagreement of the dry run with its own order (failed %t):\n%s", failed, report)
	}
}

// TestAgreementFindsAStateDerivedInGo: campaign show's state derived in Go from the campaign's
// fields (goState, the rule of internal/ops/campaign before 00031), kept as a fixture, is found:
// it calls a sold-out campaign active, and an expired one ended.
func TestAgreementFindsAStateDerivedInGo(t *testing.T) {
	rapidBounds(t, map[string]string{"rapid.checks": "100", "rapid.steps": "40", "rapid.shrinktime": "5s", "rapid.nofailfile": "true"})
	a := newAgreement(t)
	report, failed := failures(t, a.property(goState))
	if !failed || !strings.Contains(report, "campaign show says") {
		t.Fatalf("rapid found no disagreement of a state derived in Go (failed %t):\n%s", failed, report)
	}
}

// dryRunOfItsOwnOrder is the broken variant: issue_dry_run_batch as 00028 wrote it, its own body
// of the refusals, with the campaign's state judged before the audience, reading the moved clock.
func dryRunOfItsOwnOrder(t *testing.T) string {
	t.Helper()
	text, err := fs.ReadFile(schema.Migrations(), "00028_dry_run_groups.sql")
	if err != nil {
		t.Fatal(err)
	}
	s := string(text)
	i := strings.Index(s, "CREATE FUNCTION issue_dry_run_batch(")
	j := strings.Index(s[max(i, 0):], "\n$$;")
	if i < 0 || j < 0 {
		t.Fatal("00028_dry_run_groups.sql: no issue_dry_run_batch")
	}
	def := "CREATE OR REPLACE" + strings.TrimPrefix(s[i:i+j+len("\n$$;")], "CREATE")
	for _, r := range [][2]string{
		{"clock_timestamp()", "issue_now()"},
		{"           WHEN v_first.audience_only AND au.member_id IS NULL THEN 'NOT_ELIGIBLE'\n           WHEN v_reason IS NOT NULL THEN 'CAMPAIGN_NOT_ACTIVE'\n",
			"           WHEN v_reason IS NOT NULL THEN 'CAMPAIGN_NOT_ACTIVE'\n           WHEN v_first.audience_only AND au.member_id IS NULL THEN 'NOT_ELIGIBLE'\n"},
	} {
		if !strings.Contains(def, r[0]) {
			t.Fatalf("00028's issue_dry_run_batch has no %q", r[0])
		}
		def = strings.ReplaceAll(def, r[0], r[1])
	}
	return def
}

// stateReader is how a check reads campaign show's state of campaign id.
type stateReader func(ctx context.Context, pool *pgxpool.Pool, id string) (string, error)

// showState is campaign show's: campaign.Show, the database's judgement (campaign_state).
func showState(ctx context.Context, pool *pgxpool.Pool, id string) (string, error) {
	s, err := campaign.Show(ctx, pool, id)
	return s.State, err
}

// goState is the broken variant: the state derived in Go from the campaign's fields at the
// database's clock, as campaign.Status.State did before 00031: ended, paused, not started
// (before its start or its first release), else active.
func goState(ctx context.Context, pool *pgxpool.Pool, id string) (string, error) {
	s, err := campaign.Show(ctx, pool, id)
	now := s.At
	switch {
	case err != nil:
		return "", err
	case s.EndsAt != nil && !now.Before(*s.EndsAt), s.CouponsExpireAt != nil && !now.Before(*s.CouponsExpireAt):
		return campaign.StateEnded, nil
	case s.PausedAt != nil:
		return campaign.StatePaused, nil
	case s.StartsAt != nil && now.Before(*s.StartsAt), len(s.Schedule) > 0 && !s.Schedule[0].Open:
		return campaign.StateNotStarted, nil
	}
	return campaign.StateActive, nil
}

// agreement is the real parts one test database offers: the issuance and the dry run as
// IssueCoupon runs them (coupon_issue), the grant and the changes as couponctl runs them
// (coupon_admin), the console as deployed (coupon_console), and the owner, who moves the clock.
type agreement struct {
	t                *testing.T
	owner, admin     *pgxpool.Pool
	issue, grant     *issuance.Service
	console          http.Handler
	checks, compared atomic.Int64
	clockAt          time.Time
	consoleStates    *regexp.Regexp
}

func newAgreement(t *testing.T) *agreement {
	t.Helper()
	url := pgtest.URL(t)
	pool := func(u string) *pgxpool.Pool {
		p, err := pgxpool.New(context.Background(), u+"&pool_max_conns=4")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	service := func(p *pgxpool.Pool) *issuance.Service {
		svc, err := issuance.New(p, issuance.Config{BatchMax: 1})
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	a := &agreement{t: t, owner: pool(url), admin: pool(pgtest.LoginAs(t, url, "coupon_admin")),
		consoleStates: regexp.MustCompile(`data-campaign="([^"]+)" data-state="([A-Z_]+)"`)}
	a.issue, a.grant = service(pool(pgtest.LoginAs(t, url, "coupon_issue"))), service(a.admin)
	h, err := console.New(console.Config{Pool: pool(pgtest.LoginAs(t, url, "coupon_console")),
		Identity: console.Operator("agreement@example.com"), Plaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	a.console = h
	return a
}

// setClock moves the database's clock to at (pgtest.SetClock).
func (a *agreement) setClock(at time.Time) {
	at = at.Truncate(time.Microsecond)
	pgtest.SetClock(a.t, a.owner, at)
	a.clockAt = at
}

// consoleState is the state the console's list shows for campaign id (its data-state).
func (a *agreement) consoleState(id string) (string, error) {
	r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
	w := httptest.NewRecorder()
	a.console.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		return "", fmt.Errorf("the console's list: %d %s", w.Code, w.Body.String())
	}
	for _, m := range a.consoleStates.FindAllStringSubmatch(w.Body.String(), -1) {
		if m[1] == id {
			return m[2], nil
		}
	}
	return "", fmt.Errorf("the console's list has no campaign %s", id)
}

// aCampaign is what a check knows of a campaign it made.
type aCampaign struct {
	id       string
	audience bool
	instants []time.Time // its start, end, releases and expiry, as set
	holder   string      // a member holding its coupon, once one does
	next     int         // its fresh members handed out
}

// agreeCheck is one check: its campaigns, its clock and its members.
type agreeCheck struct {
	a         *agreement
	read      stateReader
	prefix    string
	campaigns []*aCampaign
	fill      string          // a campaign of R3's cap in yen, always open: it fills a member's month
	capped    map[string]bool // the members whose month is at the cap, by month and member
}

func (a *agreement) property(read stateReader) func(*rapid.T) {
	return func(t *rapid.T) {
		k := a.checks.Add(1)
		c := &agreeCheck{a: a, read: read, prefix: fmt.Sprintf("ag%d", k), capped: map[string]bool{}}
		a.setClock(agreeStart.AddDate(0, 0, int(k)*7))
		c.fill = c.prefix + "-FILL"
		if err := campaign.Create(context.Background(), a.owner, campaign.Campaign{ID: c.fill,
			DiscountYen: issuance.DefaultMonthlyCapYen, BudgetYen: 1 << 30}); err != nil {
			t.Fatal(err)
		}
		c.create(t)
		t.Repeat(map[string]func(*rapid.T){
			"create": c.create, "tick": c.tick, "to an instant": c.toInstant, "pause": c.pause, "resume": c.resume,
			"end": c.end, "period": c.period, "expiry": c.expiry, "sell out": c.sellOut, "": c.agree,
		})
	}
}

// at draws an instant around the clock: an hour or two before, in half an hour, in two hours.
func (c *agreeCheck) at(t *rapid.T, label string) time.Time {
	return c.a.clockAt.Add(rapid.SampledFrom([]time.Duration{-2 * time.Hour, -time.Hour, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour}).Draw(t, label))
}

// create makes a campaign of a drawn kind: a period or none, releases or none, audience-only or
// not, a fixed expiry, a validity in days or none, one to three stripes.
func (c *agreeCheck) create(t *rapid.T) {
	ctx := context.Background()
	coupons := rapid.IntRange(1, 4).Draw(t, "coupons")
	def := campaign.Campaign{ID: fmt.Sprintf("%s-c%d", c.prefix, len(c.campaigns)),
		DiscountYen: rapid.SampledFrom([]int{500, 1000}).Draw(t, "discount_yen")}
	def.BudgetYen, def.Stripes = coupons*def.DiscountYen, rapid.IntRange(1, min(3, coupons)).Draw(t, "stripes")
	mc := &aCampaign{id: def.ID, audience: rapid.Bool().Draw(t, "audience-only")}
	def.AudienceOnly = mc.audience
	if rapid.Bool().Draw(t, "starts") {
		s := c.at(t, "starts at")
		def.StartsAt = &s
	}
	if rapid.Bool().Draw(t, "ends") {
		e := c.a.clockAt.Add(rapid.SampledFrom([]time.Duration{time.Hour, 3 * time.Hour, 6 * time.Hour}).Draw(t, "ends in"))
		if def.StartsAt != nil && !def.StartsAt.Before(e) {
			e = def.StartsAt.Add(time.Hour)
		}
		def.EndsAt = &e
	}
	switch rapid.SampledFrom([]string{"none", "days", "fixed"}).Draw(t, "validity") {
	case "days":
		def.CouponValidDays = 1
	case "fixed":
		x := c.a.clockAt.Add(rapid.SampledFrom([]time.Duration{time.Hour, 4 * time.Hour}).Draw(t, "expires in"))
		def.CouponsExpireAt = &x
	}
	for n, left := rapid.IntRange(0, 3).Draw(t, "releases"), coupons; n > 0 && left > 0; n-- {
		r := campaign.Release{At: c.at(t, "release at").Add(time.Duration(n) * time.Minute), Coupons: rapid.IntRange(1, left).Draw(t, "release coupons")}
		if def.EndsAt != nil && !r.At.Before(*def.EndsAt) {
			continue
		}
		def.Releases, left = append(def.Releases, r), left-r.Coupons
		mc.instants = append(mc.instants, r.At)
	}
	for _, p := range []*time.Time{def.StartsAt, def.EndsAt, def.CouponsExpireAt} {
		if p != nil {
			mc.instants = append(mc.instants, *p)
		}
	}
	// A release drawn before the clock has passed: the campaign is made a minute before its
	// first release (campaign_create refuses a passed one, 00034), then the clock goes back.
	now, made := c.a.clockAt, c.a.clockAt
	for _, r := range def.Releases {
		if before := r.At.Add(-time.Minute); before.Before(made) {
			made = before
		}
	}
	c.a.setClock(made)
	err := campaign.Create(ctx, c.a.admin, def)
	c.a.setClock(now)
	if err != nil {
		t.Fatalf("create %s: %v", def.ID, err)
	}
	if mc.audience {
		members := make([]string, 200)
		for i := range members {
			members[i] = fmt.Sprintf("%s-a%d", def.ID, i)
		}
		if _, err := campaign.AudienceChange(ctx, c.a.admin, def.ID, members, true, reason); err != nil {
			t.Fatalf("audience of %s: %v", def.ID, err)
		}
	}
	t.Logf("create %s: %+v", def.ID, def)
	c.campaigns = append(c.campaigns, mc)
}

func (c *agreeCheck) pick(t *rapid.T) *aCampaign {
	return c.campaigns[rapid.IntRange(0, len(c.campaigns)-1).Draw(t, "campaign")]
}

// tick moves the clock forward by a minute to three hours.
func (c *agreeCheck) tick(t *rapid.T) {
	d := rapid.SampledFrom([]time.Duration{time.Minute, 20 * time.Minute, time.Hour, 3 * time.Hour}).Draw(t, "tick")
	c.a.setClock(c.a.clockAt.Add(d))
	t.Logf("clock %s", c.a.clockAt.In(issuance.Tokyo).Format(time.RFC3339Nano))
}

// toInstant moves the clock onto one of a campaign's instants still to come, a microsecond
// before it, or onto it: the judgement changes there.
func (c *agreeCheck) toInstant(t *rapid.T) {
	mc := c.pick(t)
	var ahead []time.Time
	for _, at := range mc.instants {
		if at.After(c.a.clockAt) {
			ahead = append(ahead, at)
		}
	}
	if len(ahead) == 0 {
		t.Skip("no instant of the campaign ahead")
	}
	at := ahead[rapid.IntRange(0, len(ahead)-1).Draw(t, "instant")]
	c.a.setClock(at.Add(-rapid.SampledFrom([]time.Duration{time.Microsecond, 0}).Draw(t, "before it by")))
	t.Logf("clock %s (an instant of %s at %s)", c.a.clockAt.In(issuance.Tokyo).Format(time.RFC3339Nano), mc.id, at.In(issuance.Tokyo).Format(time.RFC3339Nano))
}

// change runs a change of a campaign; a refusal (an ended campaign, a campaign not started) is
// the change functions' to make, and only logged.
func (c *agreeCheck) change(t *rapid.T, what string, do func(ctx context.Context, id string) error) {
	mc := c.pick(t)
	err := do(context.Background(), mc.id)
	t.Logf("%s %s: %v", what, mc.id, err)
	if err != nil && !errors.Is(err, campaign.ErrRefused) {
		t.Fatalf("%s %s: %v", what, mc.id, err)
	}
}

func (c *agreeCheck) pause(t *rapid.T) {
	c.change(t, "pause", func(ctx context.Context, id string) error {
		_, err := campaign.Pause(ctx, c.a.admin, id, reason)
		return err
	})
}

func (c *agreeCheck) resume(t *rapid.T) {
	c.change(t, "resume", func(ctx context.Context, id string) error {
		_, err := campaign.Resume(ctx, c.a.admin, id, reason)
		return err
	})
}

func (c *agreeCheck) end(t *rapid.T) {
	c.change(t, "end", func(ctx context.Context, id string) error {
		_, err := campaign.End(ctx, c.a.admin, id, reason)
		return err
	})
}

// period moves a campaign's end: before or after the clock, or away.
func (c *agreeCheck) period(t *rapid.T) {
	ends := c.at(t, "ends at")
	open := rapid.Bool().Draw(t, "no end")
	c.change(t, "period", func(ctx context.Context, id string) error {
		ch := campaign.Changes{SetEnds: true, EndsAt: &ends, Reason: reason}
		if open {
			ch.EndsAt = nil
		}
		_, err := campaign.Update(ctx, c.a.admin, id, ch)
		return err
	})
}

// expiry gives a campaign a later fixed expiry (reopening one it ended) or none.
func (c *agreeCheck) expiry(t *rapid.T) {
	x := c.a.clockAt.Add(rapid.SampledFrom([]time.Duration{time.Hour, 24 * time.Hour}).Draw(t, "expires in"))
	none := rapid.Bool().Draw(t, "no expiry")
	c.change(t, "expiry", func(ctx context.Context, id string) error {
		ch := campaign.Changes{SetValidity: true, ExpireAt: &x, Reason: reason}
		if none {
			ch.ExpireAt = nil
		}
		_, err := campaign.Update(ctx, c.a.admin, id, ch)
		return err
	})
}

// fresh is a member of mc's that holds nothing of it: in its audience when it has one.
func (c *agreeCheck) fresh(mc *aCampaign) string {
	mc.next++
	if mc.audience {
		return fmt.Sprintf("%s-a%d", mc.id, mc.next)
	}
	return fmt.Sprintf("%s-f%d", mc.id, mc.next)
}

// sellOut issues mc's coupons to fresh members until one is refused.
func (c *agreeCheck) sellOut(t *rapid.T) {
	mc := c.pick(t)
	for range 5 {
		out, err := c.a.issue.Issue(context.Background(), c.fresh(mc), mc.id)
		if err != nil {
			t.Fatalf("sell out %s: %v", mc.id, err)
		}
		t.Logf("sell out %s: %s", mc.id, out.Result)
		if out.Result != issuance.ResultIssued {
			return
		}
		mc.holder = ""
	}
}

// cappedMember is a member whose month, the clock's, is at R3's cap: given a coupon of the fill
// campaign (R3's cap in yen) this month.
func (c *agreeCheck) cappedMember(t *rapid.T) string {
	member := c.prefix + "-cap-" + issuance.Month(c.a.clockAt)
	if !c.capped[member] {
		out, err := c.a.issue.Issue(context.Background(), member, c.fill)
		if err != nil || out.Result != issuance.ResultIssued {
			t.Fatalf("fill %s's month: %+v %v", member, out, err)
		}
		c.capped[member] = true
	}
	return member
}

// grantCheck is grant_check's answer for member of campaign id: its one row.
func (c *agreeCheck) grantCheck(id, member string) (issuance.DryRunOutcome, error) {
	var out issuance.DryRunOutcome
	var result, reason string
	err := c.a.admin.QueryRow(context.Background(), `SELECT result, coalesce(reason, ''), next_release_at FROM grant_check($1, ARRAY[$2])`,
		id, member).Scan(&result, &reason, &out.NextReleaseAt)
	out.Result, out.Reason = issuance.Result(result), reason
	return out, err
}

// agree is the property: for a campaign, the state campaign show and the console say, against a
// fresh member's dry run; then, for each of its members, the dry run, grant's pre-check and the
// issuance (IssueCoupon's or the grant's, drawn), in turn, each right before the next.
func (c *agreeCheck) agree(t *rapid.T) {
	ctx := context.Background()
	mc := c.pick(t)
	fresh := c.fresh(mc)
	dry, err := c.a.issue.DryRun(ctx, fresh, mc.id)
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	shown, err := c.read(ctx, c.a.admin, mc.id)
	if err != nil {
		t.Fatalf("campaign show %s: %v", mc.id, err)
	}
	listed, err := c.a.consoleState(mc.id)
	if err != nil {
		t.Fatal(err)
	}
	if shown != listed || !stateFits(shown, dry) {
		t.Fatalf("%s at %s: campaign show says %s, the console %s, a fresh member's dry run %s %s (next release %v)",
			mc.id, c.a.clockAt.In(issuance.Tokyo).Format(time.RFC3339Nano), shown, listed, dry.Result, dry.Reason, dry.NextReleaseAt)
	}
	members := []string{fresh, c.cappedMember(t)}
	if mc.holder != "" {
		members = append(members, mc.holder)
	}
	if mc.audience {
		members = append(members, mc.id+"-outsider")
	}
	for _, m := range members {
		c.agreeOn(t, mc, m)
	}
}

// agreeOn compares, for member m of mc, the dry run, grant's pre-check and the issuance.
func (c *agreeCheck) agreeOn(t *rapid.T, mc *aCampaign, m string) {
	ctx := context.Background()
	dry, err := c.a.issue.DryRun(ctx, m, mc.id)
	if err != nil {
		t.Fatalf("dry run %s: %v", m, err)
	}
	pre, err := c.grantCheck(mc.id, m)
	if err != nil {
		t.Fatalf("grant_check %s: %v", m, err)
	}
	issue, by := c.a.issue.Issue, "IssueCoupon"
	if rapid.Bool().Draw(t, "by grant") {
		issue, by = c.a.grant.Grant, "grant"
	}
	out, err := issue(ctx, m, mc.id)
	if err != nil {
		t.Fatalf("%s %s: %v", by, m, err)
	}
	issued := issuance.Result(dry.Result)
	if issued == issuance.ResultAvailable {
		issued = issuance.ResultIssued
	}
	at := c.a.clockAt.In(issuance.Tokyo).Format(time.RFC3339Nano)
	switch {
	case pre.Result != dry.Result || pre.Reason != dry.Reason || !sameTime(pre.NextReleaseAt, dry.NextReleaseAt):
		t.Fatalf("%s of %s at %s: the dry run answered %s %s %v, grant's pre-check %s %s %v", m, mc.id, at,
			dry.Result, dry.Reason, dry.NextReleaseAt, pre.Result, pre.Reason, pre.NextReleaseAt)
	case out.Result != issued || out.Reason != dry.Reason ||
		(out.Result == issuance.ResultBudgetExceeded || out.Reason == issuance.ReasonNotStarted) && !sameTime(out.NextReleaseAt, dry.NextReleaseAt):
		t.Fatalf("%s of %s at %s: the dry run answered %s %s %v, %s then %s %s %v", m, mc.id, at,
			dry.Result, dry.Reason, dry.NextReleaseAt, by, out.Result, out.Reason, out.NextReleaseAt)
	case out.Result == issuance.ResultIssued && out.Month != issuance.Month(c.a.clockAt):
		t.Fatalf("%s of %s at %s: issued in month %s, the database's clock is in %s", m, mc.id, at, out.Month, issuance.Month(c.a.clockAt))
	}
	c.a.compared.Add(1)
	if out.Result == issuance.ResultIssued {
		mc.holder = m
	}
}

// stateFits says a campaign in state (campaign_state's code) answers a fresh member's dry run as
// dry: open with coupons AVAILABLE, sold out BUDGET_EXCEEDED with no release to come, waiting
// for a release BUDGET_EXCEEDED with one, otherwise CAMPAIGN_NOT_ACTIVE with the state's reason.
func stateFits(state string, dry issuance.DryRunOutcome) bool {
	switch dry.Result {
	case issuance.ResultAvailable:
		return state == campaign.StateActive
	case issuance.ResultBudgetExceeded:
		return state == campaign.StateSoldOut && dry.NextReleaseAt == nil || state == campaign.StateWaitingRelease && dry.NextReleaseAt != nil
	case issuance.ResultCampaignNotActive:
		switch dry.Reason {
		case issuance.ReasonPaused:
			return state == campaign.StatePaused
		case issuance.ReasonNotStarted:
			return state == campaign.StateNotStarted
		case issuance.ReasonEnded:
			return state == campaign.StateEnded || state == campaign.StateExpired
		}
	}
	return false
}

func sameTime(a, b *time.Time) bool {
	return a == nil && b == nil || a != nil && b != nil && a.Equal(*b)
}
