package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrRefused is returned, wrapped with the database's explanation, for a change the campaign
// cannot take: a budget below the yen already issued, more stripes than coupons, a period that
// ends before it starts, ending a campaign that has not started. Nothing was changed.
var ErrRefused = errors.New("campaign: change refused")

// ErrBusy is returned, wrapped, for a change that gave up waiting for one of the campaign's
// budget stripes ([ChangeLockTimeout]): another transaction holds it. Nothing was changed; the
// change can be run again.
var ErrBusy = errors.New("campaign: budget stripes held by another transaction")

// ChangeLockTimeout is how long a change waits for each budget stripe, unless its session sets
// a lock_timeout of its own (PGOPTIONS="-c lock_timeout=10s", ALTER ROLE). While a change waits
// for a stripe it holds the stripes before it, and their issuances queue behind it, so by default
// it gives up where an issuance does (issuance.DefaultLockTimeout: past 1 s the holder is stuck,
// not busy) rather than stall the campaign behind a stuck holder.
const ChangeLockTimeout = time.Second

// Changes is what `couponctl campaign update` changes in one transaction. Nil fields are kept.
type Changes struct {
	// BudgetYen is the new budget in yen, or AddBudgetYen what to add to the present one
	// (negative cuts); at most one of the two. Two adds at once both take effect.
	BudgetYen, AddBudgetYen *int64
	// Stripes is the new number of budget stripes, 1 to [MaxStripes].
	Stripes *int
	// StartsAt and EndsAt move the period when their Set flag is true; a nil time is an
	// open bound.
	StartsAt, EndsAt   *time.Time
	SetStarts, SetEnds bool
	// ValidDays and ExpireAt are the validity of the coupons issued from now on when
	// SetValidity is true (see [Campaign.CouponValidDays]); both zero removes it. Coupons
	// issued before keep theirs.
	ValidDays   int
	ExpireAt    *time.Time
	SetValidity bool
	// Releases are added to the campaign's releases, after the budget change: each in the
	// future by the database's clock, before the end, at an instant not used, within the
	// budget, on a campaign created with releases (else [ErrRefused]).
	Releases []Release
	// Name, when set, renames the campaign (campaign_name_set, 00037).
	Name   *string
	Reason string
}

// Empty reports whether c changes nothing.
func (c Changes) Empty() bool {
	return c.BudgetYen == nil && c.AddBudgetYen == nil && c.Stripes == nil && !c.SetStarts && !c.SetEnds && !c.SetValidity &&
		len(c.Releases) == 0 && c.Name == nil
}

// Change is one row of a campaign's history (campaign_changes, 00010_live_campaigns.sql).
type Change struct {
	ID         int64
	CampaignID string
	// At is when the change took effect: once it held the campaign's stripes, before its commit.
	At time.Time
	// By is the database login that made it (on Cloud SQL, the operator's IAM user, or the
	// console's service account).
	By string
	// Person is the email of the person who made it through the console (for an approved
	// request, the approver), empty for a change made with couponctl (migration 00026).
	Person string
	// RequestID is the console's change request this change applied
	// (campaign_change_requests: its requester and both reasons), 0 for none.
	RequestID int64
	// What is create, budget, stripes, period, pause, resume, end, validity, or what
	// 00025_campaign_kinds.sql's functions write for a release and an audience change.
	What string
	// Before and After are the figures the change read and wrote: budget_yen, issued_yen and
	// stripes for a budget or stripes change; starts_at, ends_at and paused_at otherwise.
	Before, After map[string]any
	Reason        string
}

// Querier runs statements and pipelines: a pool or a connection.
type Querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}

const changeColumns = `change_id, campaign_id, changed_at, changed_by, what, before, after, reason,
	coalesce(operator_email, ''), coalesce(request_id, 0)`

const (
	sqlChangeLockTimeout = `SELECT set_config('lock_timeout', CASE current_setting('lock_timeout') WHEN '0' THEN $1 ELSE current_setting('lock_timeout') END, true)`
	sqlChangeBudget      = `SELECT ` + changeColumns + ` FROM campaign_change_budget($1, $2, $3, $4, $5)`
	sqlChangeState       = `SELECT ` + changeColumns + ` FROM campaign_change_state($1, $2, $3, $4, $5, $6, $7)`
	sqlChangeValid       = `SELECT ` + changeColumns + ` FROM campaign_change_validity($1, $2, $3, $4)`
	sqlNameSet           = `SELECT ` + changeColumns + ` FROM campaign_name_set($1, $2, $3)`
)

