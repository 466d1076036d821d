// Package campaign creates and reads campaigns: the static definition row in campaigns and the
// R1 budget rows in campaign_budgets (one per budget stripe), written together. Readers see a
// campaign as one: its budget and issued yen are the sums over its stripes.
package campaign

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mops/coupon-api/shared/ids"
)

// ErrNotFound is returned by [Show] for a campaign id that does not exist.
var ErrNotFound = errors.New("campaign: not found")

// ErrExists is returned by [Create] for a campaign id that is taken.
var ErrExists = errors.New("campaign: already exists")

// Campaign is a campaign definition with its budget, amounts in yen.
type Campaign struct {
	ID string
	// Name is the campaign's display name, shown beside its id (campaign_names, 00037); "" for
	// none.
	Name        string
	DiscountYen int // face value of one coupon
	BudgetYen   int // the campaign budget approval: R1's ceiling
	// StartsAt and EndsAt bound when coupons are issued, [StartsAt, EndsAt); nil is unbounded.
	StartsAt, EndsAt *time.Time
	// CouponValidDays, when positive, makes each coupon valid until the end of the
	// CouponValidDays-th Asia/Tokyo day from its issue (the issue day is the first), 1 to
	// [MaxValidDays]; CouponsExpireAt, when set, until that instant. At most one of the two;
	// neither gives coupons without expiry. Each coupon is stamped as it is issued.
	CouponValidDays int
	CouponsExpireAt *time.Time
	// Stripes is how many budget stripe rows hold the budget (docs/hot-campaigns.md), 1 to
	// [MaxStripes]; 0 means 1. More stripes let more issuances of one hot campaign hold a budget
	// row at once; see [StripesFor].
	Stripes int
	// Releases, when any, release the budget's coupons over time ([Release]); before the first
	// the campaign has not started. At most [MaxReleases], no more coupons in all than BudgetYen
	// holds; without releases the whole budget is open from StartsAt.
	Releases []Release
	// AudienceOnly limits the campaign to the members of its audience (campaign_audience,
	// [AudienceChange]): any other member is answered NOT_ELIGIBLE, nothing written.
	AudienceOnly bool
}

// MaxValidDays bounds [Campaign.CouponValidDays] (the schema's valid_days_in_range): ten years.
const MaxValidDays = 3650

// MaxStripes bounds the budget stripes of one campaign (the schema's stripe_in_range: 0-63).
const MaxStripes = 64

// StripeRateTPS is the issuance rate one budget stripe row is sized for, in requests per second,
// with IssueCoupon coalescing (ISSUE_BATCH_MAX, default 32) behind a synchronous standby 1 ms
// away (`couponctl bench --standby 1ms`, docs/hot-campaigns.md, "Sizing"): a stripe carries about
// 300 calls/s (one call holds it for a commit that waits for the standby), sized at half, and a
// call carries the members that waited in its instance, about 2.5 at 10,000 requests/s over 16
// instances. Without coalescing a stripe is sized for 150/s: give --stripes.
const StripeRateTPS = 400

// StripesFor returns the stripes for a campaign expected to take expectedRPS issuance requests
// per second at its peak: one per [StripeRateTPS], at least 1 and at most [MaxStripes]. A campaign
// with no expected rate (0) gets 1 stripe: one row is simplest and the rate of one row is far
// above an ordinary campaign's.
func StripesFor(expectedRPS int) int {
	k := (expectedRPS + StripeRateTPS - 1) / StripeRateTPS
	return min(max(k, 1), MaxStripes)
}

// Status is a campaign with its issued total and whether it is paused.
type Status struct {
	Campaign
	IssuedYen int // the R1 counter: campaign_budgets.issued_yen summed over the stripes
	// PausedAt is when an operator paused the campaign ([Pause]), nil when it is not paused.
	PausedAt *time.Time
	// Schedule is the campaign's releases in time order with what each has released, empty
	// for a campaign without releases.
	Schedule []ReleaseStatus
	// AudienceSize is how many members the campaign's audience holds (only an AudienceOnly
	// campaign has one).
	AudienceSize int
	// NextReleaseAt is when the releases open more coupons next, the instant IssueCoupon names
	// as next_release_at (release_next, schema/current/release_next.sql: a release before the
	// start opens at the start, one at or after the end never); nil when none is to come.
	NextReleaseAt *time.Time
	// State is the campaign's state for people as the database judges it at [Status.At]
	// (campaign_state, schema/current/campaign_state.sql: the judgement IssueCoupon and the dry
	// run use): one of the State constants. No code of this module derives a state.
	State string
	// OpensAt is when a campaign in [StateNotStarted] opens: its start, or its first release.
	OpensAt *time.Time
	// RemainingCoupons is how many more coupons the campaign's budget stripes can issue at At, by
	// its budget and what its releases have released (a voided coupon counts back).
	RemainingCoupons int
	// At is the database's clock (issue_now()) when it was read.
	At time.Time
}

