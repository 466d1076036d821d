// Package consolerole grants the console's roles to the promotion team's people, by email, and
// lists them with their history (console_roles and console_role_changes, migration 00026). A
// grant goes through console_role_set, as a user in coupon_admin, which writes the history row in
// the same transaction (`couponctl console grant`). What each role may do is enforced in the
// database by the console_* functions (docs/roles.md, "The console"); an email without a role
// is a viewer.
package consolerole

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mops/coupon-api/shared/db"
)

// Role is what a person may do in the console.
type Role string

// The console's roles, each allowed what the one before it is, and more.
const (
	Viewer   Role = "viewer"   // reads every page; the role of an email never granted
	Operator Role = "operator" // also pauses, resumes, ends, changes budgets, asks for period moves, voids
	Approver Role = "approver" // also approves or rejects another person's request
)

// Roles lists the roles, least first.
var Roles = []Role{Viewer, Operator, Approver}

// ParseRole returns the role named s, or an error naming the roles.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("role %q: want viewer, operator or approver", s)
}

// ErrRefused is returned, wrapped with the database's explanation, for a grant the database
// refuses: a malformed email, an unknown role, a blank reason. Nothing changed.
var ErrRefused = errors.New("console role: grant refused")

// Holder is an email that holds a role, with the grant that gave it.
type Holder struct {
	Email     string // lower case, as console_roles keeps it
	Role      Role
	ChangedAt time.Time
	ChangedBy string // the database login that granted it
}

// Change is one row of the roles' history (console_role_changes), oldest first by ID.
type Change struct {
	ID     int64
	Email  string
	Before Role // viewer for an email that held no role
	After  Role
	Reason string
	By     string // the database login (on Cloud SQL, the operator's IAM user)
	At     time.Time
}

const changeColumns = `change_id, email, before, after, reason, changed_by, changed_at`

// Grant gives email the console role, with reason for the history, and returns the history row
// it wrote, or false when the email held that role already (nothing written). The database
// normalizes the email to lower case. Errors: [ErrRefused], wrapped; 42501 when q's user is not
// in coupon_admin; 55P03 when another grant held the roles past 1 s.
func Grant(ctx context.Context, q db.Querier, email string, role Role, reason string) (Change, bool, error) {
	c, err := scanChange(q.QueryRow(ctx, `SELECT `+changeColumns+` FROM console_role_set($1, $2, $3)`, email, string(role), reason))
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return c, false, nil
	case errors.As(err, &pgErr) && pgErr.Code == sqlStateRefused:
		return c, false, fmt.Errorf("%w: %s", ErrRefused, pgErr.Message)
	case err != nil:
		return c, false, fmt.Errorf("console role: grant %s %s: %w", email, role, err)
	}
	return c, true, nil
}

// Of returns the console role of email: [Viewer] for an email never granted one. Errors:
// [ErrRefused], wrapped, for a malformed email.
func Of(ctx context.Context, q db.Querier, email string) (Role, error) {
	var r string
	err := q.QueryRow(ctx, `SELECT console_role_of($1)`, email).Scan(&r)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlStateRefused {
		return "", fmt.Errorf("%w: %s", ErrRefused, pgErr.Message)
	}
	if err != nil {
		return "", fmt.Errorf("console role: role of %s: %w", email, err)
	}
	return Role(r), nil
}

// List returns the emails that hold a role, by email, and every change of the roles, oldest
// first.
func List(ctx context.Context, q db.Querier) ([]Holder, []Change, error) {
	rows, err := q.Query(ctx, `SELECT email, role, changed_at, changed_by FROM console_roles ORDER BY email`)
	if err != nil {
		return nil, nil, fmt.Errorf("console role: list: %w", err)
	}
	holders, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (h Holder, err error) {
		return h, row.Scan(&h.Email, &h.Role, &h.ChangedAt, &h.ChangedBy)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("console role: list: %w", err)
	}
	if rows, err = q.Query(ctx, `SELECT `+changeColumns+` FROM console_role_changes ORDER BY change_id`); err != nil {
		return nil, nil, fmt.Errorf("console role: history: %w", err)
	}
	changes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Change, error) { return scanChange(row) })
	if err != nil {
		return nil, nil, fmt.Errorf("console role: history: %w", err)
	}
	return holders, changes, nil
}

func scanChange(row pgx.Row) (c Change, err error) {
	var before, after string
	err = row.Scan(&c.ID, &c.Email, &before, &after, &c.Reason, &c.By, &c.At)
	c.Before, c.After = Role(before), Role(after)
	return c, err
}

// sqlStateRefused is what console_role_set and console_role_of raise for what they refuse.
const sqlStateRefused = "CI422"
