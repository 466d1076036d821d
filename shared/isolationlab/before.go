// Package isolationlab holds the strategies that the design write-up (seeds/000) measured and
// rejected, written in Go so that the same load and the same SQL checks can show what each one
// breaks. Nothing here is on a production path: the tests use it to prove that their checks can
// fail, and `couponctl sim` compares it with the production path in shared/issuance.
package isolationlab

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ResultSystemError is the Before code's answer after three failed attempts.
const ResultSystemError = "SYSTEM_ERROR"

// DefaultPushDelay is the simulated LINE push inside the Before transaction (design write-up:
// "平均 20 ms、タイムアウト未設定").
const DefaultPushDelay = 20 * time.Millisecond

// BreakSchema turns the production schema into the Before world: no unique index on
// (campaign_id, member_id) and no CHECK on the budget counter, as the incident's tables were.
func BreakSchema(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
ALTER TABLE issued_coupons DROP CONSTRAINT one_coupon_per_member;
ALTER TABLE campaign_budgets DROP CONSTRAINT issued_within_budget`)
	return err
}

// Before is the incident's issuance code (design write-up, "悪いコード (Before)") in Go: it reads
// the budget counter and judges in Go, then writes back the value it computed (lost update); it
// checks for an existing coupon and then inserts (two concurrent requests both see none: phantom);
// it locks the member's existing coupons FOR UPDATE and sums them in Go, which locks nothing for a
// member with no coupon yet (write skew); it pushes inside the transaction; it retries any error
// blindly, three times. Run it only on a schema broken by [BreakSchema].
type Before struct {
	Pool   *pgxpool.Pool
	CapYen int
	// Month is the month the caller passes in, as the Before API took it.
	Month string
	// Isolation is the transaction's level; empty is READ COMMITTED, as in the incident.
	Isolation pgx.TxIsoLevel
	// Push is the notification sent inside the transaction; nil sleeps [DefaultPushDelay].
	Push func(ctx context.Context, memberID, couponID string)
}

// Issue runs the Before code once for (memberID, campaignID) and returns its result code.
func (b *Before) Issue(ctx context.Context, memberID, campaignID string) (string, error) {
	for range 3 {
		res, err := b.attempt(ctx, memberID, campaignID)
		if err == nil {
			return res, nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		// except Exception: continue
	}
	return ResultSystemError, nil
}

func (b *Before) attempt(ctx context.Context, memberID, campaignID string) (string, error) {
	var res string
	err := pgx.BeginTxFunc(ctx, b.Pool, pgx.TxOptions{IsoLevel: b.Isolation}, func(tx pgx.Tx) error {
		var discount, budget, issued int
		if err := tx.QueryRow(ctx, `SELECT discount_yen, budget_yen, issued_yen FROM campaign_budgets WHERE campaign_id = $1`,
			campaignID).Scan(&discount, &budget, &issued); err != nil {
			return err
		}
		if issued+discount > budget {
			res = "BUDGET_EXCEEDED"
			return nil // the Python returned from inside `with conn.transaction()`, which commits
		}
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM issued_coupons WHERE campaign_id = $1 AND member_id = $2`,
			campaignID, memberID).Scan(&one)
		if err == nil {
			res = "ALREADY_ISSUED"
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT amount_yen FROM issued_coupons WHERE member_id = $1 AND month = $2 FOR UPDATE`,
			memberID, b.Month)
		if err != nil {
			return err
		}
		amounts, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return err
		}
		sum := 0
		for _, a := range amounts {
			sum += a
		}
		if sum+discount > b.CapYen {
			res = "MONTHLY_CAP"
			return nil
		}
		var couponID string
		if err := tx.QueryRow(ctx, `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
VALUES ($1, $2, $3, $4) RETURNING coupon_id::text`, campaignID, memberID, b.Month, discount).Scan(&couponID); err != nil {
			return err
		}
		b.push(ctx, memberID, couponID)
		if _, err := tx.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = $1 WHERE campaign_id = $2`,
			issued+discount, campaignID); err != nil {
			return err
		}
		res = "ISSUED"
		return nil
	})
	return res, err
}

func (b *Before) push(ctx context.Context, memberID, couponID string) {
	if b.Push != nil {
		b.Push(ctx, memberID, couponID)
		return
	}
	select {
	case <-time.After(DefaultPushDelay):
	case <-ctx.Done():
	}
}
