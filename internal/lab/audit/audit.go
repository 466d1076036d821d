// Package audit checks an answer log (internal/lab/answerlog) against the tables the service wrote:
// what IssueCoupon told its callers must agree with what it committed. `couponctl audit` and
// `couponctl drill` run it after the traffic has stopped.
//
// What it checks, each a violation when it fails:
//
//   - every answer is in the contract (docs/api.md) for a well-formed request;
//   - every answer came within the app's timeout ([issuance.AppTimeout], 3 s), a transport error
//     after it included (the caller gave up);
//   - every ISSUED and ALREADY_ISSUED names a coupon that exists in issued_coupons, belongs to the
//     answer's (campaign, member), is not a legacy duplicate, and was live when the request was
//     sent (an operator may void it later: couponctl coupon void);
//     no two ISSUED answers name the same coupon (each request makes its own coupon id);
//   - no refusal is contradicted by the final tables (see below);
//   - every ISSUED came while the campaign's history shows it active: no coupon commits while a
//     campaign is paused, ended or not started;
//   - every live coupon of a (campaign, member) pair of the log was answered ISSUED to one of its
//     requests, unless one of them got an indeterminate answer or the coupon predates the log
//     (issued_at before the log's first send time less [Config.ClockSkew]; within the skew
//     around that time, an ALREADY_ISSUED answer with its id also explains it: see checkPairs);
//   - R1-R3, the counters and one outbox row per coupon, by SQL (internal/ops/reconcile).
//
// Refusals are checked only where the final state proves them wrong whenever they were answered.
// That holds because the counters only grow while the traffic runs (the issuance adds to them;
// `couponctl reconcile --repair` lowers one, and a void gives a coupon's yen back, stamped with
// its voided_at), every change of a budget, a period or a pause is in the campaign's history
// (campaign_changes), and campaigns are never deleted:
//
//   - UNKNOWN_CAMPAIGN for a campaign that exists and was created more than [Config.ClockSkew]
//     before the request was sent;
//   - CAMPAIGN_NOT_ACTIVE for a campaign that does not exist, or that its history shows active
//     throughout the time from sending to the answer, widened by the clock skew, or never in
//     the answer's reason (NOT_STARTED, ENDED, PAUSED) during it; a campaign with releases is
//     also NOT_STARTED before its first release;
//   - BUDGET_EXCEEDED for a campaign that does not exist, or one of whose budget stripes still
//     has room for one more coupon in the final counters, when its budget and stripes have not
//     changed and none of its coupons was voided since the request was sent (not for a campaign
//     with releases, which refuses by what was released when: the final stripes do not say);
//   - COUPON_VOIDED naming a coupon that is not its pair's, or was not voided by the answer;
//   - MONTHLY_CAP for a campaign that does not exist, or when the member's final used_yen for
//     the month plus the campaign's discount still fits under the cap, when none of the
//     member's coupons of that month was voided since the request was sent. The month is the
//     Asia/Tokyo month of the request, which the service decides from its own clock: an answer
//     whose time, widened by the clock skew, spans two months is not checked.
//
// What it cannot check: that a refusal was right at the moment it was answered (the state in
// between is gone); that RETRY_EXHAUSTED wrote nothing, except through the pair check above;
// what an indeterminate answer (a transport error, a 5xx other than 503 RETRY_EXHAUSTED) did:
// those are reported with whether their pair holds a coupon now, not judged. The pair check
// assumes the log holds every request sent for its pairs while it ran, as it does for
// `couponctl load` and `couponctl drill`, whose member ids are their run's own (a load re-run
// with an earlier run's seed sends that run's pairs again, after it: their coupons predate the
// log); a coupon written by a request of the log's first second (the clock skew) that another
// request was answered ALREADY_ISSUED for is taken for older than the log.
package audit

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/lab/answerlog"
	"github.com/mops/coupon-api/shared/issuance"
)

// DefaultClockSkew is how far apart the clocks of the client that wrote the log, the service and
// the database may be, for the checks that compare the log's times with the tables': on one
// machine they are one clock; NTP keeps Cloud Run and Cloud SQL within milliseconds.
const DefaultClockSkew = time.Second

// maxExamples bounds the lines a failed check lists, so that a run that lost thousands of
// coupons still prints a readable report; the count is always whole.
const maxExamples = 100

// Config says what to audit against.
type Config struct {
	// AnswerBound is how long the caller waits for an answer. Default [issuance.AppTimeout].
	AnswerBound time.Duration
	// ClockSkew widens the times compared with the tables. Default [DefaultClockSkew].
	ClockSkew time.Duration
}

