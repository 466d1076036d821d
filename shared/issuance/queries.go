package issuance

// The statements of one issuance attempt, in the order the transaction runs them, which is the
// order it takes its locks. $-parameters are documented on each.

// sqlTimeoutsSet sets lock_timeout ($1) and statement_timeout ($2) for this transaction only
// (is_local = true, like SET LOCAL): nothing survives COMMIT or ROLLBACK into the pooled session.
// PostgreSQL 15 docs, 20.11.1 "Statement Behavior".
const sqlTimeoutsSet = `SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)`

// sqlCouponInsert is R2. The unique constraint one_coupon_per_member judges: a concurrent insert
// of the same (campaign, member) waits for the first to end, then inserts nothing if it committed
// or goes ahead if it rolled back. The SELECT yields no row for an unknown or inactive campaign.
// $1 campaign_id, $2 member_id, $3 month, $4 issued_at.
const sqlCouponInsert = `
INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen, issued_at)
SELECT b.campaign_id, $2, $3, b.discount_yen, $4
  FROM campaign_budgets b
 WHERE b.campaign_id = $1
   AND (b.starts_at IS NULL OR b.starts_at <= $4)
   AND (b.ends_at IS NULL OR $4 < b.ends_at)
ON CONFLICT ON CONSTRAINT one_coupon_per_member DO NOTHING
RETURNING coupon_id::text, amount_yen`

// sqlCouponWhyNot explains an insert that wrote nothing: the existing coupon of this member, and
// whether the campaign exists. READ COMMITTED takes a new snapshot per statement, so a coupon that
// a concurrent transaction committed while the insert waited is visible here.
// $1 campaign_id, $2 member_id.
const sqlCouponWhyNot = `
SELECT (SELECT coupon_id::text FROM issued_coupons WHERE campaign_id = $1 AND member_id = $2),
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
// never from inside this transaction. $1 coupon_id, $2 member_id, $3 created_at.
const sqlOutboxInsert = `
INSERT INTO notification_outbox (coupon_id, member_id, created_at) VALUES ($1::uuid, $2, $3)`

// sqlBudgetAdd is R1 on the campaign budget row, the hottest row of the system, so it is taken
// last and held only until COMMIT. No row back means the budget would be exceeded. It also
// returns the transaction's id, which [sqlTransactionEnd] needs if the COMMIT answer is lost.
// $1 campaign_id, $2 amount_yen.
const sqlBudgetAdd = `
UPDATE campaign_budgets SET issued_yen = issued_yen + $2
 WHERE campaign_id = $1 AND issued_yen + $2 <= budget_yen
RETURNING issued_yen, pg_current_xact_id()::text`

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
SELECT (SELECT coupon_id::text FROM issued_coupons WHERE campaign_id = $1 AND member_id = $2)`
