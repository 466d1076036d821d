-- A history for measuring reconcile (docs/performance.md, "Reconcile at history scale"), built
-- set-based on a migrated, empty database, as its owner:
--   psql "$DATABASE_URL" -v n=10000000 -f internal/ops/reconcile/testdata/history.sql
-- n coupons of 500 yen over 23 months before now() less one day, issued in time order, over n/4
-- members (4 each, at most 4 in a month: the 2,000 yen cap) and 1,000 campaigns (each a window
-- of n/1000 consecutive coupons, one per member); 1% voided a day after issue; one outbox row
-- per coupon, sent; the counters equal the live coupons. It reconciles clean.
\set ON_ERROR_STOP on
\timing on
SET synchronous_commit = off;
INSERT INTO campaigns (campaign_id, discount_yen, budget_yen, issued_yen)
SELECT 'H' || c, 500, 1000000000, 0 FROM generate_series(0, 999) c;
INSERT INTO campaign_budgets (campaign_id, discount_yen, budget_yen, issued_yen)
SELECT 'H' || c, 500, 1000000000, 0 FROM generate_series(0, 999) c;
INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, voided_at, void_reason)
SELECT gen_random_uuid(), 'H' || (i / (:n / 1000)), 'h' || ((i::bigint * 7919) % (:n / 4)),
       to_char(at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 500, at,
       CASE WHEN i % 100 = 0 THEN at + interval '1 day' END, CASE WHEN i % 100 = 0 THEN 'history' END
  FROM generate_series(0, :n - 1) i,
       LATERAL (SELECT now() - interval '1 day' - interval '700 days' * (1 - i::float8 / :n) AS at) t;
INSERT INTO notification_outbox (coupon_id, member_id, created_at, next_attempt_at, sent_at, attempts, first_pushed_at)
SELECT coupon_id, member_id, issued_at, issued_at, issued_at + interval '1 minute', 1, issued_at + interval '1 minute'
  FROM issued_coupons ORDER BY issued_at;
INSERT INTO member_monthly_usage (member_id, month, used_yen)
SELECT member_id, month, SUM(amount_yen) FROM issued_coupons WHERE voided_at IS NULL GROUP BY 1, 2;
UPDATE campaign_budgets b SET issued_yen = s.yen
  FROM (SELECT campaign_id, SUM(amount_yen) AS yen FROM issued_coupons WHERE voided_at IS NULL GROUP BY 1) s
 WHERE b.campaign_id = s.campaign_id;
VACUUM ANALYZE issued_coupons, notification_outbox, member_monthly_usage, campaign_budgets;
