package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/shared/redemption"
)

// The demo's checkout: after the relay, members use some of their coupons at the cart. Every
// demoRedeemEvery-th live coupon (in coupon id order) is redeemed by an order of its own, and
// the cart sends each redeem twice (a double submit: the same answer again); every
// demoRollbackEvery-th of those orders is cancelled (a rollback with a reason), and every
// demoOtherOrderEvery-th coupon is presented by a second order too (ALREADY_REDEEMED).
const (
	demoRedeemEvery     = 3
	demoRollbackEvery   = 5
	demoOtherOrderEvery = 10
	demoCheckoutClients = 8
)

// checkoutStep is one call of the demo's checkout and the answer the contract gives it.
type checkoutStep struct {
	action, order string
	want          redemption.Result
}

// sqlDemoCheckout lists the coupons the demo's checkout redeems, with their members.
const sqlDemoCheckout = `
SELECT coupon_id::text, member_id FROM (
  SELECT coupon_id, member_id, row_number() OVER (ORDER BY coupon_id) AS n FROM issued_coupons WHERE voided_at IS NULL) c
 WHERE n % $1 = 0 ORDER BY coupon_id`

// sqlDemoRedemptions counts, from the tables, the coupons redeemed now and the history's rows.
const sqlDemoRedemptions = `
SELECT (SELECT count(*) FROM issued_coupons WHERE redeemed_at IS NOT NULL AND voided_at IS NULL),
       (SELECT count(*) FROM issued_coupons WHERE voided_at IS NULL),
       count(*) FILTER (WHERE action = 'redeem'), count(*) FILTER (WHERE action = 'rollback')
  FROM coupon_redemptions`

// demoCheckout runs the checkout through RedeemCoupon at url (over HTTP, as the cart calls it),
// then counts the redemptions with SQL and prints both. It returns what went wrong: an answer
// other than the contract's, or tables that disagree with what was answered.
func demoCheckout(ctx context.Context, out io.Writer, pool *pgxpool.Pool, url string) ([]string, error) {
	rows, err := pool.Query(ctx, sqlDemoCheckout, demoRedeemEvery)
	if err != nil {
		return nil, err
	}
	type pick struct{ Coupon, Member string }
	picks, err := pgx.CollectRows(rows, pgx.RowToStructByPos[pick])
	if err != nil {
		return nil, err
	}
	var wrong []string
	var tally checkoutTally
	client := &http.Client{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(demoCheckoutClients)
	wrongs := make([]string, len(picks))
	for i, p := range picks {
		g.Go(func() (err error) {
			wrongs[i], err = checkoutOne(gctx, client, url, i, p.Coupon, p.Member, &tally)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("checkout: %w", err)
	}
	for _, w := range wrongs {
		if w != "" {
			wrong = append(wrong, w)
		}
	}
	fmt.Fprintf(out, "\nCheckout (RedeemCoupon over HTTP, %d clients): %d coupons redeemed, each sent twice by its order; "+
		"%d orders cancelled (rolled back); %d second orders refused ALREADY_REDEEMED; %d answers off the contract\n",
		demoCheckoutClients, len(picks), tally.rolledBack.Load(), tally.refused.Load(), tally.offContract.Load())

	problem, err := redemptionReport(ctx, out, pool, int64(len(picks)), tally.rolledBack.Load())
	if problem != "" {
		wrong = append(wrong, problem)
	}
	return wrong, err
}

// redemptionReport counts the redemptions with SQL and reconcile's drift, prints them, and
// returns how the tables disagree with the checkout's redeemed coupons and rollbacks, "" when
// they agree.
func redemptionReport(ctx context.Context, out io.Writer, pool *pgxpool.Pool, coupons, rolledBack int64) (string, error) {
	var redeemed, live, redeems, rollbacks int64
	if err := pool.QueryRow(ctx, sqlDemoRedemptions).Scan(&redeemed, &live, &redeems, &rollbacks); err != nil {
		return "", err
	}
	rep, err := reconcile.Check(ctx, pool)
	if err != nil {
		return "", err
	}
	rate := 0.0
	if live > 0 {
		rate = 100 * float64(redeemed) / float64(live)
	}
	fmt.Fprintf(out, "Redemption report (SQL on the tables): %d of %d live coupons redeemed now (%.1f%% used); "+
		"history %d redeem and %d rollback rows; redemption drift %d\n", redeemed, live, rate, redeems, rollbacks, rep.RedemptionDrift)
	if redeemed != coupons-rolledBack || redeems != coupons || rollbacks != rolledBack || rep.RedemptionDrift != 0 {
		return fmt.Sprintf("redemption: the tables hold %d redeemed coupons, %d redeem and %d rollback rows, drift %d; "+
			"the answers say %d, %d, %d and 0", redeemed, redeems, rollbacks, rep.RedemptionDrift, coupons-rolledBack, coupons, rolledBack), nil
	}
	return "", nil
}

// checkoutTally counts the checkout's answers: those off the contract, the rollbacks, and the
// second orders refused.
type checkoutTally struct{ offContract, rolledBack, refused atomic.Int64 }

// checkoutOne is the i-th pick's checkout, coupon of member: its order's redeem twice, a second
// order's for every demoOtherOrderEvery-th, a rollback for every demoRollbackEvery-th. It
// returns the first answer off the contract, "" when none, counted in tally. Errors: a call that
// got no answer.
func checkoutOne(ctx context.Context, client *http.Client, url string, i int, coupon, member string, tally *checkoutTally) (string, error) {
	order := fmt.Sprintf("SW-ORDER-%04d", i)
	steps := []checkoutStep{
		{"redeem", order, redemption.ResultRedeemed},
		{"redeem", order, redemption.ResultRedeemed}, // the double submit
	}
	if i%demoOtherOrderEvery == 0 {
		steps = append(steps, checkoutStep{"redeem", order + "-B", redemption.ResultAlreadyRedeemed})
	}
	if i%demoRollbackEvery == 0 {
		steps = append(steps, checkoutStep{"rollback", order, redemption.ResultRolledBack})
	}
	wrong := ""
	for _, s := range steps {
		body := map[string]any{"action": s.action, "coupon_id": coupon, "member_id": member, "order_id": s.order}
		if s.action == "rollback" {
			body["reason"] = "the order was cancelled"
		}
		_, result, err := postForResult(ctx, client, url, body)
		if err != nil {
			return "", fmt.Errorf("RedeemCoupon: %w", err)
		}
		switch got := redemption.Result(result); {
		case got != s.want:
			tally.offContract.Add(1)
			wrong = fmt.Sprintf("checkout: %s of %s by %s answered %s, want %s", s.action, coupon, s.order, got, s.want)
		case got == redemption.ResultRolledBack:
			tally.rolledBack.Add(1)
		case got == redemption.ResultAlreadyRedeemed:
			tally.refused.Add(1)
		}
	}
	return wrong, nil
}
