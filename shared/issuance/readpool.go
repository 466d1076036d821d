package issuance

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/shared/telemetry"
)

// UseReadPool makes read, a pool on a streaming standby of s's database (a Cloud SQL read pool),
// answer s's dry runs ([Service.DryRun]); every issuance stays on the primary. Each call of
// issue_dry_run_batch on read also reads the standby's lag in the same statement
// (sqlDryRunBatchLagged). When the lag is within [Config.DryRunMaxLag], the answers are read's,
// each with [DryRunOutcome.ReadLag]; when it is past the bound or unknown, or the call fails
// while the dry runs' time is not over, the same call is made on the primary, and
// coupon.dry_run.fallbacks counts the dry runs ([telemetry.MetricDryRunFallbacks]). Call it
// before s serves; read is the caller's to close.
func (s *Service) UseReadPool(read *pgxpool.Pool) { s.read = read }

// Reasons of a dry run's fallback to the primary ([telemetry.AttrFallbackReason]).
const (
	fallbackLag   = "lag"
	fallbackError = "error"
)

// sqlDryRunBatchLagged is [sqlDryRunBatch] on the read pool, with the pool's lag behind the
// primary as the standby measures it ([sqlReadLag]) on every row. A test swaps in a broken
// variant of the lag (readpool_internal_test.go).
var sqlDryRunBatchLagged = dryRunBatchLagged(sqlReadLag)

// dryRunBatchLagged is [sqlDryRunBatchLagged] with the lag subquery l(lag_us) lag.
func dryRunBatchLagged(lag string) string {
	return `SELECT d.i, d.result, d.coupon, d.amount, d.reason, d.expires_at, d.remaining_coupons, d.next_release_at, l.lag_us
FROM ` + lag + `, issue_dry_run_batch($1, $2) d`
}

// sqlReadLag is the subquery l(lag_us): the server's lag behind the primary in microseconds. 0
// on a server that is not in recovery (the primary itself); NULL, cannot tell, on a standby with
// no WAL receiver running (pg_stat_wal_receiver shows its pid to every role): cut off from the
// primary, it has replayed all it received and would read as fresh while the primary moves on;
// 0 on a standby streaming that has replayed all the WAL it has received
// (pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()); else the time since the last
// transaction it replayed committed on the primary (now() - pg_last_xact_replay_timestamp(),
// negative when the clocks differ: dryQuery reads it as 0), NULL when no transaction was replayed
// since the standby started.
const sqlReadLag = `(SELECT CASE WHEN NOT pg_is_in_recovery() THEN 0
                  WHEN NOT EXISTS (SELECT 1 FROM pg_stat_wal_receiver) THEN NULL
                  WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
                  ELSE (extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1e6)::bigint END AS lag_us) l`

// lagWithin reports whether a read pool that measured lag (nil: it could not tell) may answer
// a dry run whose bound is max. A test swaps in a broken variant that ignores the lag
// (readpool_internal_test.go).
var lagWithin = func(lag *time.Duration, max time.Duration) bool { return lag != nil && *lag <= max }

// dryCall is one call of issue_dry_run_batch: the answers of members, in their order, from the
// read pool when there is one whose lag is within the bound (see [Service.UseReadPool]), else
// from the primary.
func (s *Service) dryCall(ctx context.Context, campaignID string, members []string) ([]DryRunOutcome, error) {
	if s.read == nil {
		outs, _, err := dryQuery(ctx, s.pool, sqlDryRunBatch, campaignID, members, false)
		return outs, err
	}
	outs, lag, err := dryQuery(ctx, s.read, sqlDryRunBatchLagged, campaignID, members, true)
	switch {
	case err == nil && lagWithin(lag, s.cfg.DryRunMaxLag):
		for i := range outs {
			outs[i].ReadLag = lag
		}
		return outs, nil
	case err != nil && ctx.Err() != nil: // no time left for the primary
		return nil, err
	case err != nil:
		telemetry.Global().RecordDryRunFallback(context.WithoutCancel(ctx), fallbackError, len(members))
	default:
		telemetry.Global().RecordDryRunFallback(ctx, fallbackLag, len(members))
	}
	outs, _, err = dryQuery(ctx, s.pool, sqlDryRunBatch, campaignID, members, false)
	return outs, err
}