// Update applies c to campaign id through the schema's change functions
// (schema/current/campaign_change_*.sql), which lock the campaign's stripes with the change's
// lock protocol (docs/design.md, "Lock order"), judge the change on them and write the history, and returns the history
// rows they wrote: none when c leaves everything as it was. The calls go in one pipeline, one
// implicit transaction committed in the server as the last one ends, so the stripes are never
// held across a network round trip. Errors: [ErrNotFound], [ErrRefused] and [ErrBusy] (nothing
// changed), or the database's.
func Update(ctx context.Context, db Querier, id string, c Changes) ([]Change, error) {
	if c.Empty() {
		return nil, fmt.Errorf("%w: campaign %s: nothing to change", ErrRefused, id)
	}
	// The period and the validity first: they may reopen an ended campaign, which then takes the
	// budget and releases of the same update (the change functions refuse those of an ended one).
	b := &pgx.Batch{}
	if c.SetStarts || c.SetEnds {
		b.Queue(sqlChangeState, id, "period", c.StartsAt, c.EndsAt, c.SetStarts, c.SetEnds, c.Reason)
	}
	if c.SetValidity {
		var days *int
		if c.ValidDays != 0 {
			days = &c.ValidDays
		}
		b.Queue(sqlChangeValid, id, days, c.ExpireAt, c.Reason)
	}
	if c.BudgetYen != nil || c.AddBudgetYen != nil || c.Stripes != nil {
		b.Queue(sqlChangeBudget, id, c.BudgetYen, c.AddBudgetYen, c.Stripes, c.Reason)
	}
	for _, r := range c.Releases {
		b.Queue(sqlReleaseAdd, id, r.At, r.Coupons, c.Reason)
	}
	if c.Name != nil {
		b.Queue(sqlNameSet, id, *c.Name, c.Reason)
	}
	return run(ctx, db, id, b)
}

// Pause pauses campaign id: once it returns, no coupon of the campaign commits until [Resume]
// returns. It returns the history row, or nil when the campaign was paused already. Errors:
// [ErrNotFound], [ErrRefused] (no reason given), [ErrBusy], or the database's.
func Pause(ctx context.Context, db Querier, id, reason string) (*Change, error) {
	return stateChange(ctx, db, id, "pause", reason)
}

// Resume lets a paused campaign id issue again, within its period. It returns the history row, or
// nil when the campaign was not paused. Errors as [Pause].
func Resume(ctx context.Context, db Querier, id, reason string) (*Change, error) {
	return stateChange(ctx, db, id, "resume", reason)
}

// End ends campaign id now: its ends_at becomes the change's time, and once End returns no
// coupon of it commits. It returns the history row, or nil when the campaign had ended already.
// Errors as [Pause], and [ErrRefused] for a campaign that has not started.
func End(ctx context.Context, db Querier, id, reason string) (*Change, error) {
	return stateChange(ctx, db, id, "end", reason)
}

func stateChange(ctx context.Context, db Querier, id, what, reason string) (*Change, error) {
	b := &pgx.Batch{}
	b.Queue(sqlChangeState, id, what, nil, nil, false, false, reason)
	got, err := run(ctx, db, id, b)
	if err != nil || len(got) == 0 {
		return nil, err
	}
	return &got[0], nil
}

// run sends the change calls of b as [sendChange] does and collects the history rows they
// return.
func run(ctx context.Context, db Querier, id string, b *pgx.Batch) ([]Change, error) {
	var out []Change
	for _, q := range b.QueuedQueries {
		q.Query(func(rows pgx.Rows) error {
			got, err := collect(rows)
			out = append(out, got...)
			return err
		})
	}
	if err := sendChange(ctx, db, id, b); err != nil {
		return nil, err
	}
	return out, nil
}

// sendChange sends the change calls of b on campaign id in one pipeline, after
// [ChangeLockTimeout] (local to its implicit transaction), and explains their errors.
func sendChange(ctx context.Context, db Querier, id string, b *pgx.Batch) error {
	timeouts := &pgx.QueuedQuery{SQL: sqlChangeLockTimeout,
		Arguments: []any{ChangeLockTimeout.String()}}
	b.QueuedQueries = append([]*pgx.QueuedQuery{timeouts}, b.QueuedQueries...)
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return explain(id, err)
	}
	return nil
}

// History returns every change of campaign id, oldest first. Errors: [ErrNotFound], or the
// database's.
func History(ctx context.Context, db Querier, id string) ([]Change, error) {
	if _, err := Show(ctx, db, id); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT `+changeColumns+` FROM campaign_changes WHERE campaign_id = $1 ORDER BY change_id`, id)
	var list []Change
	if err == nil {
		list, err = collect(rows)
	}
	if err != nil {
		return nil, fmt.Errorf("campaign: history of %s: %w", id, err)
	}
	return list, nil
}

func collect(rows pgx.Rows) ([]Change, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (c Change, err error) {
		var before, after []byte
		if err := row.Scan(&c.ID, &c.CampaignID, &c.At, &c.By, &c.What, &before, &after, &c.Reason, &c.Person, &c.RequestID); err != nil {
			return c, err
		}
		if err := json.Unmarshal(before, &c.Before); err != nil {
			return c, err
		}
		return c, json.Unmarshal(after, &c.After)
	})
}

// SQLSTATEs the change functions raise (schema/current/campaign_change_*.sql, campaign_lock.sql).
const (
	sqlStateNotFound = "CI404"
	sqlStateRefused  = "CI422"
)

// explain turns the change functions' refusals into [ErrNotFound] and [ErrRefused], and a lock
// wait past [ChangeLockTimeout] into [ErrBusy].
func explain(id string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case sqlStateNotFound:
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		case sqlStateRefused:
			return fmt.Errorf("%w: %s", ErrRefused, pgErr.Message)
		case pgerrcode.LockNotAvailable:
			return fmt.Errorf("%w: %s: a budget stripe stayed locked past the lock_timeout (%s unless the session sets one; pg_stat_activity shows the holder); nothing changed, run it again",
				ErrBusy, id, ChangeLockTimeout)
		}
	}
	return fmt.Errorf("campaign: change %s: %w", id, err)
}