// The states of a campaign (campaign_state's codes).
const (
	StateActive         = "ACTIVE"          // open, with coupons left
	StatePaused         = "PAUSED"          // paused by an operator
	StateSoldOut        = "SOLD_OUT"        // open, its budget or its releases spent, no release to come
	StateWaitingRelease = "WAITING_RELEASE" // open, the released coupons taken, a release to come
	StateNotStarted     = "NOT_STARTED"     // before its start or its first release
	StateEnded          = "ENDED"           // its end passed
	StateExpired        = "EXPIRED"         // its coupons' fixed expiry passed, its end not
)

// RemainingYen is what the budget still allows, in yen.
func (s Status) RemainingYen() int { return s.BudgetYen - s.IssuedYen }

// Validate checks c before it reaches the database's own constraints.
func (c Campaign) Validate() error {
	if err := ids.Campaign(c.ID); err != nil {
		return fmt.Errorf("campaign id %q: %w", c.ID, err)
	}
	if c.Name != "" {
		if err := CheckName(c.Name); err != nil {
			return fmt.Errorf("campaign %s: %w", c.ID, err)
		}
	}
	if err := c.checkAmounts(); err != nil {
		return err
	}
	if err := c.checkValidity(); err != nil {
		return err
	}
	return c.CheckReleases()
}

// checkAmounts checks c's discount, budget and budget stripes.
func (c Campaign) checkAmounts() error {
	if c.DiscountYen <= 0 {
		return fmt.Errorf("campaign %s: discount must be a positive number of yen, got %d", c.ID, c.DiscountYen)
	}
	if c.DiscountYen > math.MaxInt32 || c.BudgetYen > math.MaxInt32 {
		return fmt.Errorf("campaign %s: amounts must be at most %d yen (PostgreSQL integer)", c.ID, math.MaxInt32)
	}
	if c.BudgetYen < c.DiscountYen {
		return fmt.Errorf("campaign %s: budget %d yen is below one coupon of %d yen", c.ID, c.BudgetYen, c.DiscountYen)
	}
	if c.Stripes < 0 || c.Stripes > MaxStripes {
		return fmt.Errorf("campaign %s: stripes must be 1-%d, got %d", c.ID, MaxStripes, c.Stripes)
	}
	if c.Stripes > c.BudgetYen/c.DiscountYen { // the discount is positive and the budget at least one coupon: checked above
		return fmt.Errorf("campaign %s: %d stripes for a budget of %d coupons: a stripe needs at least one coupon",
			c.ID, c.Stripes, c.BudgetYen/c.DiscountYen)
	}
	return nil
}

// checkValidity checks c's coupon validity and period.
func (c Campaign) checkValidity() error {
	if c.CouponValidDays < 0 || c.CouponValidDays > MaxValidDays {
		return fmt.Errorf("campaign %s: coupon validity %d days: want 1-%d", c.ID, c.CouponValidDays, MaxValidDays)
	}
	if c.CouponValidDays > 0 && c.CouponsExpireAt != nil {
		return fmt.Errorf("campaign %s: give coupons a validity in days or an expiry instant, not both", c.ID)
	}
	if c.StartsAt != nil && c.EndsAt != nil && !c.StartsAt.Before(*c.EndsAt) {
		return fmt.Errorf("campaign %s: starts %s is not before ends %s", c.ID, tokyo(c.StartsAt), tokyo(c.EndsAt))
	}
	return nil
}

