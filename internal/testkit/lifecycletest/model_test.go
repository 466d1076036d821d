package lifecycletest

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/redemption"
)

// capYen is R3's cap the services run with (the default: the member cap regulation).
const capYen = issuance.DefaultMonthlyCapYen

// mCampaign is the model of one campaign: its definition and the sums the tables must show.
type mCampaign struct {
	id               string
	discount, budget int // yen
	issued           int // yen of its live coupons: R1's counter
	stripes          int
	starts, ends     *time.Time
	paused           bool
	validDays        int
	expireAt         *time.Time
	changes          int // rows of campaign_changes
}

// inactive is why the campaign issues nothing at at (issuance's CAMPAIGN_NOT_ACTIVE reason), ""
// when it is active. A fixed expiry instant that has passed ends issuance as ends_at does
// (issue 29, migration 00015): a coupon issued then would be born expired.
func (c *mCampaign) inactive(at time.Time) string {
	switch {
	case c.ends != nil && !at.Before(*c.ends):
		return issuance.ReasonEnded
	case c.expireAt != nil && !at.Before(*c.expireAt):
		return issuance.ReasonEnded
	case c.paused:
		return issuance.ReasonPaused
	case c.starts != nil && at.Before(*c.starts):
		return issuance.ReasonNotStarted
	}
	return ""
}

// state is the state the database must judge the campaign in at at (campaign.Status.State,
// campaign_state).
func (c *mCampaign) state(at time.Time) string {
	switch c.inactive(at) {
	case issuance.ReasonEnded:
		if c.ends != nil && !at.Before(*c.ends) {
			return campaign.StateEnded
		}
		return campaign.StateExpired
	case issuance.ReasonPaused:
		return campaign.StatePaused
	case issuance.ReasonNotStarted:
		return campaign.StateNotStarted
	}
	if c.budget-c.issued < c.discount {
		return campaign.StateSoldOut
	}
	return campaign.StateActive
}

// expiry is when a coupon of the campaign issued at at expires (coupon_expiry, 00011): the fixed
// instant, or the start of the Asia/Tokyo day validDays after the issue day, or never (nil).
func (c *mCampaign) expiry(at time.Time) *time.Time {
	switch {
	case c.expireAt != nil:
		e := *c.expireAt
		return &e
	case c.validDays > 0:
		y, mo, d := at.In(issuance.Tokyo).Date()
		e := time.Date(y, mo, d+c.validDays, 0, 0, 0, 0, issuance.Tokyo)
		return &e
	}
	return nil
}

// instants are the campaign's instants that time passes: its period's bounds and its expiry.
func (c *mCampaign) instants() []time.Time {
	var out []time.Time
	for _, p := range []*time.Time{c.starts, c.ends, c.expireAt} {
		if p != nil {
			out = append(out, *p)
		}
	}
	return out
}

// mCoupon is the model of one issued coupon.
type mCoupon struct {
	id, campaign, member, month string
	amount                      int
	expires                     *time.Time
	granted                     bool
	voided, reissue             bool
	// heldBy is the order whose redemption holds the coupon now, "" when none; rolledBack the
	// orders whose redemption of it was rolled back; history the rows of coupon_redemptions.
	heldBy     string
	rolledBack map[string]bool
	history    int
}

// redeemAnswer is what redemption_judge answers member's order on coupon c at at (docs/api.md,
// "RedeemCoupon"): the coupon's member alone sees it; the order holding it is answered REDEEMED
// (again), and an order whose redemption was rolled back ROLLED_BACK, before the void and the
// expiry.
func (c *mCoupon) redeemAnswer(member, order string, at time.Time) redemption.Result {
	switch {
	case member != c.member:
		return redemption.ResultUnknownCoupon
	case c.heldBy != "" && c.heldBy == order:
		return redemption.ResultRedeemed
	case c.rolledBack[order]:
		return redemption.ResultRolledBack
	}
	return c.usable(at)
}

