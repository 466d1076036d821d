package reconcile

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Repaired is what [Repair] changed, in yen.
type Repaired struct {
	// Campaigns are the campaign counters rebuilt: before and after, summed over the stripes.
	Campaigns []CounterFix `json:"campaigns"`
	// Usage are the member x month counters rebuilt.
	Usage []CounterFix `json:"usage"`
	// Refused names the campaigns whose live coupons exceed their budget: the counter cannot be
	// written past the budget (issued_within_budget), so they are left for an operator.
	Refused []string `json:"refused,omitempty"`
}

// CounterFix is one counter rebuilt from its rows.
type CounterFix struct {
	Key       string `json:"key"` // campaign id, or member id and month
	BeforeYen int64  `json:"before_yen"`
	AfterYen  int64  `json:"after_yen"`
}

// repairLockTimeout bounds each lock the repair waits for, so that a repair queued behind a long
// transaction gives up (55P03) instead of holding issuances behind it.
const repairLockTimeout = "2s"

// repairReason is the reason of the 'repair' history row of each campaign the repair changes.
const repairReason = "couponctl reconcile --repair"

// Repair rebuilds every drifted counter from the live coupons through counters_repair
// (schema/current/counters_repair.sql), in one READ COMMITTED transaction, with the repair's
// lock protocol (docs/design.md, "Lock order": month rows, then each campaign's stripes). Each
// campaign it changes gets a 'repair' row in its history. Errors: the database's (55P03 when a
// row stays locked past the lock timeout); nothing is written then.
func Repair(ctx context.Context, conn interface {
	Begin(context.Context) (pgx.Tx, error)
}) (Repaired, error) {
	var rep Repaired
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rep = Repaired{}
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, repairLockTimeout); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT kind, key, before_yen, after_yen FROM counters_repair($1)`, repairReason)
		if err != nil {
			return err
		}
		var kind string
		var fix CounterFix
		_, err = pgx.ForEachRow(rows, []any{&kind, &fix.Key, &fix.BeforeYen, &fix.AfterYen}, func() error {
			switch kind {
			case "usage":
				rep.Usage = append(rep.Usage, fix)
			case "campaign":
				rep.Campaigns = append(rep.Campaigns, fix)
			case "refused": // before_yen is the budget, after_yen the live coupons' yen
				rep.Refused = append(rep.Refused, fmt.Sprintf("%s: live coupons %d yen over its %d yen budget", fix.Key, fix.AfterYen, fix.BeforeYen))
			default:
				return fmt.Errorf("counters_repair answered kind %q", kind)
			}
			return nil
		})
		return err
	})
	if err != nil {
		return Repaired{}, fmt.Errorf("reconcile: repair: %w", err)
	}
	return rep, nil
}