// CheckExpiry judges coupons that all expire at expire (a fixed expiry, nil for none) against
// the period [starts, ends) (nil bounds are open). It refuses coupons that expire at or before
// the start: the campaign could never issue one. Coupons that expire before the end are legal:
// the campaign ends at their expiry (IssueCoupon answers CAMPAIGN_NOT_ACTIVE, reason ENDED,
// docs/api.md); the warning says so. The database takes both ([Create] and [Update] do not
// call it): couponctl refuses the operator's mistake before it writes.
func CheckExpiry(starts, ends, expire *time.Time) (warning string, err error) {
	switch {
	case expire == nil:
	case starts != nil && !expire.After(*starts):
		return "", fmt.Errorf("its coupons would expire at %s, at or before its start at %s: it could never issue one",
			tokyo(expire), tokyo(starts))
	case ends != nil && expire.Before(*ends):
		return fmt.Sprintf("its coupons expire at %s, before its end at %s: the campaign ends at %s "+
			"(IssueCoupon answers CAMPAIGN_NOT_ACTIVE, reason ENDED, from then)", tokyo(expire), tokyo(ends), tokyo(expire)), nil
	}
	return "", nil
}

// tokyo is t in RFC 3339 at +09:00, as couponctl prints every time. A fixed zone: Asia/Tokyo
// has kept +09:00 without daylight saving since 1951, and this package stays below
// shared/issuance (whose tests create campaigns with it).
func tokyo(t *time.Time) string { return t.In(jst).Format(time.RFC3339) }

var jst = time.FixedZone("JST", 9*60*60)

// Warnings lists what is legal about c but probably not meant, given R3's cap capYen and the
// state the database judges it in, created (state, [Status.State]): a coupon above the cap
// (every request would be MONTHLY_CAP), a budget that leaves yen no coupon can use, a campaign
// that has already ended, coupons that expire before the period ends.
func (c Campaign) Warnings(capYen int, state string) []string {
	var w []string
	if c.DiscountYen > capYen {
		w = append(w, fmt.Sprintf("a %d yen coupon is above the %d yen monthly cap: every request will be MONTHLY_CAP", c.DiscountYen, capYen))
	}
	if rest := c.BudgetYen % c.DiscountYen; rest != 0 {
		w = append(w, fmt.Sprintf("the budget leaves %d yen that no %d yen coupon can use", rest, c.DiscountYen))
	}
	if state == StateEnded || state == StateExpired {
		w = append(w, "the campaign has already ended: every request will be CAMPAIGN_NOT_ACTIVE")
	}
	if expiry, _ := CheckExpiry(c.StartsAt, c.EndsAt, c.CouponsExpireAt); expiry != "" {
		w = append(w, expiry)
	}
	if n := c.BudgetYen/c.DiscountYen - c.ReleasedCoupons(); len(c.Releases) > 0 && n > 0 {
		w = append(w, fmt.Sprintf("%d coupons of the budget are in no release: none of them is issued until "+
			"couponctl campaign update %s --release AT=N --reason TEXT adds a release", n, c.ID))
	}
	for _, r := range c.Releases {
		if c.StartsAt != nil && r.At.Before(*c.StartsAt) {
			w = append(w, fmt.Sprintf("the release at %s is before the start at %s: its coupons open at the start",
				tokyo(&r.At), tokyo(c.StartsAt)))
			break
		}
	}
	return w
}