func (c Config) withDefaults() Config {
	c.AnswerBound = cmp.Or(c.AnswerBound, issuance.AppTimeout)
	c.ClockSkew = cmp.Or(c.ClockSkew, DefaultClockSkew)
	return c
}

// Class is what an answer tells its caller.
type Class int

const (
	// Determinate answers are in the contract: the caller knows what happened.
	Determinate Class = iota
	// Indeterminate answers leave the caller not knowing whether a coupon was written: no
	// answer (a transport error), or a 5xx other than 503 RETRY_EXHAUSTED.
	Indeterminate
	// Outside answers are neither: a status or result docs/api.md does not give a well-formed
	// request.
	Outside
)

// contract is the status docs/api.md answers each result with, for a well-formed request.
var contract = map[string]int{
	string(issuance.ResultIssued):            http.StatusCreated,
	string(issuance.ResultAlreadyIssued):     http.StatusOK,
	string(issuance.ResultMonthlyCap):        http.StatusConflict,
	string(issuance.ResultBudgetExceeded):    http.StatusConflict,
	string(issuance.ResultCampaignNotActive): http.StatusConflict,
	string(issuance.ResultCouponVoided):      http.StatusConflict,
	string(issuance.ResultNotEligible):       http.StatusForbidden,
	string(issuance.ResultUnknownCampaign):   http.StatusNotFound,
	string(issuance.ResultRetryExhausted):    http.StatusServiceUnavailable,
}

// Classify says what an answer with HTTP status (0: none) and body result tells the caller.
// Cloud Run's 429, whatever its body, is determinate: the function did not run (docs/api.md: treat
// it as RETRY_EXHAUSTED).
func Classify(status int, result string) Class {
	switch {
	case status == 0:
		return Indeterminate
	case status == http.StatusTooManyRequests:
		return Determinate
	case result != "" && contract[result] == status:
		return Determinate
	case status >= 500:
		return Indeterminate
	}
	return Outside
}

// Label names an answer in the report: "201 ISSUED", "500 INTERNAL_ERROR", "transport error".
func Label(a answerlog.Answer) string {
	if a.Status == 0 {
		return "transport error"
	}
	return fmt.Sprintf("%d %s", a.Status, cmp.Or(a.Result, "(no result)"))
}

