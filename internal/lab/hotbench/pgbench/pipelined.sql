-- The alternative to issue_coupon() that the design is chosen against: the same writes sent as
-- one pipeline of plain statements, one Sync, one network round trip, in one implicit
-- transaction that commits as the Sync arrives (PostgreSQL 15 docs, 55.2.4 "Pipelining"). The
-- client makes the coupon id (md5 of the member), so that no statement needs an earlier one's
-- result (pgbench cannot \gset inside a pipeline). Each guard turns a miss into an error,
-- 1/count(*) dividing by zero, which aborts the pipeline and rolls the transaction back: R2 the
-- coupon insert, R3 the member x month upsert within the cap, R1 the stripe-0 add last, in the
-- lock order of docs/design.md. A new member every time, on a campaign of one budget stripe.
-- Run by `couponctl bench` with -M prepared -D campaign=<id>. Timeouts and cap as function.sql.
\set m random(1, 9000000000000000000)
\startpipeline
SELECT set_config('lock_timeout', '1s', true), set_config('statement_timeout', '2s', true);
WITH c AS (
  INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen)
  SELECT md5('p' || CAST(:m AS text))::uuid, campaign_id, 'p' || CAST(:m AS text),
         to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), discount_yen
    FROM campaign_budgets WHERE campaign_id = :campaign AND stripe = 0
  ON CONFLICT (campaign_id, member_id) WHERE NOT legacy_duplicate AND NOT reissue_allowed DO NOTHING
  RETURNING 1)
SELECT 1 / count(*) FROM c;
WITH u AS (
  INSERT INTO member_monthly_usage AS u (member_id, month, used_yen)
  SELECT 'p' || CAST(:m AS text), to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), discount_yen
    FROM campaign_budgets WHERE campaign_id = :campaign AND stripe = 0
  ON CONFLICT (member_id, month) DO UPDATE SET used_yen = u.used_yen + EXCLUDED.used_yen
   WHERE u.used_yen + EXCLUDED.used_yen <= 2000
  RETURNING 1)
SELECT 1 / count(*) FROM u;
INSERT INTO notification_outbox (coupon_id, member_id) VALUES (md5('p' || CAST(:m AS text))::uuid, 'p' || CAST(:m AS text));
WITH b AS (
  UPDATE campaign_budgets SET issued_yen = issued_yen + discount_yen
   WHERE campaign_id = :campaign AND stripe = 0 AND issued_yen + discount_yen <= budget_yen
  RETURNING 1)
SELECT 1 / count(*) FROM b;
\endpipeline