// Create creates c and its budget stripes through campaign_create
// (00017_admin_through_functions.sql; with releases or an audience, its overload of
// 00025_campaign_kinds.sql, which also writes the releases), which writes its 'create' history
// row, in one transaction. Errors: a validation error, [ErrExists], or the database's.
func Create(ctx context.Context, db Querier, c Campaign) error {
	if err := c.Validate(); err != nil {
		return err
	}
	var days *int
	if c.CouponValidDays > 0 {
		days = &c.CouponValidDays
	}
	args := []any{c.ID, c.DiscountYen, c.BudgetYen, max(c.Stripes, 1), c.StartsAt, c.EndsAt, days, c.CouponsExpireAt, createReason}
	sql := `SELECT change_id FROM campaign_create($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	if len(c.Releases) > 0 || c.AudienceOnly {
		at, coupons := make([]time.Time, len(c.Releases)), make([]int32, len(c.Releases))
		for i, r := range c.Releases {
			at[i], coupons[i] = r.At, int32(r.Coupons)
		}
		args = append(args, at, coupons, c.AudienceOnly)
		sql = `SELECT change_id FROM campaign_create($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`
	}
	// With a name, the create and the name are one batch: one implicit transaction.
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	if c.Name != "" {
		b.Queue(sqlNameSet, c.ID, c.Name, createReason)
	}
	err := db.SendBatch(ctx, b).Close()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlStateExists {
		return fmt.Errorf("%w: %s", ErrExists, c.ID)
	}
	if err != nil {
		return fmt.Errorf("campaign: create %s: %w", c.ID, err)
	}
	return nil
}

const (
	// createReason is the reason of a campaign's 'create' history row.
	createReason = "couponctl campaign create"
	// sqlStateExists is campaign_create's refusal of a campaign id that exists.
	sqlStateExists = "CI409"
)

// sqlStatus reads [Status] rows from campaign_budgets b grouped by campaign_id, the campaigns
// that its WHERE clause (%s) picks, in id order: the definition, written alike on every stripe,
// the stripes' sums, the audience's size, and the database's judgement at its clock, read once
// (campaign_state).
const sqlStatus = `
WITH now AS (SELECT issue_now() AS at)
SELECT s.*, coalesce((SELECT n.name FROM campaign_names n WHERE n.campaign_id = s.campaign_id), ''),
       st.state, st.opens_at, st.next_release_at, st.remaining_coupons, now.at
  FROM (SELECT campaign_id, min(discount_yen), sum(budget_yen), sum(issued_yen), min(starts_at), min(ends_at), count(*), min(paused_at),
               coalesce(min(coupon_valid_days), 0), min(coupons_expire_at), bool_or(audience_only),
               (SELECT count(*) FROM campaign_audience a WHERE a.campaign_id = b.campaign_id)::integer
          FROM campaign_budgets b %s GROUP BY campaign_id) s
 CROSS JOIN now
 CROSS JOIN LATERAL campaign_state(s.campaign_id, now.at) st
 ORDER BY s.campaign_id`

// reader runs queries: a pool, a connection or a transaction.
type reader interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// Show reads campaign id, its releases and the size of its audience. Errors: [ErrNotFound], or
// the database's.
func Show(ctx context.Context, db reader, id string) (Status, error) {
	list, err := read(ctx, db, `WHERE campaign_id = $1`, id)
	if err != nil {
		return Status{}, fmt.Errorf("campaign: show %s: %w", id, err)
	}
	if len(list) == 0 {
		return Status{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return list[0], nil
}

// List reads every campaign in id order, as [Show] reads one: a campaign whose budget is spread
// over budget stripes is one Status with the stripes' sums. Errors: the database's.
func List(ctx context.Context, db reader) ([]Status, error) {
	list, err := read(ctx, db, ``)
	if err != nil {
		return nil, fmt.Errorf("campaign: list: %w", err)
	}
	return list, nil
}

// read reads the campaigns that where (a WHERE clause of campaign_budgets b, or "") picks, in id
// order, with their releases.
func read(ctx context.Context, db reader, where string, args ...any) ([]Status, error) {
	rows, err := db.Query(ctx, fmt.Sprintf(sqlStatus, where), args...)
	if err != nil {
		return nil, err
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (s Status, err error) {
		err = row.Scan(&s.ID, &s.DiscountYen, &s.BudgetYen, &s.IssuedYen, &s.StartsAt, &s.EndsAt, &s.Stripes, &s.PausedAt,
			&s.CouponValidDays, &s.CouponsExpireAt, &s.AudienceOnly, &s.AudienceSize, &s.Name,
			&s.State, &s.OpensAt, &s.NextReleaseAt, &s.RemainingCoupons, &s.At)
		return s, err
	})
	if err != nil || len(list) == 0 {
		return list, err
	}
	return list, readReleases(ctx, db, list)
}

// MaxNameRunes bounds a campaign's display name, in characters (campaign_names' name_shown).
const MaxNameRunes = 100

// CheckName refuses a display name that campaign_name_set would refuse: blank, longer than
// [MaxNameRunes] characters, or with a control character ([ErrRefused]).
func CheckName(name string) error {
	name = strings.TrimSpace(name)
	switch n := utf8.RuneCountInString(name); {
	case n == 0 || n > MaxNameRunes:
		return fmt.Errorf("%w: a name of 1-%d characters, got %d", ErrRefused, MaxNameRunes, n)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("%w: a name without control characters", ErrRefused)
	}
	return nil
}
