// Package rules reads and changes the rule settings the database holds (coupon_rules, migrations
// 00021 and 00026): R3's monthly cap in yen, which every issuance and reconcile read, the
// console's approval line, and their history.
// An operator changes it only through coupon_rules_set, which writes the history row in the
// same transaction (`couponctl rules set`); a client's environment never sets it.
package rules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/issuance"
)

// ErrRefused is returned, wrapped with the database's explanation, for a setting the rules
// cannot take: a cap outside 1..[issuance.MaxMonthlyCapYen], an approval line outside
// 0..[MaxApprovalAboveYen], nothing to set, a blank reason. Nothing changed.
var ErrRefused = errors.New("rules: change refused")

// ErrBusy is returned, wrapped, when coupon_rules_set gave up waiting for coupon_rules' lock
// (SQLSTATE 55P03): nothing changed.
var ErrBusy = errors.New("rules: busy")

// Settings are the rule settings in force.
type Settings struct {
	MonthlyCapYen int // R3's cap per member and Asia/Tokyo month, in yen
	// ApprovalAboveYen is the console's four-eyes line, in yen: a budget raise through the
	// console of more than this over the budget in force waits for a second approver
	// (console_budget, migration 00026). 100,000 until changed.
	ApprovalAboveYen int64
	ChangedAt        time.Time // when they were last set
	ChangedBy        string    // the database login that set them
}

// Change is one row of the settings' history (coupon_rules_changes), oldest first by ID.
type Change struct {
	ID int64
	At time.Time
	By string // the database login (on Cloud SQL, the operator's IAM user)
	// Before and After hold the settings changed: monthly_cap_yen, approval_above_yen. Before
	// is empty for the rows the migrations wrote (00021's cap, 00026's line).
	Before, After map[string]any
	Reason        string
}

const changeColumns = `change_id, changed_at, changed_by, before, after, reason`

// Show returns the settings in force and their history, oldest first, read in one snapshot.
func Show(ctx context.Context, q db.Querier) (Settings, []Change, error) {
	var s Settings
	rows, err := q.Query(ctx, `SELECT r.monthly_cap_yen, r.approval_above_yen, r.changed_at, r.changed_by,
       c.change_id, c.changed_at, c.changed_by, c.before, c.after, c.reason
  FROM coupon_rules r CROSS JOIN coupon_rules_changes c ORDER BY c.change_id`)
	if err != nil {
		return s, nil, fmt.Errorf("rules: show: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Change, error) {
		var c Change
		var before, after []byte
		if err := row.Scan(&s.MonthlyCapYen, &s.ApprovalAboveYen, &s.ChangedAt, &s.ChangedBy, &c.ID, &c.At, &c.By, &before, &after, &c.Reason); err != nil {
			return c, err
		}
		return c, unmarshal(before, after, &c)
	})
	if err == nil && len(list) == 0 {
		err = errors.New("coupon_rules holds no row (is the database migrated?)")
	}
	if err != nil {
		return s, nil, fmt.Errorf("rules: show: %w", err)
	}
	return s, list, nil
}

func unmarshal(before, after []byte, c *Change) error {
	if err := json.Unmarshal(before, &c.Before); err != nil {
		return err
	}
	return json.Unmarshal(after, &c.After)
}

// MaxApprovalAboveYen bounds the approval line, in yen: a campaign's largest budget
// (campaign_change_budget's bound), above which no raise can be.
const MaxApprovalAboveYen = 2147483647

// SetMonthlyCap sets R3's cap to capYen yen for the issuances that start after it commits;
// coupons already issued stay. It returns the history row it wrote, or false when the cap
// already was capYen (nothing written). Errors: [ErrRefused], wrapped, for a cap outside
// 1..[issuance.MaxMonthlyCapYen] or a blank reason; [ErrBusy], wrapped, when the lock wait
// passed 1 s; 42501 when q's user is not in coupon_admin.
func SetMonthlyCap(ctx context.Context, q db.Querier, capYen int, reason string) (Change, bool, error) {
	return Set(ctx, q, &capYen, nil, reason)
}

// Set sets the settings given: R3's cap (capYen, as [SetMonthlyCap]) and the console's approval
// line (approvalAboveYen, 0 to [MaxApprovalAboveYen] yen; 0 sends every raise for approval); nil
// keeps a setting, and at least one is given. It writes one history row holding the settings it
// changed and returns it, or false when both were as given already (nothing written). A change
// of the line alone makes no issuance wait. Errors as [SetMonthlyCap], and [ErrRefused] for a
// line out of range or nothing to set.
func Set(ctx context.Context, q db.Querier, capYen *int, approvalAboveYen *int64, reason string) (Change, bool, error) {
	var c Change
	if err := Check(capYen, approvalAboveYen); err != nil {
		return c, false, err
	}
	var before, after []byte
	err := q.QueryRow(ctx, `SELECT `+changeColumns+` FROM coupon_rules_set($1::integer, $2::bigint, $3)`, capYen, approvalAboveYen, reason).
		Scan(&c.ID, &c.At, &c.By, &before, &after, &c.Reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	if err != nil {
		return c, false, explain(err)
	}
	return c, true, unmarshal(before, after, &c)
}

// Check refuses, with [ErrRefused] wrapped, the settings [Set] refuses before it sends them:
// neither given, a cap outside 1..[issuance.MaxMonthlyCapYen], a line outside
// 0..[MaxApprovalAboveYen].
func Check(capYen *int, approvalAboveYen *int64) error {
	switch {
	case capYen == nil && approvalAboveYen == nil:
		return fmt.Errorf("%w: nothing to set: give a monthly cap, an approval line or both", ErrRefused)
	case capYen != nil && (*capYen < 1 || *capYen > issuance.MaxMonthlyCapYen):
		return fmt.Errorf("%w: a monthly cap of %d yen: want 1 to %d", ErrRefused, *capYen, issuance.MaxMonthlyCapYen)
	case approvalAboveYen != nil && (*approvalAboveYen < 0 || *approvalAboveYen > MaxApprovalAboveYen):
		return fmt.Errorf("%w: an approval line of %d yen: want 0 to %d", ErrRefused, *approvalAboveYen, MaxApprovalAboveYen)
	}
	return nil
}

// explain turns coupon_rules_set's refusals into [ErrRefused] and a lock wait past its
// lock_timeout into [ErrBusy].
func explain(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == sqlStateRefused:
		return fmt.Errorf("%w: %s", ErrRefused, pgErr.Message)
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable:
		return fmt.Errorf("%w: coupon_rules stayed locked past coupon_rules_set's 1 s lock_timeout "+
			"(an issuance or a reader held it; pg_stat_activity shows the holder); nothing changed, run it again", ErrBusy)
	}
	return fmt.Errorf("rules: set: %w", err)
}

// sqlStateRefused is what coupon_rules_set raises for a setting it refuses.
const sqlStateRefused = "CI422"