// usable is what the coupon answers an order that never redeemed it, at at: VALID when a new
// order may redeem it.
func (c *mCoupon) usable(at time.Time) redemption.Result {
	switch {
	case c.heldBy != "":
		return redemption.ResultAlreadyRedeemed
	case c.voided:
		return redemption.ResultCouponVoided
	case c.expires != nil && !at.Before(*c.expires):
		return redemption.ResultCouponExpired
	}
	return redemption.ResultValid
}

// rollbackAnswer is what a rollback of order's redemption of c by member answers at at, and
// whether a new order may redeem the coupon after it.
func (c *mCoupon) rollbackAnswer(member, order string, at time.Time) (redemption.Result, bool) {
	switch {
	case member != c.member:
		return redemption.ResultUnknownCoupon, false
	case c.heldBy != "" && c.heldBy == order:
		after := *c
		after.heldBy = ""
		return redemption.ResultRolledBack, after.usable(at) == redemption.ResultValid
	case c.rolledBack[order]:
		return redemption.ResultRolledBack, c.usable(at) == redemption.ResultValid
	}
	return redemption.ResultNotRedeemed, false
}

// redeemed applies order's new redemption of c.
func (c *mCoupon) redeemed(order string) {
	c.heldBy = order
	c.history++
}

// rolledBackBy applies order's rollback of its redemption of c.
func (c *mCoupon) rolledBackBy(order string) {
	if c.rolledBack == nil {
		c.rolledBack = map[string]bool{}
	}
	c.heldBy, c.rolledBack[order] = "", true
	c.history++
}

// model is the whole system as one check of the test has made it. Every check has campaigns and
// members of its own (ids under its prefix), so the checks share one database.
type model struct {
	prefix    string
	members   []string
	campaigns []*mCampaign
	byID      map[string]*mCampaign
	coupons   []*mCoupon
	usage     map[memberMonth]int // R3's used yen
}

type memberMonth struct{ member, month string }

func newModel(prefix string, members int) *model {
	m := &model{prefix: prefix, byID: map[string]*mCampaign{}, usage: map[memberMonth]int{}}
	for i := range members {
		m.members = append(m.members, fmt.Sprintf("%s-m%d", prefix, i))
	}
	return m
}

// holder is the coupon that holds the pair (campaign, member): the newest one not voided with
// reissue allowed (one_coupon_per_member, 00012), or nil.
func (m *model) holder(campaignID, member string) *mCoupon {
	for i := len(m.coupons) - 1; i >= 0; i-- {
		c := m.coupons[i]
		if c.campaign == campaignID && c.member == member && !(c.voided && c.reissue) {
			return c
		}
	}
	return nil
}

// answer is what the model expects of one issuance.
type answer struct {
	result   issuance.Result
	reason   string
	couponID string // the holder's, for ALREADY_ISSUED and COUPON_VOIDED
	amount   int
	month    string
	expires  *time.Time
}

// prejudge is the answer to member asking for campaignID at at by every rule but R1's budget:
// ISSUED here means "issued if the budget has room".
func (m *model) prejudge(campaignID, member string, at time.Time) answer {
	c := m.byID[campaignID]
	if c == nil {
		return answer{result: issuance.ResultUnknownCampaign}
	}
	if h := m.holder(campaignID, member); h != nil {
		if h.voided {
			return answer{result: issuance.ResultCouponVoided, couponID: h.id}
		}
		return answer{result: issuance.ResultAlreadyIssued, couponID: h.id, expires: h.expires}
	}
	if r := c.inactive(at); r != "" {
		return answer{result: issuance.ResultCampaignNotActive, reason: r}
	}
	month := issuance.Month(at)
	if c.discount > capYen || m.usage[memberMonth{member, month}]+c.discount > capYen {
		return answer{result: issuance.ResultMonthlyCap}
	}
	return answer{result: issuance.ResultIssued, amount: c.discount, month: month, expires: c.expiry(at)}
}

