package isolationlab

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/shared/backoff"
	"github.com/mops/coupon-api/shared/issuance"
)

// Preallocated is the second Black Friday option (docs/hot-campaigns.md): the campaign budget is
// pre-allocated per instance. Each of Instances simulated instances leases a slice of
// LeaseCoupons coupons from the campaign's budget row (one conditional add of the slice's yen,
// so the row's CHECK still caps the leases at the budget) and issues from memory until the slice
// runs out; only the lease touches the hot row. The issuance transaction is R2 (coupon insert),
// R3 (member x month usage) and the outbox row, without the budget row.
//
// Its costs, which the lab measures:
//   - an instance whose lease finds no room answers BUDGET_EXCEEDED while other instances may
//     still hold unused slices: a false rejection;
//   - an instance that dies strands its unused slice: the row counts it as spent, no coupon
//     exists for it, and nothing gives it back. Instance 0 dies after it has issued KillAfter
//     coupons (0: no instance dies); the requests it would have taken go to the next live one.
//
// [Preallocated.Release] gives the live instances' unused slices back to the row at the end, as
// a graceful shutdown would; after it the row's counter minus the coupons' sum is exactly the
// stranded yen. It runs on the production schema. Nothing here is on a production path.
type Preallocated struct {
	Pool   *pgxpool.Pool
	CapYen int
	// Now is the clock of issued_at and the R3 month.
	Now          func() time.Time
	Instances    int
	LeaseCoupons int
	KillAfter    int

	once      sync.Once
	instances []*leaseInstance
	next      atomic.Int64
}

// leaseInstance is one simulated instance: its slice left in memory and what it issued.
type leaseInstance struct {
	mu     sync.Mutex
	left   int  // coupons leased and not yet issued
	issued int  // coupons this instance issued
	dead   bool // killed: takes no more requests, its slice is stranded
	spent  bool // its last lease found no room: the row's committed counter only grows
}

// Issue routes one request to the next live instance (round robin) and issues from its slice.
// Errors: ctx's error, or a database error that is not retryable.
func (p *Preallocated) Issue(ctx context.Context, memberID, campaignID string) (Outcome, error) {
	p.once.Do(func() {
		p.instances = make([]*leaseInstance, max(p.Instances, 1))
		for i := range p.instances {
			p.instances[i] = &leaseInstance{}
		}
	})
	inst, ok, err := p.takeSlot(ctx, campaignID)
	if err != nil {
		return Outcome{}, err
	}
	if !ok {
		return Outcome{Result: string(issuance.ResultBudgetExceeded), Attempts: 1}, nil
	}
	out, err := p.issueFromSlot(ctx, memberID, campaignID)
	inst.mu.Lock()
	defer inst.mu.Unlock()
	if err != nil || out.Result != string(issuance.ResultIssued) {
		inst.left++ // the slot goes back to the slice (stranded with it if the instance died)
		return out, err
	}
	inst.issued++
	if inst == p.instances[0] && p.KillAfter > 0 && inst.issued == p.KillAfter {
		inst.dead = true
	}
	return out, nil
}

// takeSlot takes one coupon from a live instance's slice, leasing a new slice when it is empty.
// ok is false when the instance's lease found no room in the budget row.
func (p *Preallocated) takeSlot(ctx context.Context, campaignID string) (*leaseInstance, bool, error) {
	n := len(p.instances)
	start := int(p.next.Add(1))
	var inst *leaseInstance
	for i := range n {
		c := p.instances[(start+i)%n]
		c.mu.Lock()
		if !c.dead {
			inst = c
			break
		}
		c.mu.Unlock()
	}
	if inst == nil {
		return nil, false, errors.New("isolationlab: preallocated: every instance is dead")
	}
	defer inst.mu.Unlock()
	if inst.left == 0 && !inst.spent {
		k, err := p.lease(ctx, campaignID)
		if err != nil {
			return nil, false, err
		}
		inst.left = k
		inst.spent = k == 0
	}
	if inst.left == 0 {
		return inst, false, nil
	}
	inst.left--
	return inst, true, nil
}

