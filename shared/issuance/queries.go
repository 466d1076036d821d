package issuance

// The statements of one issuance attempt, in the order the transaction runs them, which is the
// order it takes its locks. $-parameters are documented on each.

// sqlTimeoutsSet sets lock_timeout ($1) and statement_timeout ($2) for this transaction only
// (is_local = true, like SET LOCAL): nothing survives COMMIT or ROLLBACK into the pooled session.
// PostgreSQL 15 docs, 20.11.1 "Statement Behavior".
const sqlTimeoutsSet = `SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)`

// sqlCouponInsert is R2. The partial unique index one_coupon_per_member judges, inferred from its
// columns and predicate (PostgreSQL 15 docs, INSERT "ON CONFLICT Clause": a partial unique index
// is inferred when the conflict target's WHERE implies its predicate): a concurrent insert
// of the same (campaign, member) waits for the first to end, then inserts nothing if it committed
// or goes ahead if it rolled back. The campaign CTE yields no row for an unknown or inactive
// campaign; it reads (without locking) stripe 0, which every campaign has, for the discount and
// the period, and counts the campaign's budget stripes for R1.
// $1 campaign_id, $2 member_id, $3 month, $4 issued_at.
const sqlCouponInsert = `
WITH campaign AS (
  SELECT b.campaign_id, b.discount_yen,
         (SELECT count(*) FROM campaign_budgets s WHERE s.campaign_id = b.campaign_id) AS stripes
    FROM campaign_budgets b
   WHERE b.campaign_id = $1 AND b.stripe = 0
     AND (b.starts_at IS NULL OR b.starts_at <= $4)
     AND (b.ends_at IS NULL OR $4 < b.ends_at)
), coupon AS (
  INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen, issued_at)
  SELECT campaign_id, $2, $3, discount_yen, $4 FROM campaign
  ON CONFLICT (campaign_id, member_id) WHERE NOT legacy_duplicate DO NOTHING
  RETURNING coupon_id, amount_yen
)
SELECT coupon.coupon_id::text, coupon.amount_yen, campaign.stripes FROM coupon, campaign`

// sqlCouponWhyNot explains an insert that wrote nothing: the member's live coupon (legacy
// duplicates aside, there is at most one, by R2), and
// whether the campaign exists. READ COMMITTED takes a new snapshot per statement, so a coupon that
// a concurrent transaction committed while the insert waited is visible here.
// $1 campaign_id, $2 member_id.
const sqlCouponWhyNot = `
SELECT (SELECT coupon_id::text FROM issued_coupons
         WHERE campaign_id = $1 AND member_id = $2 AND NOT legacy_duplicate),
       EXISTS (SELECT 1 FROM campaign_budgets WHERE campaign_id = $1)`

// sqlUsageEnsure creates the member x month row that R3 serializes on, if missing: a row that
// does not exist cannot be locked, so two first coupons of a month would otherwise not collide.
// $1 member_id, $2 month.
const sqlUsageEnsure = `
INSERT INTO member_monthly_usage (member_id, month) VALUES ($1, $2)
ON CONFLICT (member_id, month) DO NOTHING`

// sqlUsageAdd is R3: judge and add in one statement on the member x month row. No row back means
// the cap would be exceeded. $1 member_id, $2 month, $3 amount_yen, $4 cap in yen.
const sqlUsageAdd = `
UPDATE member_monthly_usage SET used_yen = used_yen + $3
 WHERE member_id = $1 AND month = $2 AND used_yen + $3 <= $4
RETURNING used_yen`

// sqlOutboxInsert is the transactional outbox row: the push is sent later by functions/relay,
// never from inside this transaction. $1 coupon_id, $2 member_id, $3 created_at, $4 trace_parent
// (the issuing request's W3C traceparent, which the relay's push span links to; NULL untraced).
const sqlOutboxInsert = `
INSERT INTO notification_outbox (coupon_id, member_id, created_at, trace_parent) VALUES ($1::uuid, $2, $3, $4)`

// sqlBudgetStripeAdd is R1 on one budget stripe row, the hottest row of the system, so it is
// taken last and held only until COMMIT: judge and add in one statement, waiting for the row if
// another transaction holds it. No row back means the stripe has no room for the coupon. It
// also returns the transaction's id, which [sqlTransactionEnd] needs if the COMMIT answer is
// lost. $1 campaign_id, $2 stripe, $3 amount_yen.
const sqlBudgetStripeAdd = `
UPDATE campaign_budgets SET issued_yen = issued_yen + $3
 WHERE campaign_id = $1 AND stripe = $2 AND issued_yen + $3 <= budget_yen
RETURNING pg_current_xact_id()::text`

// sqlBudgetFreeStripeAdd is R1 on a striped campaign: it locks one stripe with room that no other
// transaction holds, chosen at random so that concurrent issuances spread over the stripes
// (FOR UPDATE SKIP LOCKED, PostgreSQL 15 docs, SELECT "The Locking Clause"), and adds to it. A
// stripe updated since the statement's snapshot is re-checked on its newest version before it is
// locked. No row back means every stripe with room is held by another transaction, or none has
// room. Like [sqlBudgetStripeAdd] it returns the transaction's id. $1 campaign_id, $2 amount_yen.
const sqlBudgetFreeStripeAdd = `
WITH free AS (
  SELECT campaign_id, stripe FROM campaign_budgets
   WHERE campaign_id = $1 AND issued_yen + $2 <= budget_yen
   ORDER BY random() LIMIT 1
   FOR UPDATE SKIP LOCKED
)
UPDATE campaign_budgets b SET issued_yen = b.issued_yen + $2
  FROM free
 WHERE b.campaign_id = free.campaign_id AND b.stripe = free.stripe
RETURNING pg_current_xact_id()::text`

// sqlBudgetStripeWithRoom picks, without locking, a stripe that has room for the coupon in the
// committed state; no row means the campaign's budget is spent. Committed counters only grow, so
// "no room" here is true of every later state too. $1 campaign_id, $2 amount_yen.
const sqlBudgetStripeWithRoom = `
SELECT stripe FROM campaign_budgets
 WHERE campaign_id = $1 AND issued_yen + $2 <= budget_yen
 ORDER BY random() LIMIT 1`

// The statements that settle a lost COMMIT answer, each on a fresh pooled connection.

// sqlTransactionEnd makes sure the transaction whose COMMIT answer was lost is over: if its
// backend still runs it (the COMMIT is in flight, or never arrived and the session sits idle in
// transaction), the backend is terminated and waited for, which ends the transaction one way
// or the other. The transaction id guards against a pid already reused by another session.
// True when the transaction is over. A role may terminate its own backends (PostgreSQL 15 docs,
// 9.27.2 "Server Signaling Functions"). $1 backend pid, $2 transaction id (xid8 as text),
// $3 wait in ms.
const sqlTransactionEnd = `
SELECT coalesce(bool_and(pg_terminate_backend(pid, $3)), true)
  FROM pg_stat_activity
 WHERE pid = $1 AND backend_xid = $2::xid8::xid`

// sqlCouponOf is the coupon of (campaign, member), if any, once no transaction that could
// insert it is in flight. $1 campaign_id, $2 member_id.
const sqlCouponOf = `
SELECT (SELECT coupon_id::text FROM issued_coupons
         WHERE campaign_id = $1 AND member_id = $2 AND NOT legacy_duplicate)`