// expect is the answer to one request alone.
func (m *model) expect(campaignID, member string, at time.Time) answer {
	a := m.prejudge(campaignID, member, at)
	if c := m.byID[campaignID]; a.result == issuance.ResultIssued && c.issued+c.discount > c.budget {
		return answer{result: issuance.ResultBudgetExceeded}
	}
	return a
}

// compare says how got differs from want, nil when it does not.
func (m *model) compare(got issuance.Outcome, want answer) error {
	if got.Result != want.result {
		return fmt.Errorf("answered %s%s, the model says %s%s", got.Result, because(got.Reason), want.result, because(want.reason))
	}
	switch got.Result {
	case issuance.ResultCampaignNotActive:
		if got.Reason != want.reason {
			return fmt.Errorf("answered %s because %s, the model says because %s", got.Result, got.Reason, want.reason)
		}
	case issuance.ResultAlreadyIssued, issuance.ResultCouponVoided:
		if got.CouponID != want.couponID {
			return fmt.Errorf("answered %s with another coupon than the pair's holder", got.Result)
		}
		if got.Result == issuance.ResultAlreadyIssued && !sameInstant(got.ExpiresAt, want.expires) {
			return fmt.Errorf("answered %s with another expiry than its coupon's", got.Result)
		}
	case issuance.ResultIssued:
		switch {
		case got.CouponID == "" || m.coupon(got.CouponID) != nil:
			return errors.New("answered ISSUED without a new coupon")
		case got.AmountYen != want.amount || got.Month != want.month:
			return fmt.Errorf("answered ISSUED %d yen in %s, the model says %d yen in %s", got.AmountYen, got.Month, want.amount, want.month)
		case !sameInstant(got.ExpiresAt, want.expires):
			return errors.New("answered ISSUED with another expiry than the model's")
		}
	}
	return nil
}

// issued records coupon got, just issued to member by campaignID (granted by `couponctl grant`).
func (m *model) issued(got issuance.Outcome, campaignID, member string, granted bool) {
	c := m.byID[campaignID]
	m.coupons = append(m.coupons, &mCoupon{id: got.CouponID, campaign: campaignID, member: member, month: got.Month,
		amount: got.AmountYen, expires: got.ExpiresAt, granted: granted})
	c.issued += got.AmountYen
	m.usage[memberMonth{member, got.Month}] += got.AmountYen
}

// judgeBurst checks the answers outs to a burst of requests of members (a member may be listed
// more than once) for campaignID at at, sent at once through the coalescing service, and
// returns the indexes of outs that issued a coupon. Which members R1's room goes to is the
// race's: the model asks that the room goes to members the rules let in, all of it when one of
// them was refused for the budget, and that a member listed twice is issued once. A
// RETRY_EXHAUSTED answer (contention outlasted the budget) wrote nothing and is taken as such.
func (m *model) judgeBurst(campaignID string, members []string, outs []issuance.Outcome, at time.Time) ([]int, error) {
	entries := map[string][]int{}
	for i, mb := range members {
		entries[mb] = append(entries[mb], i)
	}
	room, granted, refused := 0, 0, false
	if c := m.byID[campaignID]; c != nil {
		room = (c.budget - c.issued) / c.discount
	}
	var issued []int
	for mb, idx := range entries {
		pre := m.prejudge(campaignID, mb, at)
		first, short := -1, false
		for _, i := range idx {
			if pre.result == issuance.ResultIssued && outs[i].Result == issuance.ResultIssued && first < 0 {
				if err := m.compare(outs[i], pre); err != nil {
					return nil, fmt.Errorf("%s (request %d): %w", mb, i, err)
				}
				first = i
			}
		}
		for _, i := range idx {
			got := outs[i]
			switch {
			case i == first, got.Result == issuance.ResultRetryExhausted:
			case pre.result != issuance.ResultIssued:
				if err := m.compare(got, pre); err != nil {
					return nil, fmt.Errorf("%s (request %d): %w", mb, i, err)
				}
			case got.Result == issuance.ResultBudgetExceeded:
				refused, short = true, true
			case got.Result == issuance.ResultAlreadyIssued && first >= 0 && got.CouponID == outs[first].CouponID:
			default:
				return nil, fmt.Errorf("%s (request %d of %d for this member): answered %s%s, the model says ISSUED once, "+
					"ALREADY_ISSUED with its coupon for the others, or BUDGET_EXCEEDED", mb, i, len(idx), got.Result,
					because(got.Reason))
			}
		}
		if first >= 0 && short {
			return nil, fmt.Errorf("%s: issued a coupon in one request and refused BUDGET_EXCEEDED in another", mb)
		}
		if first >= 0 {
			issued = append(issued, first)
			granted++
		}
	}
	if granted > room || (refused && granted != room) {
		return nil, fmt.Errorf("%d coupons issued (BUDGET_EXCEEDED answered: %t) with room for %d", granted, refused, room)
	}
	return issued, nil
}

