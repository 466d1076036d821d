// Package coupon is what an operator does with an issued coupon: voids it, giving its yen back to
// its campaign's budget and its member's month exactly once (coupon_void,
// schema/current/coupon_void.sql), and shows it.
package coupon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mops/coupon-api/shared/issuance"
)

// ErrNotFound is returned for a coupon id that does not exist.
var ErrNotFound = errors.New("coupon: not found")

// ErrRefused is returned, wrapped with the reason, for a void that changes nothing: the coupon
// was voided already, or it is redeemed (tied to an order), or no reason was given.
var ErrRefused = errors.New("coupon: void refused")

// Querier runs a statement: a pool or a connection.
type Querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// Voided is what a void did, or found.
type Voided struct {
	CouponID, CampaignID, MemberID string
	// Month is the Asia/Tokyo month the coupon counted against; AmountYen its yen, given back to
	// the campaign's budget and to that month of the member.
	Month     string
	AmountYen int
	// At and By are when and by which database login the coupon was voided (nil and "" for a
	// redeemed coupon; By "" for the legacy migration's voids).
	At *time.Time
	By string
	// Push is what became of its LINE push: sent (PushedAt), in flight (a relay holds its row and
	// may be pushing it now), not sent (it never will be: the relay skips voided coupons),
	// skipped, parked, pruned, or no outbox row.
	Push     string
	PushedAt *time.Time
	// Released is set when the void corrected an earlier one made without reissue
	// ([AllowReissue]): At and By are then the history row's, VoidedAt and VoidedBy the void's.
	Released bool
	VoidedAt *time.Time
	VoidedBy string
}

// Results of coupon_void.
const (
	resultVoided        = "VOIDED"
	resultAlreadyVoided = "ALREADY_VOIDED"
	resultRedeemed      = "REDEEMED"
)

// SQLSTATEs coupon_void raises (schema/current/coupon_void.sql).
const (
	sqlStateNotFound = "CI404"
	sqlStateRefused  = "CI422"
)

const sqlVoid = `
SELECT result, campaign_id, member_id, month, amount_yen, voided_at, voided_by, push, pushed_at
  FROM coupon_void($1, $2, $3)`

// Void voids coupon id for reason, in one transaction that gives its yen back to its campaign's
// budget and its member's month, with the void's lock protocol (docs/design.md, "Lock order").
// It sets no lock_timeout: it waits as long as the session's allows. With allowReissue the
// member may be issued the campaign again; without it, IssueCoupon answers the pair
// COUPON_VOIDED. A coupon voided already without reissue is, with allowReissue, corrected by
// [AllowReissue]. Two voids of one coupon at once give its yen back once: the second is refused.
// Errors: [ErrNotFound],
// [ErrRefused] (the [Voided] then says what the coupon is), or the database's (the user must be
// in coupon_admin).
func Void(ctx context.Context, db Querier, id, reason string, allowReissue bool) (Voided, error) {
	v := Voided{CouponID: id}
	if err := CheckID(id); err != nil {
		return v, err
	}
	var result string
	var by *string
	err := db.QueryRow(ctx, sqlVoid, id, reason, allowReissue).Scan(&result, &v.CampaignID, &v.MemberID, &v.Month,
		&v.AmountYen, &v.At, &by, &v.Push, &v.PushedAt)
	if by != nil {
		v.By = *by
	}
	switch {
	case err != nil:
		return v, adminError(err, id, "void")
	case result == resultAlreadyVoided && allowReissue:
		return AllowReissue(ctx, db, id, reason)
	case result == resultAlreadyVoided:
		return v, fmt.Errorf("%w: coupon %s was voided already, at %s by %s; nothing changed", ErrRefused, id,
			v.At.In(issuance.Tokyo).Format(time.RFC3339), orUnknown(v.By))
	case result == resultRedeemed:
		return v, fmt.Errorf("%w: coupon %s was redeemed, tied to an order (coupon show has its history); nothing changed", ErrRefused, id)
	case result != resultVoided:
		return v, fmt.Errorf("coupon: void %s: coupon_void answered %q", id, result)
	}
	return v, nil
}

// adminError is coupon_void's or coupon_allow_reissue's error err for coupon id: [ErrNotFound]
// or [ErrRefused] for their SQLSTATEs, else err as "coupon: <verb> <id>: err".
func adminError(err error, id, verb string) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == sqlStateNotFound:
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	case errors.As(err, &pgErr) && pgErr.Code == sqlStateRefused:
		return fmt.Errorf("%w: %s", ErrRefused, pgErr.Message)
	}
	return fmt.Errorf("coupon: %s %s: %w", verb, id, err)
}

// Results of coupon_allow_reissue.
const (
	resultReleased       = "RELEASED"
	resultAlreadyAllowed = "ALREADY_ALLOWED"
	resultNotVoided      = "NOT_VOIDED"
)

