// Package rules reads and changes the rule settings the database holds (coupon_rules, migration
// 00021): R3's monthly cap in yen, which every issuance and reconcile read, and its history.
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
// cannot take: a cap outside 1..[issuance.MaxMonthlyCapYen], a blank reason. Nothing changed.
var ErrRefused = errors.New("rules: change refused")

// ErrBusy is returned, wrapped, when coupon_rules_set gave up waiting for coupon_rules' lock
// (SQLSTATE 55P03): nothing changed.
var ErrBusy = errors.New("rules: busy")

// Settings are the rule settings in force.
type Settings struct {
	MonthlyCapYen int       // R3's cap per member and Asia/Tokyo month, in yen
	ChangedAt     time.Time // when they were last set
	ChangedBy     string    // the database login that set them
}

// Change is one row of the settings' history (coupon_rules_changes), oldest first by ID.
type Change struct {
	ID int64
	At time.Time
	By string // the database login (on Cloud SQL, the operator's IAM user)
	// Before and After hold the settings changed: monthly_cap_yen. Before is empty for the
	// first row, written by migration 00021.
	Before, After map[string]any
	Reason        string
}

const changeColumns = `change_id, changed_at, changed_by, before, after, reason`

// Show returns the settings in force and their history, oldest first, read in one snapshot.
func Show(ctx context.Context, q db.Querier) (Settings, []Change, error) {
	var s Settings
	rows, err := q.Query(ctx, `SELECT r.monthly_cap_yen, r.changed_at, r.changed_by,
       c.change_id, c.changed_at, c.changed_by, c.before, c.after, c.reason
  FROM coupon_rules r CROSS JOIN coupon_rules_changes c ORDER BY c.change_id`)
	if err != nil {
		return s, nil, fmt.Errorf("rules: show: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Change, error) {
		var c Change
		var before, after []byte
		if err := row.Scan(&s.MonthlyCapYen, &s.ChangedAt, &s.ChangedBy, &c.ID, &c.At, &c.By, &before, &after, &c.Reason); err != nil {
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

// SetMonthlyCap sets R3's cap to capYen yen for the issuances that start after it commits;
// coupons already issued stay. It returns the history row it wrote, or false when the cap
// already was capYen (nothing written). Errors: [ErrRefused], wrapped, for a cap outside
// 1..[issuance.MaxMonthlyCapYen] or a blank reason; [ErrBusy], wrapped, when the lock wait
// passed 1 s; 42501 when q's user is not in coupon_admin.
func SetMonthlyCap(ctx context.Context, q db.Querier, capYen int, reason string) (Change, bool, error) {
	var c Change
	if capYen < 1 || capYen > issuance.MaxMonthlyCapYen {
		return c, false, fmt.Errorf("%w: a monthly cap of %d yen: want 1 to %d", ErrRefused, capYen, issuance.MaxMonthlyCapYen)
	}
	var before, after []byte
	err := q.QueryRow(ctx, `SELECT `+changeColumns+` FROM coupon_rules_set($1, $2)`, capYen, reason).
		Scan(&c.ID, &c.At, &c.By, &before, &after, &c.Reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == sqlStateRefused:
		return c, false, fmt.Errorf("%w: %s", ErrRefused, pgErr.Message)
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.LockNotAvailable:
		return c, false, fmt.Errorf("%w: coupon_rules stayed locked past coupon_rules_set's 1 s lock_timeout "+
			"(an issuance or a reader held it; pg_stat_activity shows the holder); nothing changed, run it again", ErrBusy)
	}
	if err != nil {
		return c, false, fmt.Errorf("rules: set the monthly cap: %w", err)
	}
	return c, true, unmarshal(before, after, &c)
}

// sqlStateRefused is what coupon_rules_set raises for a setting it refuses.
const sqlStateRefused = "CI422"
