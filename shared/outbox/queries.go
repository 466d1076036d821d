package outbox

// sqlRunStart is the database's clock at the start of a run: a run claims only rows that were
// due then ($4 of [sqlOutboxClaim]), so a row it sends back with a zero wait is retried by the
// next run, not again by this one (docs/api.md, "Configuration": RELAY_RETRY_BASE=0s "retries on the next run").
// The database's clock, because the marks set next_attempt_at with it.
const sqlRunStart = `SELECT now()`

// sqlOutboxClaim claims up to $1 open rows due at $4 for run $2 and holds them for the lease
// $3: it moves next_attempt_at past the lease, so no other run's claim sees them until then. It
// commits at once (a single autocommit statement): no transaction is open while the pushes run.
// It charges no attempt: the mark does, for a push that was actually sent.
//
// For a member with a LINE account linked it sets first_pushed_at if unset, before the push goes
// out, so a crash between push and mark cannot lose the start of LINE's 24-hour retry-key
// window; key_expired tells whether that window is (about) over, $5 being the part of it the
// relay uses ([RetryKeyWindow]). It returns the row's previous next_attempt_at and
// first_pushed_at, which [sqlOutboxRelease] puts back for a row that is not pushed after all.
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
// The message names the coupon's campaign and value, and goes to the member's LINE user id
// (NULL when none is linked), so the claim returns them, and the push span links to the
// issuing request's trace (trace_parent).
const sqlOutboxClaim = `
WITH due AS MATERIALIZED (
  SELECT coupon_id, member_id, next_attempt_at, first_pushed_at FROM notification_outbox
   WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL AND next_attempt_at <= $4
   ORDER BY next_attempt_at
   LIMIT $1
   FOR UPDATE SKIP LOCKED
)
UPDATE notification_outbox o
   SET next_attempt_at = now() + $3::interval, claimed_by = $2,
       first_pushed_at = CASE WHEN l.line_user_id IS NULL THEN o.first_pushed_at
                              ELSE COALESCE(o.first_pushed_at, now()) END
  FROM due JOIN issued_coupons i USING (coupon_id)
       LEFT JOIN member_line_accounts l ON l.member_id = due.member_id
 WHERE o.coupon_id = due.coupon_id
RETURNING o.coupon_id::text, o.member_id, o.attempts, i.campaign_id, i.amount_yen, l.line_user_id,
          COALESCE(o.first_pushed_at < now() - $5::interval, false), due.next_attempt_at, due.first_pushed_at,
          o.trace_parent`

// sqlOutboxMarkSent records a push LINE accepted (2xx, or 409 for a retry key it had already
// accepted) and counts its attempt. It does not ask for the claim: a push that happened is true
// whoever holds the row. $1 coupon_id.
const sqlOutboxMarkSent = `
UPDATE notification_outbox
   SET sent_at = now(), parked_at = NULL, claimed_by = NULL, attempts = attempts + 1
 WHERE coupon_id = $1 AND sent_at IS NULL`

// sqlOutboxMarkRetry gives the row back for another attempt after the wait $3, with the reason
// $4, and counts $5 attempts (1 for a push sent, 0 when none was). Only the run holding the
// claim may do it. $1 coupon_id, $2 run.
const sqlOutboxMarkRetry = `
UPDATE notification_outbox
   SET next_attempt_at = now() + $3::interval, last_error = $4, claimed_by = NULL,
       attempts = attempts + $5
 WHERE coupon_id = $1 AND claimed_by = $2 AND sent_at IS NULL`

// sqlOutboxMarkParked dead-letters the row with the reason $3 and counts $4 attempts (1 for a
// push sent, 0 when none was). Only the run holding the claim may do it. $1 coupon_id, $2 run.
const sqlOutboxMarkParked = `
UPDATE notification_outbox
   SET parked_at = now(), last_error = $3, claimed_by = NULL, attempts = attempts + $4
 WHERE coupon_id = $1 AND claimed_by = $2 AND sent_at IS NULL`

// sqlOutboxMarkSkipped closes the row without a push: its member has no LINE account linked.
// Only the run holding the claim may do it. $1 coupon_id, $2 run, $3 reason.
const sqlOutboxMarkSkipped = `
UPDATE notification_outbox SET skipped_at = now(), last_error = $3, claimed_by = NULL
 WHERE coupon_id = $1 AND claimed_by = $2 AND sent_at IS NULL`

// sqlOutboxRelease gives a claimed row back as it was before the claim, for a row the run did
// not push (its token was refused, LINE is down, or its batch ran out of time): no attempt is
// charged, last_error is kept, and next_attempt_at and first_pushed_at return to $3 and $4
// (the claim's previous values), so the next run takes it in its old place. Only the run
// holding the claim may do it. $1 coupon_id, $2 run.
const sqlOutboxRelease = `
UPDATE notification_outbox SET next_attempt_at = $3, first_pushed_at = $4, claimed_by = NULL
 WHERE coupon_id = $1 AND claimed_by = $2 AND sent_at IS NULL`

// sqlOutboxPrune deletes at most $2 closed rows, and counts them, (sent or skipped) closed before now() - $1,
// oldest first, through the notification_outbox_closed index; open and parked rows stay. The
// LIMIT sits in a MATERIALIZED CTE for the reason given on [sqlOutboxClaim], and SKIP LOCKED
// lets two prunes run at once without waiting on each other.
const sqlOutboxPrune = `
WITH old AS MATERIALIZED (
  SELECT coupon_id FROM notification_outbox
   WHERE (sent_at IS NOT NULL OR skipped_at IS NOT NULL)
     AND COALESCE(sent_at, skipped_at) < now() - $1::interval
   ORDER BY COALESCE(sent_at, skipped_at)
   LIMIT $2
   FOR UPDATE SKIP LOCKED
), deleted AS (
  DELETE FROM notification_outbox o USING old WHERE o.coupon_id = old.coupon_id RETURNING 1
)
SELECT count(*) FROM deleted`