const sqlAllowReissue = `
SELECT result, campaign_id, member_id, voided_at, voided_by, changed_at, changed_by
  FROM coupon_allow_reissue($1, $2)`

// AllowReissue corrects a void made without reissue: coupon id's member may be issued its
// campaign again (schema/current/coupon_allow_reissue.sql). It changes no counter, since the
// coupon's yen went back at the void, and writes a coupon_changes row with reason, whose time
// and login it returns as At and By. Errors: [ErrNotFound]; [ErrRefused] for a coupon not voided
// or already allowed; or the database's.
func AllowReissue(ctx context.Context, db Querier, id, reason string) (Voided, error) {
	v := Voided{CouponID: id}
	var result string
	var by, voidedBy *string
	err := db.QueryRow(ctx, sqlAllowReissue, id, reason).Scan(&result, &v.CampaignID, &v.MemberID, &v.VoidedAt, &voidedBy, &v.At, &by)
	if by != nil {
		v.By = *by
	}
	if voidedBy != nil {
		v.VoidedBy = *voidedBy
	}
	switch {
	case err != nil:
		return v, adminError(err, id, "allow reissue of")
	case result == resultAlreadyAllowed:
		v.At = v.VoidedAt
		return v, fmt.Errorf("%w: coupon %s was voided already, at %s by %s, with reissue allowed; nothing changed", ErrRefused, id,
			v.VoidedAt.In(issuance.Tokyo).Format(time.RFC3339), orUnknown(v.VoidedBy))
	case result == resultNotVoided:
		return v, fmt.Errorf("%w: coupon %s is not voided; nothing changed", ErrRefused, id)
	case result != resultReleased:
		return v, fmt.Errorf("coupon: allow reissue of %s: coupon_allow_reissue answered %q", id, result)
	}
	v.Released = true
	return v, nil
}

// CheckID refuses a coupon id that is not a UUID, the form every coupon id has.
func CheckID(id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return fmt.Errorf("coupon id %q: not a coupon id (a UUID such as 0b8f6b1e-3c52-4a0c-9d0e-6a7f2f1d9c41)", id)
	}
	return nil
}

func orUnknown(by string) string {
	if by == "" {
		return "(the legacy migration)"
	}
	return by
}

// Coupon is one issued coupon as `couponctl coupon show` prints it.
type Coupon struct {
	ID, CampaignID, MemberID string
	AmountYen                int
	Month                    string
	IssuedAt                 time.Time
	// ExpiresAt is nil for a coupon of a campaign without validity.
	ExpiresAt *time.Time
	// Expired says its expiry has passed, judged by the database at its clock (issue_now()),
	// as the relay judges what it may push.
	Expired bool
	// GrantedBy is the login of the `couponctl grant` that issued it, "" for IssueCoupon's.
	GrantedBy  string
	RedeemedAt *time.Time
	// Push is what the coupon's LINE push came to: sent, skipped, parked, open, none (no outbox
	// row), or pruned (its row deleted by the prune with the outcome not known: before 00035 or
	// by the previous release's prune); after a prune that kept it (outbox_pruned since 00039,
	// the coupon's outbox_outcome before), sent or skipped. PushAt is when it was sent, skipped
	// or parked while the row is there (a prune keeps no time); PushNote the relay's last error;
	// SkipReason why a push was skipped (the row's skip_reason, or the pruned outcome's: voided,
	// redeemed, expired, no_line_account; "" when not known).
	Push       string
	PushAt     *time.Time
	PushNote   string
	SkipReason string
	// VoidedAt, VoidedBy, VoidReason and ReissueAllowed are the void, if any.
	VoidedAt       *time.Time
	VoidedBy       string
	VoidReason     string
	ReissueAllowed bool
	// LegacyDuplicate marks a coupon the legacy migration found duplicated.
	LegacyDuplicate bool
}

const sqlShow = `
SELECT c.coupon_id::text, c.campaign_id, c.member_id, c.amount_yen, c.month, c.issued_at, c.expires_at,
       coalesce(c.expires_at <= issue_now(), false), coalesce(c.granted_by, ''), c.redeemed_at,
       CASE WHEN o.sent_at IS NOT NULL OR coalesce(p.outcome, c.outbox_outcome) = 'sent' THEN 'sent'
            WHEN o.skipped_at IS NOT NULL OR coalesce(p.outcome, c.outbox_outcome) LIKE 'skipped%' THEN 'skipped'
            WHEN o.parked_at IS NOT NULL THEN 'parked' WHEN o.coupon_id IS NOT NULL THEN 'open'
            WHEN c.outbox_pruned_at IS NOT NULL THEN 'pruned' ELSE 'none' END,
       coalesce(o.sent_at, o.skipped_at, o.parked_at), coalesce(o.last_error, ''),
       coalesce(o.skip_reason, substring(coalesce(p.outcome, c.outbox_outcome) FROM '^skipped:(.*)$'), ''),
       c.voided_at, coalesce(c.voided_by, ''), coalesce(c.void_reason, ''), c.reissue_allowed, c.legacy_duplicate
  FROM issued_coupons c LEFT JOIN notification_outbox o USING (coupon_id)
  LEFT JOIN outbox_pruned p ON p.issued_at = c.issued_at AND p.coupon_id = c.coupon_id
 WHERE c.coupon_id = $1`