// coupon is the model's coupon id, or nil.
func (m *model) coupon(id string) *mCoupon {
	for _, c := range m.coupons {
		if c.id == id {
			return c
		}
	}
	return nil
}

// voidOutcome is what voiding a coupon must do.
type voidOutcome int

const (
	voidVoids    voidOutcome = iota // VOIDED: its yen go back
	voidCorrects                    // a void without reissue corrected (coupon_allow_reissue, 00019): no counter moves
	voidRefused                     // voided already and nothing to correct, or redeemed
)

// void is what voiding coupon c with allowReissue must do, applied to the model.
func (m *model) void(c *mCoupon, allowReissue bool) voidOutcome {
	switch {
	case c.voided && allowReissue && !c.reissue:
		c.reissue = true
		return voidCorrects
	case c.voided, c.heldBy != "": // coupon_void refuses a redeemed coupon (REDEEMED)
		return voidRefused
	}
	c.voided, c.reissue = true, allowReissue
	m.byID[c.campaign].issued -= c.amount
	m.usage[memberMonth{c.member, c.month}] -= c.amount
	return voidVoids
}

// errRefused is the model's word for a change the system must refuse, changing nothing.
var errRefused = errors.New("refused")

// budgetPlan is a budget change as the model judges it: the history rows it writes (one per
// thing it changes), the budget and the stripes after it.
type budgetPlan struct{ rows, budget, stripes int }

// budgetChange is the plan of a budget change of add yen and, when k > 0, k stripes, made at at,
// or errRefused: a campaign that has ended takes none (campaign_refuse_ended).
func (c *mCampaign) budgetChange(add, k int, at time.Time) (budgetPlan, error) {
	p := budgetPlan{budget: c.budget + add, stripes: c.stripes}
	if k > 0 {
		p.stripes = k
	}
	if c.inactive(at) == issuance.ReasonEnded || p.budget < c.issued || p.budget < c.discount || p.budget > math.MaxInt32 ||
		p.stripes < 1 || p.stripes > 64 || p.stripes > p.budget/c.discount {
		return budgetPlan{}, errRefused
	}
	if p.budget != c.budget {
		p.rows++
	}
	if p.stripes != c.stripes {
		p.rows++
	}
	return p, nil
}

// apply applies a budget change planned by budgetChange.
func (c *mCampaign) apply(p budgetPlan) {
	c.budget, c.stripes = p.budget, p.stripes
	c.changes += p.rows
}

func sameInstant(a, b *time.Time) bool {
	return (a == nil) == (b == nil) && (a == nil || a.Equal(*b))
}

func show(p *time.Time) string {
	if p == nil {
		return "never"
	}
	return p.In(issuance.Tokyo).Format(time.RFC3339Nano)
}

func because(reason string) string {
	if reason == "" {
		return ""
	}
	return "/" + reason
}
