package lifecycletest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"pgregory.net/rapid"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/redemption"
)

// TestMain runs each test in a process of its own (pgtest.MainShards), side by side: most of
// their time is waits for an instant to pass, and each counts the batches its services ran in
// its process ([batches]), which a test beside it in the same process would add to.
func TestMain(m *testing.M) {
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { commandLine[f.Name] = true })
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(&batches)))
	pgtest.MainShards(m, []string{"TestLifecycle", "TestEveryPathAgrees"})
}

// batches counts the coalesced batches the services ran (their spans, issuance.BatchSpanName):
// each is one or more calls of issue_coupons_batch for two members or more.
var batches batchCounter

type batchCounter struct{ n atomic.Int64 }

func (b *batchCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (b *batchCounter) OnEnd(s sdktrace.ReadOnlySpan) {
	if s.Name() == issuance.BatchSpanName {
		b.n.Add(1)
	}
}
func (b *batchCounter) Shutdown(context.Context) error   { return nil }
func (b *batchCounter) ForceFlush(context.Context) error { return nil }

// TestLifecycle runs random life cycles against the newest schema and the services as deployed,
// comparing every answer and, after every step, the tables with the model (model_test.go).
// Its bounds keep it near 20 s on a 2-core machine, 30 s with a failure's shrinking
// (2026-12-02); -rapid.checks and -rapid.steps (or RAPID_CHECKS, RAPID_STEPS) run it longer,
// and -short half as long (6 checks), every step and judgement the same. rapid runs a fifth of
// -rapid.checks under -short: the bound set for it is 30.
func TestLifecycle(t *testing.T) {
	checks := "12"
	if testing.Short() {
		checks = "30"
	}
	rapidBounds(t, map[string]string{"rapid.checks": checks, "rapid.steps": "25", "rapid.shrinktime": "15s",
		"rapid.nofailfile": "true"})
	before := batches.n.Load()
	rapid.Check(t, lifecycle(newSystem(t, pgtest.URL(t))))
	if n := batches.n.Load() - before; n == 0 {
		t.Error("no burst went as a coalesced batch (issue_coupons_batch): the batch path was not tested")
	} else {
		t.Logf("%d coalesced batches (issue_coupons_batch)", n)
	}
}

// TestLifecycleFindsIssuanceAfterExpiry shows that the model finds the seam of issue 29: run
// against the broken variant, issue_coupons_batch_v2 judging the campaign's state without its
// coupons' fixed expiry (its rule before 00015_expiry.sql, pgtest.BlindToExpiry), which answers ISSUED past a campaign's coupons_expire_at, rapid must report a
// failure, and name the expiry. rapid stops at the first failing check: one check in about five
// found it (2026-12-02), so 150 checks leave it unfound with odds far below one in a million.
// rapid runs a fifth of -rapid.checks under -short (30 of 150 left it unfound once, 2026-12-07):
// the bound set for -short is 750, the same 150 checks.
func TestLifecycleFindsIssuanceAfterExpiry(t *testing.T) {
	checks := "150"
	if testing.Short() {
		checks = "750"
	}
	rapidBounds(t, map[string]string{"rapid.checks": checks, "rapid.steps": "25", "rapid.shrinktime": "5s",
		"rapid.nofailfile": "true"})
	sys := newSystem(t, pgtest.URL(t))
	pgtest.BlindToExpiry(t, sys.owner)
	report, failed := failures(t, lifecycle(sys))
	if !failed {
		t.Fatal("rapid found no failure with issuance blind to the coupons' expiry")
	}
	if !strings.Contains(report, expiredNote) {
		t.Fatalf("rapid failed for another reason than the expiry:\n%s", report)
	}
}

// TestLifecycleFindsDoubleRedemption shows that the model finds issue 41's double redemption:
// run against the broken variant, coupon_redeem reading the coupon without its lock and then
// updating it, a double submit redeems one coupon for every order, and rapid must report a
// failure naming the rule. A check finds it as soon as a double submit meets a free coupon.
func TestLifecycleFindsDoubleRedemption(t *testing.T) {
	rapidBounds(t, map[string]string{"rapid.checks": "100", "rapid.steps": "25", "rapid.shrinktime": "5s",
		"rapid.nofailfile": "true"})
	sys := newSystem(t, pgtest.URL(t))
	pgtest.BreakFunction(t, sys.owner, "coupon_redeem", [2]string{"\n     FOR NO KEY UPDATE;", ";"})
	report, failed := failures(t, lifecycle(sys))
	if !failed {
		t.Fatal("rapid found no failure with a redemption that reads before it locks")
	}
	if !strings.Contains(report, "double submit") && !strings.Contains(report, redeemedNote) {
		t.Fatalf("rapid failed for another reason than the double redemption:\n%s", report)
	}
}

// system is the real parts one test database offers, logged in as production logs in.
type system struct {
	owner     *pgxpool.Pool       // the database's owner: counts the tables
	admin     *pgxpool.Pool       // a login in coupon_admin, as couponctl's operator verbs run
	alone     *issuance.Service   // IssueCoupon's without coalescing (ISSUE_BATCH_MAX=1): batches of one
	coalesced *issuance.Service   // IssueCoupon's as deployed: a burst goes as issue_coupons_batch
	granter   *issuance.Service   // couponctl grant's, as coupon_admin: grant_coupons_batch
	redeemer  *redemption.Service // RedeemCoupon's, as coupon_redeem
	tb        *testing.T          // the test, for pgtest's polls (a failure there is the harness's)
}

func newSystem(t *testing.T, url string) *system {
	t.Helper()
	pool := func(u string) *pgxpool.Pool {
		p, err := pgxpool.New(context.Background(), u+"&pool_max_conns=12")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	service := func(p *pgxpool.Pool, batchMax int) *issuance.Service {
		svc, err := issuance.New(p, issuance.Config{BatchMax: batchMax})
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	s := &system{owner: pool(url), admin: pool(pgtest.LoginAs(t, url, "coupon_admin"))}
	// The model sets its instants, and judges each step, by this machine's clock; the database
	// judges them by its own (issue_now(), clock_timestamp()): they must be one clock.
	var dbNow time.Time
	t0 := time.Now()
	if err := s.owner.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	rtt := time.Since(t0)
	if skew := dbNow.Sub(t0.Add(rtt / 2)).Abs(); skew > guard/4+rtt/2 {
		t.Skipf("the database's clock is %s away from this machine's: the model needs one clock", skew)
	}
	issuer := pool(pgtest.LoginAs(t, url, "coupon_issue"))
	s.alone, s.coalesced, s.granter = service(issuer, 1), service(issuer, 0), service(s.admin, 1)
	var err error
	// A lock wait long enough for a double submit's orders to line up behind its holder.
	if s.redeemer, err = redemption.New(pool(pgtest.LoginAs(t, url, "coupon_redeem")),
		issuance.Config{Budget: issuance.AppTimeout, LockTimeout: 2 * time.Second, StatementTimeout: 2500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	s.tb = t
	return s
}

// lifecycle is the property: from one campaign, a random sequence of the actions below (but
// those named in leaveOut), each answer judged by the model, the tables compared after each.
func lifecycle(sys *system, leaveOut ...string) func(*rapid.T) {
	var checks atomic.Int64
	return func(t *rapid.T) {
		c := &check{sys: sys, m: newModel(fmt.Sprintf("lc%d", checks.Add(1)), 4)}
		c.create(t)
		actions := map[string]func(*rapid.T){
			"create": c.create, "issue": c.issue, "resend": c.resend, "burst": c.burst, "grant": c.grant,
			"void": c.void, "pause": c.pause, "resume": c.resume, "end": c.end, "budget": c.budget,
			"restripe": c.restripe, "period": c.period, "validity": c.validity, "wait": c.wait, "show": c.show,
			"redeem": c.redeem, "rollback": c.rollback, "double submit": c.doubleSubmit,
		}
		for _, name := range leaveOut {
			delete(actions, name)
		}
		for name, f := range actions {
			actions[name] = func(t *rapid.T) { c.settle(); f(t) }
		}
		actions[""] = c.tables
		t.Repeat(actions)
	}
}

// check is one life cycle: the system and the model of what it did.
type check struct {
	sys *system
	m   *model
}

// reason is every change's and void's --reason.
const reason = "model-based test"

// guard is how far from an instant of the model a step starts (settle): each step is judged at
// one side of each instant. A step that takes longer and passes one is judged at its start or
// at its end (when), whichever the answer agrees with.
const guard = 200 * time.Millisecond

// settle waits until no instant of the model is within guard of now.
func (c *check) settle() {
	for {
		now, until := time.Now(), time.Time{}
		for _, cp := range c.m.campaigns {
			for _, at := range cp.instants() {
				if now.After(at.Add(-guard)) && now.Before(at.Add(guard)) && at.Add(guard).After(until) {
					until = at.Add(guard)
				}
			}
		}
		if until.IsZero() {
			return
		}
		time.Sleep(time.Until(until))
	}
}

// when judges a step that ran from t0 to t1 with judge, at t0, and when an instant of the model
// passed meanwhile, at t1 if the answers disagree with t0; it returns the first disagreement when
// neither agrees.
func (c *check) when(t0, t1 time.Time, judge func(at time.Time) error) error {
	err := judge(t0)
	if err == nil {
		return nil
	}
	for _, cp := range c.m.campaigns {
		for _, at := range cp.instants() {
			if at.After(t0) && !at.After(t1) {
				if judge(t1) == nil {
					return nil
				}
				return err
			}
		}
	}
	return err
}

// drawInstant draws an instant named label among kinds: open (nil), an hour ago, soon (in 0.4,
// 0.8 or 1.2 s: the wait action lets it pass) or in an hour; in microseconds, as PostgreSQL keeps it.
func drawInstant(t *rapid.T, label string, kinds ...string) *time.Time {
	kind := rapid.SampledFrom(kinds).Draw(t, label)
	now := time.Now()
	var at time.Time
	switch kind {
	case "open":
		return nil
	case "an hour ago":
		at = now.Add(-time.Hour)
	case "soon":
		at = now.Add(rapid.SampledFrom([]time.Duration{400 * time.Millisecond, 800 * time.Millisecond,
			1200 * time.Millisecond}).Draw(t, label+" in"))
	case "in an hour":
		at = now.Add(time.Hour)
	}
	at = at.Truncate(time.Microsecond)
	return &at
}

func (c *check) create(t *rapid.T) {
	if len(c.m.campaigns) == 3 {
		t.Skip("three campaigns are enough")
	}
	d := rapid.SampledFrom([]int{1000, 500}).Draw(t, "discount_yen")
	coupons := rapid.IntRange(1, 5).Draw(t, "coupons")
	mc := &mCampaign{id: fmt.Sprintf("%s-c%d", c.m.prefix, len(c.m.campaigns)), discount: d,
		budget:  coupons*d + rapid.SampledFrom([]int{0, d / 2}).Draw(t, "spare_yen"),
		stripes: rapid.IntRange(1, min(3, coupons)).Draw(t, "stripes"),
		changes: 1} // its 'create' history row (campaign_create)
	mc.starts = drawInstant(t, "starts", "open", "an hour ago", "soon")
	mc.ends = drawInstant(t, "ends", "open", "soon", "in an hour")
	if mc.starts != nil && mc.ends != nil && !mc.starts.Before(*mc.ends) {
		e := mc.starts.Add(400 * time.Millisecond)
		mc.ends = &e
	}
	// An expiry soon is drawn more often than the others: its passing is where issue 29's seam is.
	switch rapid.SampledFrom([]string{"none", "valid days", "expires soon", "expires in an hour", "expires soon"}).Draw(t, "validity") {
	case "valid days":
		mc.validDays = rapid.IntRange(1, 3).Draw(t, "valid_days")
	case "expires soon":
		mc.expireAt = drawInstant(t, "expires", "soon")
	case "expires in an hour":
		mc.expireAt = drawInstant(t, "expires", "in an hour")
	}
	err := campaign.Create(context.Background(), c.sys.admin, campaign.Campaign{ID: mc.id, DiscountYen: d,
		BudgetYen: mc.budget, StartsAt: mc.starts, EndsAt: mc.ends, CouponValidDays: mc.validDays,
		CouponsExpireAt: mc.expireAt, Stripes: mc.stripes})
	if err != nil {
		c.fatalf(t, "create %s: %v", mc.id, err)
	}
	c.m.campaigns = append(c.m.campaigns, mc)
	c.m.byID[mc.id] = mc
	t.Logf("create %s: %d yen coupons, budget %d yen on %d stripes, period %s to %s, validity %d days or until %s",
		mc.id, d, mc.budget, mc.stripes, show(mc.starts), show(mc.ends), mc.validDays, show(mc.expireAt))
}

// pickCampaign draws one of the model's campaigns, or, with unknown, also an id that names none.
func (c *check) pickCampaign(t *rapid.T, unknown bool) *mCampaign {
	n := len(c.m.campaigns)
	if unknown {
		n++
	}
	i := rapid.IntRange(0, n-1).Draw(t, "campaign")
	if i == len(c.m.campaigns) {
		return &mCampaign{id: c.m.prefix + "-unknown"}
	}
	return c.m.campaigns[i]
}

func (c *check) pickMember(t *rapid.T) string {
	return rapid.SampledFrom(c.m.members).Draw(t, "member")
}

// request issues campaignID to member through svc (granted: Service.Grant) and judges the answer.
func (c *check) request(t *rapid.T, svc *issuance.Service, campaignID, member string, granted bool) {
	call := svc.Issue
	if granted {
		call = svc.Grant
	}
	t0 := time.Now()
	out, err := call(context.Background(), member, campaignID)
	t1 := time.Now()
	if err != nil {
		c.fatalf(t, "%s to %s: %v", campaignID, member, err)
	}
	var want answer
	if err := c.when(t0, t1, func(at time.Time) error {
		want = c.m.expect(campaignID, member, at)
		return c.m.compare(out, want)
	}); err != nil {
		t.Logf("  %s to %s: %+v, the model says %+v", campaignID, member, out, want)
		c.fatalf(t, "%s to %s: %v%s", campaignID, member, err, c.expiredNote(campaignID, t0))
	}
	if out.Result == issuance.ResultIssued {
		c.m.issued(out, campaignID, member, granted)
	}
	t.Logf("  %s to %s: %s%s %s", campaignID, member, out.Result, because(out.Reason), out.CouponID)
}

// fatalf fails the check with a message stable from one run of a sequence to the next, as
// rapid needs to shrink it (it compares the messages): the check's prefix, coupon ids and
// instants are left out of it (the steps' log has them).
func (c *check) fatalf(t *rapid.T, format string, args ...any) {
	msg := strings.ReplaceAll(fmt.Sprintf(format, args...), c.m.prefix+"-", "")
	msg = uuidRE.ReplaceAllString(msg, "<coupon>")
	t.Fatal(instantRE.ReplaceAllString(msg, "<instant>"))
}

var (
	uuidRE    = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	instantRE = regexp.MustCompile(`\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d(:?\d\d)?)?`)
)

// expiredNote is the words a failure adds when campaignID's fixed expiry has passed at at.
func (c *check) expiredNote(campaignID string, at time.Time) string {
	if mc := c.m.byID[campaignID]; mc != nil && mc.expireAt != nil && !at.Before(*mc.expireAt) {
		return " (" + expiredNote + ")"
	}
	return ""
}

// redeemedNote names, in a failure, the redemption's rule: one order holds a coupon at a time.
const redeemedNote = "one order holds a coupon at a time"

// expiredNote says, in a failure, that the campaign's coupons' fixed expiry had passed.
const expiredNote = "its coupons' fixed expiry had passed"

func (c *check) issue(t *rapid.T) {
	svc := c.sys.alone
	if rapid.Bool().Draw(t, "through the coalescing service") {
		svc = c.sys.coalesced
	}
	c.request(t, svc, c.pickCampaign(t, true).id, c.pickMember(t), false)
}

// resend sends a coupon's request again: the member's double tap or the app's re-send.
func (c *check) resend(t *rapid.T) {
	if len(c.m.coupons) == 0 {
		t.Skip("no coupon to ask again for")
	}
	cp := c.m.coupons[rapid.IntRange(0, len(c.m.coupons)-1).Draw(t, "coupon")]
	c.request(t, c.sys.coalesced, cp.campaign, cp.member, false)
}

func (c *check) grant(t *rapid.T) {
	c.request(t, c.sys.granter, c.pickCampaign(t, true).id, c.pickMember(t), true)
}

// burst sends 2 to 6 requests of one campaign at once, released together from a barrier,
// through the coalescing service: those that arrive while the first is in flight go as one
// issue_coupons_batch call. A member may be drawn twice: a double tap inside the batch.
func (c *check) burst(t *rapid.T) {
	mc := c.pickCampaign(t, true)
	members := rapid.SliceOfN(rapid.SampledFrom(c.m.members), 2, 6).Draw(t, "members")
	outs, errs := make([]issuance.Outcome, len(members)), make([]error, len(members))
	var wg sync.WaitGroup
	barrier := make(chan struct{})
	for i, mb := range members {
		wg.Go(func() {
			<-barrier
			outs[i], errs[i] = c.sys.coalesced.Issue(context.Background(), mb, mc.id)
		})
	}
	t0, batched := time.Now(), batches.n.Load()
	close(barrier)
	wg.Wait()
	t1 := time.Now()
	t.Logf("burst of %s to %v: %d coalesced batches", mc.id, members, batches.n.Load()-batched)
	if err := errors.Join(errs...); err != nil {
		c.fatalf(t, "burst of %s: %v", mc.id, err)
	}
	var issued []int
	if err := c.when(t0, t1, func(at time.Time) (err error) {
		issued, err = c.m.judgeBurst(mc.id, members, outs, at)
		return err
	}); err != nil {
		for i, mb := range members {
			t.Logf("  %s to %s: %+v", mc.id, mb, outs[i])
		}
		c.fatalf(t, "burst of %s to %v: %v%s", mc.id, members, err, c.expiredNote(mc.id, t0))
	}
	for _, i := range issued {
		c.m.issued(outs[i], mc.id, members[i], false)
	}
	for i, mb := range members {
		t.Logf("  %s to %s: %s%s %s", mc.id, mb, outs[i].Result, because(outs[i].Reason), outs[i].CouponID)
	}
}

func (c *check) void(t *rapid.T) {
	if len(c.m.coupons) == 0 {
		t.Skip("no coupon to void")
	}
	cp := c.m.coupons[rapid.IntRange(0, len(c.m.coupons)-1).Draw(t, "coupon")]
	allow := rapid.Bool().Draw(t, "allow reissue")
	v, err := coupon.Void(context.Background(), c.sys.admin, cp.id, reason, allow)
	t.Logf("void %s of %s to %s (allow reissue %t): %v", cp.id, cp.campaign, cp.member, allow, err)
	switch c.m.void(cp, allow) {
	case voidVoids:
		if err != nil {
			c.fatalf(t, "void %s: %v, the model says VOIDED", cp.id, err)
		}
		if v.AmountYen != cp.amount || v.Month != cp.month {
			c.fatalf(t, "void %s: gave back %d yen of %s, the model says %d yen of %s", cp.id, v.AmountYen, v.Month, cp.amount, cp.month)
		}
	case voidCorrects:
		if err != nil {
			c.fatalf(t, "void %s: %v, the model says the void without reissue is corrected", cp.id, err)
		}
	case voidRefused:
		if !errors.Is(err, coupon.ErrRefused) {
			c.fatalf(t, "void %s: %v, the model says refused: voided already", cp.id, err)
		}
	}
}

// orders are the cart's orders a check draws from.
var orders = []string{"ORDER-1", "ORDER-2", "ORDER-3"}

// pickCoupon draws one of the model's coupons, and the member who presents it: its own, or
// (rarely) another of the check's members.
func (c *check) pickCoupon(t *rapid.T) (*mCoupon, string) {
	if len(c.m.coupons) == 0 {
		t.Skip("no coupon to redeem")
	}
	cp := c.m.coupons[rapid.IntRange(0, len(c.m.coupons)-1).Draw(t, "coupon")]
	member := cp.member
	if rapid.IntRange(0, 9).Draw(t, "another member presents it") == 0 {
		member = rapid.SampledFrom(c.m.members).Draw(t, "presenter")
	}
	return cp, member
}

// redeem redeems a drawn coupon for a drawn order, as the cart does at checkout.
func (c *check) redeem(t *rapid.T) {
	cp, member := c.pickCoupon(t)
	order := rapid.SampledFrom(orders).Draw(t, "order")
	t0 := time.Now()
	out, err := c.sys.redeemer.Do(context.Background(), redemption.Request{Action: redemption.Redeem, CouponID: cp.id, MemberID: member, OrderID: order})
	t1 := time.Now()
	t.Logf("redeem %s of %s by %s for %s: %+v %v", cp.id, cp.member, member, order, out, err)
	if err != nil {
		c.fatalf(t, "redeem: %v", err)
	}
	var want redemption.Result
	if err := c.when(t0, t1, func(at time.Time) error {
		if want = cp.redeemAnswer(member, order, at); want == redemption.ResultValid {
			want = redemption.ResultRedeemed
		}
		if out.Result != want {
			return fmt.Errorf("answered %s, the model says %s", out.Result, want)
		}
		return nil
	}); err != nil {
		c.fatalf(t, "redeem of a coupon %s: %v", c.couponNote(cp), err)
	}
	if want == redemption.ResultRedeemed && cp.heldBy == "" {
		cp.redeemed(order)
	}
}

// rollback rolls back a drawn order's redemption of a drawn coupon, as a cancelled order does.
func (c *check) rollback(t *rapid.T) {
	cp, member := c.pickCoupon(t)
	order := rapid.SampledFrom(orders).Draw(t, "order")
	t0 := time.Now()
	out, err := c.sys.redeemer.Do(context.Background(), redemption.Request{Action: redemption.Rollback, CouponID: cp.id,
		MemberID: member, OrderID: order, Reason: reason})
	t1 := time.Now()
	t.Logf("rollback %s of %s by %s for %s: %+v %v", cp.id, cp.member, member, order, out, err)
	if err != nil {
		c.fatalf(t, "rollback: %v", err)
	}
	if err := c.when(t0, t1, func(at time.Time) error {
		want, usable := cp.rollbackAnswer(member, order, at)
		if out.Result != want || out.Usable != usable {
			return fmt.Errorf("answered %s (usable %t), the model says %s (usable %t)", out.Result, out.Usable, want, usable)
		}
		return nil
	}); err != nil {
		c.fatalf(t, "rollback of a coupon %s: %v", c.couponNote(cp), err)
	}
	if cp.heldBy == order && member == cp.member {
		cp.rolledBackBy(order)
	}
}

// doubleSubmit redeems a drawn coupon for 2 to 3 orders at once: each call waits behind a
// holder of the coupon's row until all wait, then all go (the double submit of issue 41). Of
// orders that find the coupon free, exactly one redeems it.
func (c *check) doubleSubmit(t *rapid.T) {
	cp, _ := c.pickCoupon(t)
	subs := rapid.SliceOfNDistinct(rapid.SampledFrom(orders), 2, 3, rapid.ID[string]).Draw(t, "orders")
	ctx := context.Background()
	tx, err := c.sys.owner.Begin(ctx)
	if err != nil {
		c.fatalf(t, "double submit: %v", err)
	}
	defer tx.Rollback(ctx)
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM issued_coupons WHERE coupon_id = $1 FOR UPDATE`, cp.id).Scan(&pid); err != nil {
		c.fatalf(t, "double submit: hold the coupon: %v", err)
	}
	outs, errs := make([]redemption.Outcome, len(subs)), make([]error, len(subs))
	var wg sync.WaitGroup
	var done atomic.Int64
	for i, o := range subs {
		wg.Go(func() {
			outs[i], errs[i] = c.sys.redeemer.Do(ctx, redemption.Request{Action: redemption.Redeem, CouponID: cp.id, MemberID: cp.member, OrderID: o})
			done.Add(1)
		})
	}
	// Every call waits behind the holder, or has answered without a write (a variant that
	// judges before it locks answers a coupon it refuses at once).
	pgtest.Eventually(c.sys.tb, pgtest.PollTimeout, func() error {
		if n, d := len(pgtest.WaitersOf(c.sys.tb, c.sys.owner, pid)), int(done.Load()); n+d != len(subs) {
			return fmt.Errorf("%d calls wait behind the holder and %d answered, of %d", n, d, len(subs))
		}
		return nil
	})
	t0 := time.Now()
	if err := tx.Rollback(ctx); err != nil {
		c.fatalf(t, "double submit: release the coupon: %v", err)
	}
	wg.Wait()
	t1 := time.Now()
	t.Logf("double submit of %s for %v: %+v", cp.id, subs, outs)
	if err := errors.Join(errs...); err != nil {
		c.fatalf(t, "double submit: %v", err)
	}
	winner := ""
	if err := c.when(t0, t1, func(at time.Time) error {
		winner = ""
		for i, o := range subs {
			want := cp.redeemAnswer(cp.member, o, at)
			if want == redemption.ResultValid && winner == "" && outs[i].Result == redemption.ResultRedeemed {
				winner = o // the first to find it free; the others find it held
				continue
			}
			if want == redemption.ResultValid {
				want = redemption.ResultAlreadyRedeemed
			}
			if outs[i].Result != want {
				return fmt.Errorf("order %s answered %s, the model says %s", o, outs[i].Result, want)
			}
		}
		if winner == "" && cp.usable(at) == redemption.ResultValid && !allRolledBack(cp, subs) {
			return errors.New("no order redeemed the free coupon")
		}
		return nil
	}); err != nil {
		c.fatalf(t, "double submit of a coupon %s: %v", c.couponNote(cp), err)
	}
	if winner != "" {
		cp.redeemed(winner)
	}
}

// allRolledBack reports whether every one of orders rolled back its redemption of cp: none of
// them may redeem it.
func allRolledBack(cp *mCoupon, orders []string) bool {
	for _, o := range orders {
		if !cp.rolledBack[o] {
			return false
		}
	}
	return true
}

// couponNote is a coupon's state in the model, for a failure's message.
func (c *check) couponNote(cp *mCoupon) string {
	switch {
	case cp.heldBy != "":
		return "held by an order"
	case cp.voided:
		return "voided"
	}
	return "free"
}

// stateChange runs a pause, resume or end of a drawn campaign and judges it: want is, at the
// change's time, whether it changes the campaign (errRefused when it must be refused); apply
// applies it to the model, given the history row.
func (c *check) stateChange(t *rapid.T, what string, verb func(context.Context, campaign.Querier, string, string) (*campaign.Change, error),
	want func(mc *mCampaign, at time.Time) (bool, error), apply func(mc *mCampaign, ch *campaign.Change)) {
	mc := c.pickCampaign(t, false)
	t0 := time.Now()
	ch, err := verb(context.Background(), c.sys.admin, mc.id, reason)
	t1 := time.Now()
	t.Logf("%s %s: %v", what, mc.id, err)
	if jerr := c.when(t0, t1, func(at time.Time) error {
		changes, werr := want(mc, at)
		switch {
		case werr != nil && !errors.Is(err, campaign.ErrRefused):
			return fmt.Errorf("%s %s: %v, the model says refused", what, mc.id, err)
		case werr == nil && err != nil:
			return fmt.Errorf("%s %s: %v", what, mc.id, err)
		case werr == nil && changes != (ch != nil):
			return fmt.Errorf("%s %s: changed %t, the model says %t", what, mc.id, ch != nil, changes)
		}
		return nil
	}); jerr != nil {
		c.fatalf(t, "%v", jerr)
	}
	if ch != nil {
		apply(mc, ch)
		mc.changes++
	}
}

// pause pauses a campaign: refused once it has ended (campaign_refuse_ended), nothing when it is
// paused.
func (c *check) pause(t *rapid.T) {
	c.stateChange(t, "pause", campaign.Pause, func(mc *mCampaign, at time.Time) (bool, error) {
		if mc.inactive(at) == issuance.ReasonEnded {
			return false, errRefused
		}
		return !mc.paused, nil
	}, func(mc *mCampaign, _ *campaign.Change) { mc.paused = true })
}

// resume resumes a campaign: refused once it has ended, nothing when it is not paused.
func (c *check) resume(t *rapid.T) {
	c.stateChange(t, "resume", campaign.Resume, func(mc *mCampaign, at time.Time) (bool, error) {
		if mc.inactive(at) == issuance.ReasonEnded {
			return false, errRefused
		}
		return mc.paused, nil
	}, func(mc *mCampaign, _ *campaign.Change) { mc.paused = false })
}

// end ends a campaign now: refused before it starts and at its start instant, nothing when it has ended, else its
// ends_at becomes the change's time.
func (c *check) end(t *rapid.T) {
	c.stateChange(t, "end", campaign.End, func(mc *mCampaign, at time.Time) (bool, error) {
		if mc.starts != nil && !mc.starts.Before(at) { // at its start instant too: no empty period
			return false, errRefused
		}
		return mc.ends == nil || mc.ends.After(at), nil
	}, func(mc *mCampaign, ch *campaign.Change) { e := ch.At; mc.ends = &e })
}

// update runs campaign.Update of a campaign with ch and judges it: rows is how many history rows
// the model says it writes, or errRefused.
func (c *check) update(t *rapid.T, mc *mCampaign, ch campaign.Changes, rows int, werr error) {
	got, err := c.updated(mc, ch)
	if jerr := judgeUpdate(mc, got, err, rows, werr); jerr != nil {
		c.fatalf(t, "%v", jerr)
	}
}

// updated runs campaign.Update of mc with ch and returns its history rows and error.
func (c *check) updated(mc *mCampaign, ch campaign.Changes) ([]campaign.Change, error) {
	ch.Reason = reason
	return campaign.Update(context.Background(), c.sys.admin, mc.id, ch)
}

// judgeUpdate compares an update's history rows got and error err with the model's rows and
// werr.
func judgeUpdate(mc *mCampaign, got []campaign.Change, err error, rows int, werr error) error {
	switch {
	case werr != nil && !errors.Is(err, campaign.ErrRefused):
		return fmt.Errorf("update %s: %v, the model says refused", mc.id, err)
	case werr == nil && err != nil:
		return fmt.Errorf("update %s: %v", mc.id, err)
	case werr == nil && len(got) != rows:
		return fmt.Errorf("update %s: %d history rows, the model says %d", mc.id, len(got), rows)
	}
	return nil
}

// budget raises or cuts a campaign's budget by whole or half coupons.
func (c *check) budget(t *rapid.T) {
	mc := c.pickCampaign(t, false)
	add := rapid.SampledFrom([]int{-2, -1, 1, 2}).Draw(t, "add coupons")*mc.discount +
		rapid.SampledFrom([]int{0, mc.discount / 2}).Draw(t, "add spare yen")
	t.Logf("budget %s: add %d yen to %d (%d issued)", mc.id, add, mc.budget, mc.issued)
	add64 := int64(add)
	c.budgetUpdate(t, mc, campaign.Changes{AddBudgetYen: &add64}, add, 0)
}

func (c *check) restripe(t *rapid.T) {
	mc := c.pickCampaign(t, false)
	k := rapid.IntRange(1, 4).Draw(t, "stripes")
	t.Logf("restripe %s: %d stripes to %d (budget %d yen)", mc.id, mc.stripes, k, mc.budget)
	c.budgetUpdate(t, mc, campaign.Changes{Stripes: &k}, 0, k)
}

// budgetUpdate runs a budget or stripes change ch of mc (add yen, k stripes) and judges it at
// the change's time: refused once the campaign has ended (campaign_refuse_ended).
func (c *check) budgetUpdate(t *rapid.T, mc *mCampaign, ch campaign.Changes, add, k int) {
	t0 := time.Now()
	got, err := c.updated(mc, ch)
	t1 := time.Now()
	t.Logf("  %d history rows, %v", len(got), err)
	var plan budgetPlan
	if jerr := c.when(t0, t1, func(at time.Time) error {
		var werr error
		plan, werr = mc.budgetChange(add, k, at)
		return judgeUpdate(mc, got, err, plan.rows, werr)
	}); jerr != nil {
		c.fatalf(t, "%v", jerr)
	}
	if err == nil {
		mc.apply(plan)
	}
}

// period moves a campaign's start, its end or both.
func (c *check) period(t *rapid.T) {
	mc := c.pickCampaign(t, false)
	ch := campaign.Changes{SetStarts: rapid.Bool().Draw(t, "move starts")}
	ch.SetEnds = !ch.SetStarts || rapid.Bool().Draw(t, "move ends")
	starts, ends := mc.starts, mc.ends
	if ch.SetStarts {
		ch.StartsAt = drawInstant(t, "starts", "open", "an hour ago", "soon")
		starts = ch.StartsAt
	}
	if ch.SetEnds {
		ch.EndsAt = drawInstant(t, "ends", "open", "soon", "in an hour")
		ends = ch.EndsAt
	}
	t.Logf("period %s: %s to %s", mc.id, show(starts), show(ends))
	if starts != nil && ends != nil && !starts.Before(*ends) {
		c.update(t, mc, ch, 0, errRefused)
		return
	}
	rows := 0
	if !sameInstant(starts, mc.starts) || !sameInstant(ends, mc.ends) {
		rows = 1
	}
	c.update(t, mc, ch, rows, nil)
	mc.starts, mc.ends = starts, ends
	mc.changes += rows
}

// validity changes the validity a campaign gives the coupons issued from now on (campaign
// update --coupon-valid-days or --coupons-expire): days, a fixed expiry, or none.
func (c *check) validity(t *rapid.T) {
	mc := c.pickCampaign(t, false)
	ch := campaign.Changes{SetValidity: true}
	switch rapid.SampledFrom([]string{"none", "valid days", "expires soon", "expires in an hour"}).Draw(t, "validity") {
	case "valid days":
		ch.ValidDays = rapid.IntRange(1, 3).Draw(t, "valid_days")
	case "expires soon":
		ch.ExpireAt = drawInstant(t, "expires", "soon")
	case "expires in an hour":
		ch.ExpireAt = drawInstant(t, "expires", "in an hour")
	}
	t.Logf("validity %s: %d days or until %s", mc.id, ch.ValidDays, show(ch.ExpireAt))
	rows := 0
	if ch.ValidDays != mc.validDays || !sameInstant(ch.ExpireAt, mc.expireAt) {
		rows = 1
	}
	c.update(t, mc, ch, rows, nil)
	mc.validDays, mc.expireAt = ch.ValidDays, ch.ExpireAt
	mc.changes += rows
}

// wait lets the model's next instant pass, if one comes within 2 s.
func (c *check) wait(t *rapid.T) {
	now := time.Now()
	var next time.Time
	for _, mc := range c.m.campaigns {
		for _, at := range mc.instants() {
			if at.After(now) && at.Before(now.Add(2*time.Second)) && (next.IsZero() || at.Before(next)) {
				next = at
			}
		}
	}
	if next.IsZero() {
		t.Logf("wait: nothing due")
		return
	}
	time.Sleep(time.Until(next.Add(guard)))
	t.Logf("wait: %s passed", show(&next))
}

// show reads a campaign as `couponctl campaign show` does, its state included.
func (c *check) show(t *rapid.T) {
	mc := c.pickCampaign(t, false)
	t0 := time.Now()
	s, err := campaign.Show(context.Background(), c.sys.admin, mc.id)
	if err != nil {
		c.fatalf(t, "show %s: %v", mc.id, err)
	}
	t.Logf("show %s: %s at %s", mc.id, s.State, show(&s.At))
	got := fmt.Sprintf("%d yen coupons, budget %d, issued %d, %d stripes, period %s to %s, paused %t, validity %d days or until %s",
		s.DiscountYen, s.BudgetYen, s.IssuedYen, s.Stripes, show(s.StartsAt), show(s.EndsAt), s.PausedAt != nil,
		s.CouponValidDays, show(s.CouponsExpireAt))
	want := fmt.Sprintf("%d yen coupons, budget %d, issued %d, %d stripes, period %s to %s, paused %t, validity %d days or until %s",
		mc.discount, mc.budget, mc.issued, mc.stripes, show(mc.starts), show(mc.ends), mc.paused, mc.validDays, show(mc.expireAt))
	if got != want {
		c.fatalf(t, "show %s:\n  %s\nthe model says\n  %s", mc.id, got, want)
	}
	if want := mc.state(s.At); s.State != want {
		c.fatalf(t, "show %s: state %s at the database's %s, the model says %s%s", mc.id, s.State, show(&s.At), want, c.expiredNote(mc.id, t0))
	}
}

// campaignSums is what the tables hold of one campaign.
type campaignSums struct {
	BudgetYen, IssuedYen, Stripes int // campaign_budgets, summed over the stripes
	// Definitions is how many different definitions its stripes hold (discount, period, pause,
	// validity): one, since every stripe carries the campaign's definition alike.
	Definitions     int
	CampaignsBudget int // campaigns.budget_yen
	OutboxRows      int
	HistoryRows     int
}

const sqlCampaignSums = `
SELECT b.campaign_id, sum(b.budget_yen)::int, sum(b.issued_yen)::int, count(*)::int,
       count(DISTINCT format('%s|%s|%s|%s|%s|%s', b.discount_yen, b.starts_at, b.ends_at, b.paused_at,
                             b.coupon_valid_days, b.coupons_expire_at))::int,
       (SELECT c.budget_yen FROM campaigns c WHERE c.campaign_id = b.campaign_id),
       (SELECT count(*) FROM notification_outbox o JOIN issued_coupons i USING (coupon_id)
         WHERE i.campaign_id = b.campaign_id)::int,
       (SELECT count(*) FROM campaign_changes h WHERE h.campaign_id = b.campaign_id)::int
  FROM campaign_budgets b WHERE b.campaign_id = ANY($1) GROUP BY b.campaign_id`

const sqlCoupons = `
SELECT i.coupon_id::text, i.campaign_id, i.member_id, i.month, i.amount_yen, i.expires_at, i.granted_by IS NOT NULL,
       i.voided_at IS NOT NULL, i.reissue_allowed,
       CASE WHEN i.redeemed_at IS NOT NULL THEN coalesce((SELECT r.order_id FROM coupon_redemptions r
                 WHERE r.coupon_id = i.coupon_id ORDER BY r.redemption_id DESC LIMIT 1), '(no history)') ELSE '' END,
       (SELECT count(*) FROM coupon_redemptions r WHERE r.coupon_id = i.coupon_id)::int
  FROM issued_coupons i WHERE i.campaign_id = ANY($1)`

const sqlUsage = `SELECT member_id, month, used_yen FROM member_monthly_usage WHERE member_id = ANY($1) AND used_yen <> 0`

// tables compares the tables, counted with SQL, with the model: per campaign the budget, the
// issued yen (R1), the stripes, their definition, the outbox rows and the history rows; every
// coupon with its state (so the live coupons per pair, R2); the used yen per member and month (R3).
func (c *check) tables(t *rapid.T) {
	ctx := context.Background()
	ids := []string{c.m.prefix + "-unknown"}
	want := map[string]campaignSums{}
	for _, mc := range c.m.campaigns {
		ids = append(ids, mc.id)
		want[mc.id] = campaignSums{BudgetYen: mc.budget, IssuedYen: mc.issued, Stripes: mc.stripes, Definitions: 1,
			CampaignsBudget: mc.budget, HistoryRows: mc.changes}
	}
	for _, cp := range c.m.coupons {
		s := want[cp.campaign]
		s.OutboxRows++
		want[cp.campaign] = s
	}
	got := map[string]campaignSums{}
	rows, err := c.sys.owner.Query(ctx, sqlCampaignSums, ids)
	if err != nil {
		c.fatalf(t, "tables: %v", err)
	}
	for rows.Next() {
		var id string
		var s campaignSums
		if err := rows.Scan(&id, &s.BudgetYen, &s.IssuedYen, &s.Stripes, &s.Definitions, &s.CampaignsBudget,
			&s.OutboxRows, &s.HistoryRows); err != nil {
			c.fatalf(t, "tables: %v", err)
		}
		got[id] = s
	}
	if rows.Err() != nil {
		c.fatalf(t, "tables: %v", rows.Err())
	}
	for _, id := range ids {
		if got[id] != want[id] {
			c.fatalf(t, "tables: campaign %s: %+v, the model says %+v", id, got[id], want[id])
		}
	}
	c.couponTables(t, ids)
	c.usageTable(t)
}

// couponTables compares issued_coupons of the check's campaigns with the model's coupons.
func (c *check) couponTables(t *rapid.T, ids []string) {
	rows, err := c.sys.owner.Query(context.Background(), sqlCoupons, ids)
	if err != nil {
		c.fatalf(t, "tables: %v", err)
	}
	seen := 0
	for rows.Next() {
		var g mCoupon
		if err := rows.Scan(&g.id, &g.campaign, &g.member, &g.month, &g.amount, &g.expires, &g.granted, &g.voided,
			&g.reissue, &g.heldBy, &g.history); err != nil {
			c.fatalf(t, "tables: %v", err)
		}
		w := c.m.coupon(g.id)
		if w == nil {
			c.fatalf(t, "tables: coupon %s of %s to %s (voided %t) is not in the model", g.id, g.campaign, g.member, g.voided)
		}
		seen++
		if g.campaign != w.campaign || g.member != w.member || g.month != w.month || g.amount != w.amount ||
			!sameInstant(g.expires, w.expires) || g.granted != w.granted || g.voided != w.voided || g.reissue != w.reissue {
			c.fatalf(t, "tables: coupon %s: %s to %s, %d yen in %s, expires %s, granted %t, voided %t, reissue %t; the model says "+
				"%s to %s, %d yen in %s, expires %s, granted %t, voided %t, reissue %t", g.id,
				g.campaign, g.member, g.amount, g.month, show(g.expires), g.granted, g.voided, g.reissue,
				w.campaign, w.member, w.amount, w.month, show(w.expires), w.granted, w.voided, w.reissue)
		}
		if g.heldBy != w.heldBy || g.history != w.history {
			c.fatalf(t, "tables: coupon %s: held by order %q with %d history rows; the model says %q with %d (%s)", g.id,
				g.heldBy, g.history, w.heldBy, w.history, redeemedNote)
		}
	}
	if rows.Err() != nil {
		c.fatalf(t, "tables: %v", rows.Err())
	}
	if seen != len(c.m.coupons) {
		c.fatalf(t, "tables: %d coupons, the model says %d", seen, len(c.m.coupons))
	}
}

// usageTable compares member_monthly_usage of the check's members with the model's (R3).
func (c *check) usageTable(t *rapid.T) {
	rows, err := c.sys.owner.Query(context.Background(), sqlUsage, c.m.members)
	if err != nil {
		c.fatalf(t, "tables: %v", err)
	}
	got := map[memberMonth]int{}
	for rows.Next() {
		var k memberMonth
		var yen int
		if err := rows.Scan(&k.member, &k.month, &yen); err != nil {
			c.fatalf(t, "tables: %v", err)
		}
		got[k] = yen
	}
	if rows.Err() != nil {
		c.fatalf(t, "tables: %v", rows.Err())
	}
	for k, yen := range c.m.usage {
		if yen != 0 && got[k] != yen {
			c.fatalf(t, "tables: %s used %d yen in %s, the model says %d", k.member, got[k], k.month, yen)
		}
		delete(got, k)
	}
	for k, yen := range got {
		c.fatalf(t, "tables: %s used %d yen in %s, the model says none", k.member, yen, k.month)
	}
}

// commandLine is the flags the test binary's command line sets (TestMain reads them before
// any test sets one).
var commandLine = map[string]bool{}

// rapidBounds sets rapid's flags for one test, each unless the command line or the environment
// (RAPID_CHECKS, ...) gives it, and puts them back when t ends.
func rapidBounds(t *testing.T, bounds map[string]string) {
	t.Helper()
	for name, v := range bounds {
		env := "RAPID_" + strings.ToUpper(strings.TrimPrefix(name, "rapid."))
		if _, ok := os.LookupEnv(env); ok || commandLine[name] {
			continue
		}
		old := flag.Lookup(name).Value.String()
		if err := flag.Set(name, v); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = flag.Set(name, old) })
	}
}

// failures runs rapid.Check of prop with a [recorder] for t, and returns what rapid reported
// and whether it reported a failure.
func failures(t *testing.T, prop func(*rapid.T)) (string, bool) {
	r := &recorder{T: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != (stopCheck{}) {
				panic(p)
			}
		}()
		rapid.Check(r, prop)
	}()
	return r.log.String(), r.failed
}

// recorder is a rapid.TB that records what rapid reports, and logs it on its test, instead of
// failing the test: a test can then assert that rapid found a failure. Its FailNow ends
// rapid.Check with a panic of stopCheck, which [failures] recovers.
type recorder struct {
	*testing.T
	failed bool
	log    strings.Builder
}

type stopCheck struct{}

func (r *recorder) Fail()        { r.failed = true }
func (r *recorder) Failed() bool { return r.failed }
func (r *recorder) FailNow() {
	r.failed = true
	panic(stopCheck{})
}
func (r *recorder) Log(args ...any)                 { r.record(fmt.Sprintln(args...)) }
func (r *recorder) Logf(format string, args ...any) { r.record(fmt.Sprintf(format, args...) + "\n") }
func (r *recorder) Error(args ...any)               { r.Log(args...); r.Fail() }
func (r *recorder) Errorf(format string, args ...any) {
	r.Logf(format, args...)
	r.Fail()
}
func (r *recorder) Fatal(args ...any) { r.Log(args...); r.FailNow() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.Logf(format, args...)
	r.FailNow()
}

func (r *recorder) record(s string) {
	r.log.WriteString(s)
	r.T.Log("rapid: " + strings.TrimSuffix(s, "\n"))
}