// sqlForMember lists member $1's coupons (of campaign $2, or every campaign when $2 is ”),
// oldest first. issued_coupons_month_member (00042) leads with the month, so the member is looked
// up in each month from the first coupon's to the last's (both ends of that index): a probe a
// month, not a scan of every coupon.
var sqlForMember = `
WITH months AS (
  SELECT to_char(m, 'YYYY-MM') AS month
    FROM generate_series(to_date((SELECT min(month) FROM issued_coupons), 'YYYY-MM'),
                         to_date((SELECT max(month) FROM issued_coupons), 'YYYY-MM'), interval '1 month') m)` +
	strings.Replace(sqlShow, "WHERE c.coupon_id = $1",
		"WHERE c.month = ANY (ARRAY(SELECT month FROM months)) AND c.member_id = $1 AND ($2 = '' OR c.campaign_id = $2) ORDER BY c.issued_at, c.coupon_id", 1)

// ForMember returns member's coupons, of campaignID or of every campaign when it is "", voided
// and redeemed ones included, oldest first; none is not an error. Errors: the database's.
func ForMember(ctx context.Context, db Rows, member, campaignID string) ([]Coupon, error) {
	rows, err := db.Query(ctx, sqlForMember, member, campaignID)
	if err != nil {
		return nil, fmt.Errorf("coupon: coupons of member %s: %w", member, err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (c Coupon, err error) {
		return c, r.Scan(&c.ID, &c.CampaignID, &c.MemberID, &c.AmountYen, &c.Month, &c.IssuedAt,
			&c.ExpiresAt, &c.Expired, &c.GrantedBy, &c.RedeemedAt, &c.Push, &c.PushAt, &c.PushNote, &c.SkipReason, &c.VoidedAt, &c.VoidedBy,
			&c.VoidReason, &c.ReissueAllowed, &c.LegacyDuplicate)
	})
	if err != nil {
		return nil, fmt.Errorf("coupon: coupons of member %s: %w", member, err)
	}
	return list, nil
}

// Rows runs a query: a pool or a connection.
type Rows interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// Show reads coupon id. Errors: [ErrNotFound], or the database's.
func Show(ctx context.Context, db Querier, id string) (Coupon, error) {
	var c Coupon
	if err := CheckID(id); err != nil {
		return c, err
	}
	err := db.QueryRow(ctx, sqlShow, id).Scan(&c.ID, &c.CampaignID, &c.MemberID, &c.AmountYen, &c.Month, &c.IssuedAt,
		&c.ExpiresAt, &c.Expired, &c.GrantedBy, &c.RedeemedAt, &c.Push, &c.PushAt, &c.PushNote, &c.SkipReason, &c.VoidedAt, &c.VoidedBy,
		&c.VoidReason, &c.ReissueAllowed, &c.LegacyDuplicate)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return c, fmt.Errorf("coupon: show %s: %w", id, err)
	}
	return c, nil
}

// Redemption is one row of a coupon's redemption history (coupon_redemptions, 00032): a redeem
// or a rollback, made through RedeemCoupon.
type Redemption struct {
	Action  string // redeem or rollback
	OrderID string // the cart's or the POS's order; "" for a legacy coupon redeemed before the migration
	Reason  string // a rollback's
	At      time.Time
	By      string // the database login that made it (RedeemCoupon's user, or the migration's)
}

const sqlRedemptions = `
SELECT action, coalesce(order_id, ''), coalesce(reason, ''), at, by_login
  FROM coupon_redemptions WHERE coupon_id = $1 ORDER BY redemption_id`

// Redemptions returns coupon id's redemption history, oldest first; none is not an error.
// Errors: the database's.
func Redemptions(ctx context.Context, db Rows, id string) ([]Redemption, error) {
	rows, err := db.Query(ctx, sqlRedemptions, id)
	if err != nil {
		return nil, fmt.Errorf("coupon: redemptions of %s: %w", id, err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Redemption])
	if err != nil {
		return nil, fmt.Errorf("coupon: redemptions of %s: %w", id, err)
	}
	return list, nil
}

// CorrectedFor reports whether coupon id's reissue was allowed by a correction ([AllowReissue])
// given reason: the history row coupon_allow_reissue wrote (coupon_changes). Errors: the
// database's.
func CorrectedFor(ctx context.Context, db Querier, id, reason string) (bool, error) {
	var found bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM coupon_changes
		WHERE coupon_id = $1 AND what = 'allow_reissue' AND reason = $2)`, id, reason).Scan(&found)
	return found, err
}
