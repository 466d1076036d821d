-- The issuance transaction of docs/design.md as first written ("One lock row per invariant"), as
-- pgbench runs it: nine client round trips (BEGIN, two SET LOCAL, the coupon insert, the usage
-- row, the R3 add, the R1 add before the outbox insert, the outbox insert, END), a new member
-- every time. Run by `couponctl bench` with -M prepared -D campaign=<id> on the production
-- schema. The member id is drawn from 9e18 values, so two transactions of one run practically
-- never share one.
\set m random(1, 9000000000000000000)
BEGIN;
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '3s';
INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
  SELECT campaign_id, 'p' || CAST(:m AS text), to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), discount_yen
    FROM campaign_budgets WHERE campaign_id = :campaign AND stripe = 0
  ON CONFLICT (campaign_id, member_id) WHERE NOT legacy_duplicate AND NOT reissue_allowed DO NOTHING
  RETURNING coupon_id, amount_yen \gset
INSERT INTO member_monthly_usage (member_id, month)
  VALUES ('p' || CAST(:m AS text), to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'))
  ON CONFLICT DO NOTHING;
UPDATE member_monthly_usage SET used_yen = used_yen + :amount_yen
 WHERE member_id = 'p' || CAST(:m AS text) AND month = to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM')
   AND used_yen + :amount_yen <= 2000
RETURNING used_yen;
UPDATE campaign_budgets SET issued_yen = issued_yen + :amount_yen
 WHERE campaign_id = :campaign AND stripe = 0 AND issued_yen + :amount_yen <= budget_yen
RETURNING issued_yen;
INSERT INTO notification_outbox (coupon_id, member_id) VALUES (:coupon_id, 'p' || CAST(:m AS text));
END;
