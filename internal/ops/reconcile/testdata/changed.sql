-- What changed since the last clean run, for measuring an incremental reconcile (after
-- history.sql and one clean run): :k coupons issued now (by the issuance's rules: new members,
-- their usage, outbox rows and counters) and :k / 10 old coupons voided with their yen given back.
--   psql "$DATABASE_URL" -v k=100000 -f internal/ops/reconcile/testdata/changed.sql
\set ON_ERROR_STOP on
\timing on
CREATE TEMP TABLE fresh AS
SELECT gen_random_uuid() AS coupon_id, 'H' || (i % 1000) AS campaign_id, 'new' || extract(epoch FROM now())::bigint || '-' || i AS member_id,
       to_char(issue_now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM') AS month, 500 AS amount_yen, issue_now() AS at
  FROM generate_series(1, :k) i;
INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at)
SELECT coupon_id, campaign_id, member_id, month, amount_yen, at FROM fresh;
INSERT INTO notification_outbox (coupon_id, member_id, created_at) SELECT coupon_id, member_id, at FROM fresh;
INSERT INTO member_monthly_usage (member_id, month, used_yen) SELECT member_id, month, amount_yen FROM fresh;
CREATE TEMP TABLE gone AS
SELECT coupon_id, campaign_id, member_id, month, amount_yen FROM issued_coupons
 WHERE voided_at IS NULL AND issued_at < now() - interval '2 days' ORDER BY issued_at DESC LIMIT :k / 10;
UPDATE issued_coupons c SET voided_at = issue_now(), void_reason = 'changed.sql' FROM gone g WHERE c.coupon_id = g.coupon_id;
UPDATE member_monthly_usage u SET used_yen = used_yen - g.yen
  FROM (SELECT member_id, month, SUM(amount_yen) AS yen FROM gone GROUP BY 1, 2) g
 WHERE u.member_id = g.member_id AND u.month = g.month;
UPDATE campaign_budgets b SET issued_yen = issued_yen + d.yen
  FROM (SELECT campaign_id, SUM(yen) AS yen FROM (SELECT campaign_id, amount_yen AS yen FROM fresh
                                                  UNION ALL SELECT campaign_id, -amount_yen FROM gone) x GROUP BY 1) d
 WHERE b.campaign_id = d.campaign_id;