// Beginner opens the transaction the audit reads in: a *pgxpool.Pool or a *pgx.Conn.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Run audits answers against the tables, read through db in one REPEATABLE READ snapshot. The
// traffic must have stopped: a request still in flight can change the tables under the
// snapshot's feet only before it, but its answer is not in the log. Errors are the database's.
func Run(ctx context.Context, db Beginner, answers []answerlog.Answer, cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return Report{}, fmt.Errorf("audit: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	t, err := readTables(ctx, tx, answers, cfg)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Answers: len(answers), Codes: codeRows(answers, cfg.AnswerBound),
		Indeterminate: indeterminateRows(answers, t), Invariants: t.invariants}
	if len(answers) > 0 {
		rep.From, rep.To = answers[0].T, answers[0].T
		for _, a := range answers {
			rep.From, rep.To = minTime(rep.From, a.T), maxTime(rep.To, a.T)
		}
	}
	rep.Checks = []Check{
		checkContract(answers),
		checkLatency(answers, cfg.AnswerBound),
		checkCoupons(answers, t, cfg),
		checkRefusals(answers, t, cfg),
		checkPairs(answers, t, cfg),
		checkIssuedWhileActive(answers, t, cfg),
	}
	return rep, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// stamp is an answer's send time for a report line.
func stamp(a answerlog.Answer) string { return a.T.Format("15:04:05.000") }

// pairOf is an answer's (campaign, member).
func pairOf(a answerlog.Answer) pair { return pair{campaign: a.CampaignID, member: a.MemberID} }

// checkContract finds the answers [Classify] puts outside the contract, and the
// CAMPAIGN_NOT_ACTIVE answers without one of its reasons.
func checkContract(answers []answerlog.Answer) Check {
	c := Check{Name: "answers in the contract (docs/api.md)", Checked: len(answers), Unit: "answers"}
	for _, a := range answers {
		switch {
		case Classify(a.Status, a.Result) == Outside:
			c.fail("%s %s %s: %s", stamp(a), a.CampaignID, a.MemberID, Label(a))
		case a.Result == string(issuance.ResultCampaignNotActive) &&
			!slices.Contains([]string{issuance.ReasonNotStarted, issuance.ReasonEnded, issuance.ReasonPaused}, a.Reason):
			c.fail("%s %s %s: %s with reason %q, not NOT_STARTED, ENDED or PAUSED", stamp(a), a.CampaignID, a.MemberID, Label(a), a.Reason)
		}
	}
	return c
}

// checkIssuedWhileActive finds the ISSUED answers whose whole request, widened by the clock skew,
// fell where the campaign's history shows it inactive (paused, ended or not started): its coupon
// committed while no coupon of the campaign may commit; and those answered before a campaign's
// first release had opened.
func checkIssuedWhileActive(answers []answerlog.Answer, t tables, cfg Config) Check {
	c := Check{Name: "ISSUED only while the campaign was active (its period and pauses)", Unit: "answers"}
	for _, a := range answers {
		camp, ok := t.campaigns[a.CampaignID]
		if a.Result != string(issuance.ResultIssued) || Classify(a.Status, a.Result) != Determinate || !ok {
			continue
		}
		c.Checked++
		answeredLatest := a.T.Add(a.Latency() + cfg.ClockSkew)
		if reasons := camp.history.reasons(a.T.Add(-cfg.ClockSkew), answeredLatest); !slices.Contains(reasons, "") {
			c.fail("%s %s %s: ISSUED %s, but the campaign was %s throughout the request", stamp(a), a.CampaignID, a.MemberID,
				a.CouponID, strings.Join(reasons, " or "))
		} else if camp.firstRelease != nil && !camp.firstRelease.Before(answeredLatest) {
			c.fail("%s %s %s: ISSUED %s, answered before the campaign's first release at %s", stamp(a), a.CampaignID, a.MemberID,
				a.CouponID, camp.firstRelease.In(issuance.Tokyo).Format(time.RFC3339Nano))
		}
	}
	return c
}

// checkLatency finds the answers, and the transport errors, that came after bound.
func checkLatency(answers []answerlog.Answer, bound time.Duration) Check {
	c := Check{Name: fmt.Sprintf("answers within %s (the app's timeout)", bound), Checked: len(answers), Unit: "answers"}
	for _, a := range answers {
		if a.Latency() > bound {
			c.fail("%s %s %s: %.0f ms, %s", stamp(a), a.CampaignID, a.MemberID, a.Ms, Label(a))
		}
	}
	return c
}

// checkCoupons checks each ISSUED and ALREADY_ISSUED against the coupon it names. A coupon that
// is missing or not the answer's gets one line, with every answer that named it.
func checkCoupons(answers []answerlog.Answer, t tables, cfg Config) Check {
	c := Check{Name: "ISSUED and ALREADY_ISSUED name a live coupon of their (campaign, member)", Unit: "answers"}
	type wrong struct {
		first   answerlog.Answer // the first answer that named the coupon for the pair
		why     string
		answers []string
	}
	bad := map[string]*wrong{} // by coupon id and pair
	issued := map[string]int{}
	for _, a := range answers {
		if !claimsCoupon(a) {
			continue
		}
		c.Checked++
		if a.CouponID == "" {
			c.fail("%s %s %s: %s without a coupon_id", stamp(a), a.CampaignID, a.MemberID, a.Result)
			continue
		}
		if a.Result == string(issuance.ResultIssued) {
			if issued[a.CouponID]++; issued[a.CouponID] == 2 {
				c.fail("coupon %s (%s, %s): answered ISSUED to more than one request", a.CouponID, a.CampaignID, a.MemberID)
			}
		}
		why := couponProblem(a, t, cfg)
		if why == "" {
			continue
		}
		c.Failed++
		key := a.CouponID + " " + a.CampaignID + " " + a.MemberID
		w := bad[key]
		if w == nil {
			w = &wrong{first: a, why: why}
			bad[key] = w
		}
		w.answers = append(w.answers, a.Result+" at "+stamp(a))
	}
	byTime := slices.SortedFunc(maps.Values(bad), func(x, y *wrong) int { return x.first.T.Compare(y.first.T) })
	for _, w := range byTime {
		c.line("coupon %s (%s, %s): %s; answered %s", w.first.CouponID, w.first.CampaignID, w.first.MemberID, w.why, strings.Join(w.answers, ", "))
	}
	return c
}

// couponProblem says what is wrong with the coupon answer a names, "" when nothing. A coupon an
// operator voided after the request was sent was live when it was answered.
func couponProblem(a answerlog.Answer, t tables, cfg Config) string {
	got, ok := t.byID[a.CouponID]
	switch {
	case !ok:
		return "not in issued_coupons"
	case got.campaign != a.CampaignID || got.member != a.MemberID:
		return fmt.Sprintf("belongs to (%s, %s)", got.campaign, got.member)
	case got.live, got.voidedAt != nil && got.voidedAt.After(a.T.Add(-cfg.ClockSkew)):
		return ""
	case got.voidedAt != nil:
		return fmt.Sprintf("voided at %s, before the request", got.voidedAt.Format("15:04:05.000"))
	}
	return "a legacy duplicate"
}

// claimsCoupon reports whether a is a determinate ISSUED or ALREADY_ISSUED.
func claimsCoupon(a answerlog.Answer) bool {
	return (a.Result == string(issuance.ResultIssued) || a.Result == string(issuance.ResultAlreadyIssued)) &&
		Classify(a.Status, a.Result) == Determinate
}

// checkRefusals checks each refusal against the final tables (see the package comment for what
// proves one wrong).
func checkRefusals(answers []answerlog.Answer, t tables, cfg Config) Check {
	c := Check{Name: "refusals not contradicted by the final tables and the campaigns' history", Unit: "refusals"}
	for _, a := range answers {
		if Classify(a.Status, a.Result) != Determinate {
			continue
		}
		why, checked := contradiction(a, t, cfg)
		if !checked {
			continue
		}
		c.Checked++
		if why != "" {
			c.fail("%s %s %s: %s, but %s", stamp(a), a.CampaignID, a.MemberID, a.Result, why)
		}
	}
	return c
}

// notActiveContradiction says what contradicts CAMPAIGN_NOT_ACTIVE answer a, sent and answered
// within [from, to], of campaign camp, or "": the campaign's history shows it active throughout,
// or never in the answer's reason; a campaign with releases is also NOT_STARTED until its first.
func notActiveContradiction(a answerlog.Answer, camp campaignRow, from, to time.Time) string {
	reasons := camp.history.reasons(from, to)
	if camp.firstRelease != nil && camp.firstRelease.After(from) {
		reasons = append(reasons, issuance.ReasonNotStarted) // its first release had not opened yet
	}
	switch {
	case slices.Equal(reasons, []string{""}):
		return "it was active throughout the request (its period and pauses, campaign history)"
	case a.Reason != "" && !slices.Contains(reasons, a.Reason):
		return fmt.Sprintf("the reason was %s, and the campaign was never %s during the request", a.Reason, a.Reason)
	}
	return ""
}

// contradiction says why the final tables prove refusal a wrong ("" when they do not), and
// whether a is a refusal the audit can check at all.
func contradiction(a answerlog.Answer, t tables, cfg Config) (why string, checked bool) {
	camp, exists := t.campaigns[a.CampaignID]
	sentEarliest, answeredLatest := a.T.Add(-cfg.ClockSkew), a.T.Add(a.Latency()+cfg.ClockSkew)
	switch issuance.Result(a.Result) {
	case issuance.ResultUnknownCampaign:
		if exists && camp.createdAt.Before(sentEarliest) {
			return fmt.Sprintf("the campaign exists since %s", camp.createdAt.In(issuance.Tokyo).Format(time.RFC3339)), true
		}
		return "", true
	case issuance.ResultCampaignNotActive, issuance.ResultBudgetExceeded, issuance.ResultMonthlyCap, issuance.ResultCouponVoided:
		if !exists {
			return "the campaign does not exist", true
		}
	default:
		return "", false
	}
	switch issuance.Result(a.Result) {
	case issuance.ResultCampaignNotActive:
		return notActiveContradiction(a, camp, sentEarliest, answeredLatest), true
	case issuance.ResultCouponVoided:
		if !voidedBy(t.byPair[pairOf(a)], a.CouponID, answeredLatest) {
			return fmt.Sprintf("the pair's coupon %s was not voided by then", a.CouponID), true
		}
	case issuance.ResultBudgetExceeded:
		if camp.firstRelease != nil {
			return "", false // its releases, not its budget, may have refused: the final stripes do not say what was released when
		}
		if !camp.history.budgetLaidAt.Before(sentEarliest) || after(camp.lastVoidAt, sentEarliest) {
			return "", false // its budget or stripes changed, or a void gave yen back, since: the final counters do not say
		}
		if camp.room {
			return "a budget stripe still has room for a coupon", true
		}
	case issuance.ResultMonthlyCap:
		month := issuance.Month(sentEarliest)
		if month != issuance.Month(answeredLatest) {
			return "", false
		}
		k := memberMonth{member: a.MemberID, month: month}
		if v, ok := t.lastVoidAt[k]; ok && v.After(sentEarliest) {
			return "", false // a void gave the month yen back since: the final counter does not say
		}
		if t.capSetAt.After(sentEarliest) {
			return "", false // the cap changed since (couponctl rules set): the cap now does not say
		}
		used := t.usedYen[k]
		if used+camp.discountYen <= t.capYen {
			return fmt.Sprintf("the member has used %d of %d yen in %s and the coupon is %d yen", used, t.capYen, month, camp.discountYen), true
		}
	}
	return "", true
}

// voidedBy reports whether coupons holds id, voided at or before by.
func voidedBy(coupons []pairCoupon, id string, by time.Time) bool {
	return slices.ContainsFunc(coupons, func(c pairCoupon) bool {
		return c.id == id && c.voidedAt != nil && !c.voidedAt.After(by)
	})
}

// after reports whether t is set and after u.
func after(t *time.Time, u time.Time) bool { return t != nil && t.After(u) }

// checkPairs finds coupons of the log's pairs, live or voided, that no answer of the log explains. A coupon
// is explained when an answer of its pair said ISSUED with its id; or an answer of its pair was
// indeterminate; or it was written before the log began, by the database's clock (issued_at,
// issue_now()) against the log's, with the clock skew for slack: issued_at before the log's first
// send time less the skew, so not the log's to explain (load re-run with an earlier run's seed
// sends that run's pairs again); or, within the
// skew around that first send time, where the clocks cannot say which came first, when an answer
// of its pair said ALREADY_ISSUED with its id. A coupon written later than that needs its ISSUED
// answer: an ALREADY_ISSUED to a double tap does not explain a coupon whose own request was
// answered RETRY_EXHAUSTED or refused. A coupon that `couponctl grant` wrote (granted_by names
// its login) is explained by the grant, and counted in the check's note.
// grantExplains reports whether a coupon whose granted_by is grantedBy was written by `couponctl
// grant`, which owes no answer in the log. A variable, so that a test can swap in its broken
// variant (audit_test.go).
var grantExplains = func(grantedBy string) bool { return grantedBy != "" }

func checkPairs(answers []answerlog.Answer, t tables, cfg Config) Check {
	c := Check{Name: "every coupon of the log's pairs answered ISSUED, older than the log or indeterminate", Unit: "coupons"}
	type seen struct {
		issued, already map[string]bool
		unclear         bool
		results         []string
	}
	byPair := map[pair]*seen{}
	var first time.Time // the log's first send time
	for _, a := range answers {
		if first.IsZero() || a.T.Before(first) {
			first = a.T
		}
		s := byPair[pairOf(a)]
		if s == nil {
			s = &seen{issued: map[string]bool{}, already: map[string]bool{}}
			byPair[pairOf(a)] = s
		}
		if Classify(a.Status, a.Result) != Determinate {
			s.unclear = true
		}
		switch {
		case !claimsCoupon(a):
		case a.Result == string(issuance.ResultIssued):
			s.issued[a.CouponID] = true
		default:
			s.already[a.CouponID] = true
		}
		s.results = append(s.results, Label(a))
	}
	before, around := first.Add(-cfg.ClockSkew), first.Add(cfg.ClockSkew)
	granted := 0 // coupons a grant wrote: granted_by names it, so no answer is owed
	for p, coupons := range t.byPair {
		s := byPair[p]
		for _, cp := range coupons {
			c.Checked++
			switch {
			case grantExplains(cp.grantedBy) && !s.issued[cp.id]:
				granted++
			case s.unclear, s.issued[cp.id], cp.issuedAt.Before(before):
			case s.already[cp.id] && cp.issuedAt.Before(around):
			default:
				c.fail("coupon %s of (%s, %s) issued at %s, after the log began at %s, but no answer said ISSUED for it (answers: %s)",
					cp.id, p.campaign, p.member, cp.issuedAt.Format("15:04:05.000"), first.Format("15:04:05.000"), strings.Join(s.results, ", "))
			}
		}
	}
	if granted > 0 {
		c.Note = fmt.Sprintf("%d coupons granted by couponctl grant (granted_by names the login) explained by the grant, not by an answer", granted)
	}
	slices.Sort(c.Examples) // map order: sorted so that two runs print alike
	return c
}
