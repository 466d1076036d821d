-- +goose Up
-- The contract step of 00009's expand (docs/roles.md, "Expand, then contract"): coupon_issue
-- writes coupons, usage, budget stripes and outbox rows only through the issuance functions
-- (SECURITY DEFINER), never by statements of its own. 00008's table grants stay readable where
-- the settlement and the start-up check read them (coupon_relay never held a write on these
-- tables but its own outbox columns). No release since 00009 issues with its own
-- statements, so no revision that can still run needs them.
--
-- REVOKE takes no lock on the tables: it rewrites their ACL in pg_class. A revision already
-- running keeps serving; its next statement is judged by the new ACL.
SET LOCAL lock_timeout = '3s';

REVOKE INSERT, UPDATE, DELETE ON campaign_budgets, campaigns, issued_coupons, member_monthly_usage, notification_outbox
  FROM coupon_issue;

-- +goose Down
GRANT UPDATE (issued_yen) ON campaign_budgets TO coupon_issue;
GRANT INSERT (campaign_id, member_id, month, amount_yen, issued_at) ON issued_coupons TO coupon_issue;
GRANT INSERT (member_id, month) ON member_monthly_usage TO coupon_issue;
GRANT UPDATE (used_yen) ON member_monthly_usage TO coupon_issue;
GRANT INSERT (coupon_id, member_id, created_at, trace_parent) ON notification_outbox TO coupon_issue;
