package isolationlab

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ResultSystemError is the Before code's answer after three failed attempts: its own kind of
// RETRY_EXHAUSTED.
const ResultSystemError = "SYSTEM_ERROR"

// BeforeAttempts is how many transactions the Before code starts per call, without waiting
// between them (docs/design.md, "The seven problems", #7).
const BeforeAttempts = 3

// DefaultPushDelay is the simulated LINE push inside the Before transaction (docs/design.md,
// "The incident": about 20 ms, no timeout).
const DefaultPushDelay = 20 * time.Millisecond

// BreakSchema turns the production schema into the Before world: no unique index on
// (campaign_id, member_id) and no CHECK on the budget counter, as the incident's tables were.
func BreakSchema(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
DROP INDEX one_coupon_per_member;
ALTER TABLE campaign_budgets DROP CONSTRAINT issued_within_budget`)
	return err
}

// Before is the incident's issuance code (docs/design.md, "The incident") in Go: it reads
// the budget counter and judges in Go, then writes back the value it computed (lost update); it
// checks for an existing coupon and then inserts (two concurrent requests both see none: phantom);
// it locks the member's existing coupons FOR UPDATE and sums them in Go, which locks nothing for a
// member with no coupon yet (write skew); it pushes inside the transaction; it retries any error
// blindly, [BeforeAttempts] times. Run it only on a schema broken by [BreakSchema].
//
// With Isolation set to REPEATABLE READ and RetrySerializationOnly set, it is the first junior
// proposal: the same code at REPEATABLE READ, retrying SQLSTATE 40001.
type Before struct {
	Pool   *pgxpool.Pool
	CapYen int
	// Month is the month the caller passes in, as the Before API took it.
	Month string
	// Isolation is the transaction's level; empty is READ COMMITTED, as in the incident.
	Isolation pgx.TxIsoLevel
	// RetrySerializationOnly retries only SQLSTATE 40001 serialization_failure and returns any
	// other error; false retries every error blindly, as the incident's `except Exception` did.
	RetrySerializationOnly bool
	// Push is the notification sent inside the transaction; nil sleeps [DefaultPushDelay].
	Push func(ctx context.Context, memberID, couponID string)
}

// Issue runs the Before code once for (memberID, campaignID) and returns its result code.
func (b *Before) Issue(ctx context.Context, memberID, campaignID string) (string, error) {
	out, err := b.IssueOutcome(ctx, memberID, campaignID)
	return out.Result, err
}

// IssueOutcome is [Before.Issue] that also says how many transactions it started. Errors: ctx's
// error, or with RetrySerializationOnly the first error that is not 40001.
func (b *Before) IssueOutcome(ctx context.Context, memberID, campaignID string) (Outcome, error) {
	for attempt := 1; attempt <= BeforeAttempts; attempt++ {
		res, err := b.attempt(ctx, memberID, campaignID)
		if err == nil {
			return Outcome{Result: res, Attempts: attempt}, nil
		}
		if ctx.Err() != nil {
			return Outcome{Attempts: attempt}, ctx.Err()
		}
		if b.RetrySerializationOnly && !isSerializationFailure(err) {
			return Outcome{Attempts: attempt}, fmt.Errorf("isolationlab: before attempt %d: %w", attempt, err)
		}
		// except Exception: continue
	}
	return Outcome{Result: ResultSystemError, Attempts: BeforeAttempts}, nil
}

func (b *Before) attempt(ctx context.Context, memberID, campaignID string) (string, error) {
	var res string
	err := pgx.BeginTxFunc(ctx, b.Pool, pgx.TxOptions{IsoLevel: b.Isolation}, func(tx pgx.Tx) error {
		var err error
		res, err = readJudgeWrite(ctx, tx, memberID, campaignID, b.Month, b.CapYen,
			func(couponID string) error {
				b.push(ctx, memberID, couponID)
				return nil
			})
		return err
	})
	return res, err
}

func (b *Before) push(ctx context.Context, memberID, couponID string) {
	if b.Push != nil {
		b.Push(ctx, memberID, couponID)
		return
	}
	sleep(ctx, DefaultPushDelay)
}

// readJudgeWrite is the body of the Before transaction, shared by [Before] and [Serializable]:
// read the counter, judge in Go, check then insert, lock-and-sum in Go, notify, write the counter
// back. A rejection ends it with its result and no error; the Python returned from inside
// `with conn.transaction()`, which commits. notify runs after the coupon insert, before the
// counter write, where the Before code pushed.
func readJudgeWrite(ctx context.Context, tx pgx.Tx, memberID, campaignID, month string, capYen int,
	notify func(couponID string) error) (string, error) {
	var discount, budget, issued int
	if err := tx.QueryRow(ctx, `SELECT discount_yen, budget_yen, issued_yen FROM campaign_budgets WHERE campaign_id = $1`,
		campaignID).Scan(&discount, &budget, &issued); err != nil {
		return "", err
	}
	if issued+discount > budget {
		return "BUDGET_EXCEEDED", nil
	}
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM issued_coupons WHERE campaign_id = $1 AND member_id = $2`,
		campaignID, memberID).Scan(&one)
	if err == nil {
		return "ALREADY_ISSUED", nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return "", err
	}
	rows, err := tx.Query(ctx, `SELECT amount_yen FROM issued_coupons WHERE member_id = $1 AND month = $2 FOR UPDATE`,
		memberID, month)
	if err != nil {
		return "", err
	}
	amounts, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return "", err
	}
	sum := 0
	for _, a := range amounts {
		sum += a
	}
	if sum+discount > capYen {
		return "MONTHLY_CAP", nil
	}
	var couponID string
	if err := tx.QueryRow(ctx, `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
VALUES ($1, $2, $3, $4) RETURNING coupon_id::text`, campaignID, memberID, month, discount).Scan(&couponID); err != nil {
		return "", err
	}
	if err := notify(couponID); err != nil {
		return "", err
	}
	if _, err := tx.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = $1 WHERE campaign_id = $2`,
		issued+discount, campaignID); err != nil {
		return "", err
	}
	return "ISSUED", nil
}

// PushLog is the simulated LINE push: it records the coupon id of every push and waits Delay,
// as the real call did. The lab counts afterwards, with SQL, the pushes for coupons that do not
// exist (sent from a transaction that then rolled back). It is safe for concurrent use.
type PushLog struct {
	// Delay is how long one push takes; zero sends instantly.
	Delay time.Duration

	mu  sync.Mutex
	ids []string
}

// Push records couponID and waits Delay (or until ctx ends).
func (l *PushLog) Push(ctx context.Context, _, couponID string) {
	l.mu.Lock()
	l.ids = append(l.ids, couponID)
	l.mu.Unlock()
	sleep(ctx, l.Delay)
}

// CouponIDs returns the coupon ids pushed so far, one per push.
func (l *PushLog) CouponIDs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ids...)
}

func isSerializationFailure(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.SerializationFailure
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
