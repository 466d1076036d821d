package outbox

// sqlRunStart is the database's clock at the start of a run: a run claims only rows that were
// due then ($4 of [sqlOutboxClaim]), so a row it sends back with a zero wait is retried by the
// next run, not again by this one (CONTRACT.md: RELAY_RETRY_BASE=0s "retries on the next run").
// The database's clock, because the marks set next_attempt_at with it.
const sqlRunStart = `SELECT now()`

// sqlOutboxClaim claims up to $1 rows due at $4 for run $2 and holds them for the lease $3: it moves
// next_attempt_at past the lease, so no other run's claim sees them until then, and counts the
// attempt. It commits at once (a single autocommit statement): no transaction is open while the
// pushes run.
//
// The LIMIT ... FOR UPDATE SKIP LOCKED sits in a MATERIALIZED CTE, which PostgreSQL evaluates
// exactly once. In a plain `WHERE coupon_id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)` the
// planner may re-run the subquery (e.g. as the inner side of a nested loop), and each re-run
// skips the rows the previous one locked, so one claim can take more than n rows. SKIP LOCKED
// makes concurrent claims take disjoint rows instead of waiting (PostgreSQL 15 docs, SELECT,
// "The Locking Clause"); a row another claim changed meanwhile is re-checked against the WHERE
// on its newest version (13.2.1 "Read Committed Isolation Level"), so a just-claimed row, whose
// next_attempt_at is now in the future, is not taken twice.
//
// The message names the coupon's campaign and value, so the claim returns them, and the push
// span links to the issuing request's trace (trace_parent).
const sqlOutboxClaim = `
WITH due AS MATERIALIZED (
  SELECT coupon_id FROM notification_outbox
   WHERE sent_at IS NULL AND parked_at IS NULL AND next_attempt_at <= $4
   ORDER BY next_attempt_at
   LIMIT $1
   FOR UPDATE SKIP LOCKED
)
UPDATE notification_outbox o
   SET attempts = o.attempts + 1, next_attempt_at = now() + $3::interval, claimed_by = $2
  FROM due JOIN issued_coupons i USING (coupon_id)
 WHERE o.coupon_id = due.coupon_id
RETURNING o.coupon_id::text, o.member_id, o.attempts, i.campaign_id, i.amount_yen, o.trace_parent`

// sqlOutboxMarkSent records a push LINE accepted (200, or 409 for a retry key it had already
// accepted). It does not ask for the claim: a push that happened is true whoever holds the row.
// $1 coupon_id.
const sqlOutboxMarkSent = `
UPDATE notification_outbox SET sent_at = now(), parked_at = NULL, claimed_by = NULL
 WHERE coupon_id = $1 AND sent_at IS NULL`

// sqlOutboxMarkRetry gives the row back for another attempt after the wait $3, with the reason
// $4. Only the run holding the claim may do it. $1 coupon_id, $2 run.
const sqlOutboxMarkRetry = `
UPDATE notification_outbox
   SET next_attempt_at = now() + $3::interval, last_error = $4, claimed_by = NULL
 WHERE coupon_id = $1 AND claimed_by = $2 AND sent_at IS NULL`

// sqlOutboxMarkParked dead-letters the row with the reason $3. Only the run holding the claim
// may do it. $1 coupon_id, $2 run.
const sqlOutboxMarkParked = `
UPDATE notification_outbox SET parked_at = now(), last_error = $3, claimed_by = NULL
 WHERE coupon_id = $1 AND claimed_by = $2 AND sent_at IS NULL`
