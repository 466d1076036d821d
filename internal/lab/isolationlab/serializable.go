package isolationlab

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/shared/backoff"
	"github.com/mops/coupon-api/shared/issuance"
)

// SerializableAttempts bounds the transactions of one [Serializable] call (docs/design.md,
// "The two proposals that were rejected", B: full jitter, at most 5 attempts).
const SerializableAttempts = 5

// ResultRetryExhausted is the answer of [Serializable] when every attempt failed with 40001
// (docs/api.md, RETRY_EXHAUSTED).
const ResultRetryExhausted = string(issuance.ResultRetryExhausted)

// Serializable is the second junior proposal: the Before code's read-judge-write unchanged, run at
// SERIALIZABLE, with the in-transaction push replaced by a transactional outbox row, and SQLSTATE
// 40001 retried after a full-jitter wait, in at most [SerializableAttempts] attempts. PostgreSQL's
// serializable snapshot isolation (SSI) detects the lost update, the phantom and the write skew
// of the Before code and aborts one of the transactions with 40001 (PostgreSQL 15 docs, 13.2.3
// "Serializable Isolation Level"; Ports and Grittner, VLDB 2012); the price is paid in retries.
// It runs on the Before schema ([BreakSchema]): the proposal changed the isolation level, not
// the tables.
type Serializable struct {
	Pool   *pgxpool.Pool
	CapYen int
	// Month is the month the caller passes in, as the Before API took it.
	Month string
}

// Issue runs one call. Errors: ctx's error, or the first error that is not 40001.
func (s *Serializable) Issue(ctx context.Context, memberID, campaignID string) (Outcome, error) {
	for attempt := 1; ; attempt++ {
		var res string
		err := pgx.BeginTxFunc(ctx, s.Pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
			var err error
			res, err = readJudgeWrite(ctx, tx, memberID, campaignID, s.Month, s.CapYen,
				func(couponID string) error {
					_, err := tx.Exec(ctx, `INSERT INTO notification_outbox (coupon_id, member_id) VALUES ($1::uuid, $2)`,
						couponID, memberID)
					return err
				})
			return err
		})
		switch {
		case err == nil:
			return Outcome{Result: res, Attempts: attempt}, nil
		case ctx.Err() != nil:
			return Outcome{Attempts: attempt}, ctx.Err()
		case !isSerializationFailure(err):
			return Outcome{Attempts: attempt}, fmt.Errorf("isolationlab: serializable attempt %d: %w", attempt, err)
		case attempt == SerializableAttempts:
			return Outcome{Result: ResultRetryExhausted, Attempts: attempt}, nil
		}
		sleep(ctx, backoff.FullJitter(issuance.BackoffBase, issuance.BackoffCap, attempt))
	}
}
