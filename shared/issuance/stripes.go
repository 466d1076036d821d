package issuance

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// addToBudget is R1: it adds amountYen to the campaign's budget and returns the transaction's
// id (for settling a lost COMMIT answer), or returns the BUDGET_EXCEEDED rejection when the
// budget has no room for it.
//
// A campaign of one stripe is one conditional UPDATE of its row, waiting for the row while another
// transaction holds it: the R1 statement of docs/design.md ("One lock row per invariant").
//
// A campaign of several budget stripes (docs/hot-campaigns.md) first takes any stripe with room
// that no transaction holds (SKIP LOCKED), so that concurrent issuances spread over the stripes.
// Only when every stripe with room is held does it wait, for one of them; if that stripe's holder
// took its last room, it starts over. It answers BUDGET_EXCEEDED only when the committed
// counters show no stripe with room, so no request is refused while budget remains, even when a
// single stripe holds the last coupon. The transaction holds at most one stripe at a time, so
// stripes add no deadlock.
func addToBudget(ctx context.Context, tx pgx.Tx, campaignID string, amountYen, stripes int) (xid string, err error) {
	if stripes <= 1 {
		return addToStripe(ctx, tx, campaignID, 0, amountYen)
	}
	for {
		err := tx.QueryRow(ctx, sqlBudgetFreeStripeAdd, campaignID, amountYen).Scan(&xid)
		if !errors.Is(err, pgx.ErrNoRows) {
			return xid, err // nil: a free stripe took the coupon
		}
		var stripe int
		err = tx.QueryRow(ctx, sqlBudgetStripeWithRoom, campaignID, amountYen).Scan(&stripe)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", &rejection{Outcome{Result: ResultBudgetExceeded}}
		}
		if err != nil {
			return "", err
		}
		xid, err = addToStripe(ctx, tx, campaignID, stripe, amountYen)
		var rej *rejection
		if !errors.As(err, &rej) {
			return xid, err // nil: the waited-for stripe still had room
		}
	}
}

// addToStripe adds amountYen to one budget stripe, waiting for its row if it is held, and returns
// the transaction's id, or returns the BUDGET_EXCEEDED rejection when the stripe has no room.
func addToStripe(ctx context.Context, tx pgx.Tx, campaignID string, stripe, amountYen int) (xid string, err error) {
	err = tx.QueryRow(ctx, sqlBudgetStripeAdd, campaignID, stripe, amountYen).Scan(&xid)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", &rejection{Outcome{Result: ResultBudgetExceeded}}
	}
	return xid, err
}
