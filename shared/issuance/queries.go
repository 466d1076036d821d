package issuance

// The statements of one issuance attempt, and of settling an attempt whose answer was lost.
// The issuance transaction itself is issue_coupons_batch_v3, in
// schema/current/issue_coupons_batch_v3.sql: read it there, top to bottom, in the order it
// takes its locks.

// sqlTimeoutsSet sets lock_timeout ($1) and statement_timeout ($2) for the call's transaction only
// (is_local = true, like SET LOCAL): pipelined before [sqlIssueBatch] in one implicit transaction
// (PostgreSQL 15 docs, 55.2.4 "Pipelining"), it arms the timeouts for the call, and nothing
// survives the call into the pooled session. PostgreSQL 15 docs, 20.11.1 "Statement Behavior".
const sqlTimeoutsSet = `SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)`

// sqlIssueBatch is one call of a group, one request alone included: issue_coupons_batch_v3
// (schema/current/issue_coupons_batch_v3.sql, its contract in its comment), the whole
// transaction in one call, committed when the pipeline's Sync arrives, which travels with it.
// $1 campaign_id, then one each per member: $2 coupon ids (made by the service), $3 member ids,
// $4 trace parents. The database decides the issue time and R3's cap. It answers one row per
// member: its index from 1, the result code (RETRY: send it again), the coupon id, the amount,
// the reason of CAMPAIGN_NOT_ACTIVE, the coupon's expiry, the campaign's next release, and the
// month and instant the database stamped (ISSUED).
const sqlIssueBatch = `SELECT i, result, coupon, amount, reason, expires_at, next_release_at, month FROM issue_coupons_batch_v3($1, $2, $3, $4)`

// sqlGrantBatch is [sqlIssueBatch] through grant_coupons_batch_v3, an operator's grant.
const sqlGrantBatch = `SELECT i, result, coupon, amount, reason, expires_at, next_release_at, month FROM grant_coupons_batch_v3($1, $2, $3, $4)`

// sqlDryRunBatch is issue_dry_run_batch (schema/current/issue_dry_run_batch.sql): what
// [sqlIssueBatch] would answer each of members $2 (text[]) of campaign $1 now, from plain reads,
// writing nothing and locking no row; one row per member: its index from 1, the result code
// (AVAILABLE or a refusal), the coupon id, the amount, the reason, the expiry, the remaining
// coupons, the next release.
const sqlDryRunBatch = `SELECT i, result, coupon, amount, reason, expires_at, remaining_coupons, next_release_at FROM issue_dry_run_batch($1, $2)`

// sqlBackendStart is when this connection's server session started: with its pid, it names the
// session unambiguously (a pid is reused by later sessions), so that a lost call's session can
// be ended without touching another. Read once per pooled connection.
const sqlBackendStart = `SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`

// sqlSessionEnd makes sure the session that ran a call whose answer was lost is over: if it still
// runs ($1 pid, $2 backend_start: the call is in flight, or its Sync never arrived and the session
// sits idle in the call's transaction), it is terminated and waited for ($3 ms), which ends the
// transaction one way or the other. True when the session is gone. A role may terminate its own
// sessions (PostgreSQL 15 docs, 9.27.2 "Server Signaling Functions").
const sqlSessionEnd = `
SELECT coalesce(bool_and(pg_terminate_backend(pid, $3)), true)
  FROM pg_stat_activity
 WHERE pid = $1 AND backend_start = $2`

// sqlCouponOf is the coupon that holds the member's pair with the campaign, if any, once no
// session that could insert it is in flight: its id, amount in yen, whether it was voided (a
// void with reissue allowed releases the pair), its expiry and its month (stamped by the
// database). $1 campaign_id, $2 member_id.
const sqlCouponOf = `
SELECT coupon_id::text, amount_yen, voided_at IS NOT NULL, expires_at, month FROM issued_coupons
 WHERE campaign_id = $1 AND member_id = $2 AND NOT legacy_duplicate AND NOT reissue_allowed`