// lease takes up to LeaseCoupons coupons' yen from the campaign's budget row, as many as it still
// has room for, and returns how many it took (0: the budget is spent).
func (p *Preallocated) lease(ctx context.Context, campaignID string) (int, error) {
	var k int
	err := pgx.BeginFunc(ctx, p.Pool, func(tx pgx.Tx) error {
		var room, discount int
		if err := tx.QueryRow(ctx, `SELECT budget_yen - issued_yen, discount_yen FROM campaign_budgets
 WHERE campaign_id = $1 AND stripe = 0 FOR UPDATE`, campaignID).Scan(&room, &discount); err != nil {
			return err
		}
		k = min(max(p.LeaseCoupons, 1), room/discount)
		if k == 0 {
			return nil
		}
		_, err := tx.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = issued_yen + $2
 WHERE campaign_id = $1 AND stripe = 0`, campaignID, k*discount)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("isolationlab: lease: %w", err)
	}
	return k, nil
}

// issueFromSlot writes one coupon without touching the budget row: R2, R3 and the outbox row in
// one READ COMMITTED transaction, retried on 40001/40P01/55P03 as shared/issuance retries.
func (p *Preallocated) issueFromSlot(ctx context.Context, memberID, campaignID string) (Outcome, error) {
	now := p.Now()
	month := issuance.Month(now)
	for attempt := 1; ; attempt++ {
		var res issuance.Result
		err := pgx.BeginFunc(ctx, p.Pool, func(tx pgx.Tx) error {
			var couponID string
			var amount int
			err := tx.QueryRow(ctx, sqlPreallocatedCoupon, campaignID, memberID, month, now).Scan(&couponID, &amount)
			if errors.Is(err, pgx.ErrNoRows) {
				res = issuance.ResultAlreadyIssued
				return errRollback
			}
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO member_monthly_usage (member_id, month) VALUES ($1, $2)
ON CONFLICT (member_id, month) DO NOTHING`, memberID, month); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `UPDATE member_monthly_usage SET used_yen = used_yen + $3
 WHERE member_id = $1 AND month = $2 AND used_yen + $3 <= $4`, memberID, month, amount, p.CapYen)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				res = issuance.ResultMonthlyCap
				return errRollback
			}
			res = issuance.ResultIssued
			_, err = tx.Exec(ctx, `INSERT INTO notification_outbox (coupon_id, member_id, created_at) VALUES ($1::uuid, $2, $3)`,
				couponID, memberID, now)
			return err
		})
		switch {
		case err == nil || errors.Is(err, errRollback):
			return Outcome{Result: string(res), Attempts: attempt}, nil
		case ctx.Err() != nil:
			return Outcome{Attempts: attempt}, ctx.Err()
		case !issuance.IsRetryable(err):
			return Outcome{Attempts: attempt}, fmt.Errorf("isolationlab: preallocated attempt %d: %w", attempt, err)
		case attempt == issuance.MaxAttempts:
			return Outcome{Result: ResultRetryExhausted, Attempts: attempt}, nil
		}
		sleep(ctx, backoff.FullJitter(issuance.BackoffBase, issuance.BackoffCap, attempt))
	}
}

// errRollback ends a preallocated transaction whose request was rejected, writing nothing.
var errRollback = errors.New("isolationlab: rejected")

// sqlPreallocatedCoupon is R2 as shared/issuance writes it (the partial unique index judges), the
// campaign's discount read from stripe 0. $1 campaign_id, $2 member_id, $3 month, $4 issued_at.
const sqlPreallocatedCoupon = `
INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen, issued_at)
SELECT campaign_id, $2, $3, discount_yen, $4 FROM campaign_budgets WHERE campaign_id = $1 AND stripe = 0
ON CONFLICT (campaign_id, member_id) WHERE NOT legacy_duplicate AND NOT reissue_allowed DO NOTHING
RETURNING coupon_id::text, amount_yen`

// Release gives every live instance's unused slice back to campaignID's budget row, as a graceful
// shutdown would, and returns the coupons it gave back. A dead instance's slice stays stranded.
func (p *Preallocated) Release(ctx context.Context, campaignID string) (int, error) {
	back := 0
	for _, inst := range p.instances {
		inst.mu.Lock()
		if !inst.dead {
			back += inst.left
			inst.left = 0
		}
		inst.mu.Unlock()
	}
	if back == 0 {
		return 0, nil
	}
	_, err := p.Pool.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = issued_yen - $2 * discount_yen
 WHERE campaign_id = $1 AND stripe = 0`, campaignID, back)
	if err != nil {
		return 0, fmt.Errorf("isolationlab: release: %w", err)
	}
	return back, nil
}
