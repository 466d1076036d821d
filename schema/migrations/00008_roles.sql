-- +goose Up
-- Least privilege (docs/roles.md): one group role per kind of caller, NOLOGIN; the deploy
-- scripts grant them to the runtime users (GRANT coupon_issue TO "coupon-issue@PROJECT.iam").
--   coupon_issue  IssueCoupon (functions/issue, shared/issuance)
--   coupon_relay  RelayOutbox (functions/relay, shared/outbox)
--   coupon_admin  couponctl's operator verbs (campaign, reconcile, outbox, line, legacy)
-- The tables stay owned by the migration's user, which alone may change the schema (and runs
-- `couponctl migrate`). Roles are cluster-wide, grants are per database: each role is created
-- only if missing (several databases of one server share them; the migration's user needs
-- CREATEROLE the first time), and every grant is made here, after a REVOKE ALL, so this file
-- states exactly what each role may do. A later migration that adds a table or a column a role
-- needs grants it in the same file. Foreign-key checks run with the table owner's rights, so no
-- role needs any privilege on the referenced table (campaigns, issued_coupons) for them.
-- Functions run with PUBLIC's default EXECUTE (gen_random_uuid, pg_terminate_backend); no role
-- uses a sequence (the ids are uuids; goose_db_version's id sequence is the migration's).

-- Two databases of one server migrated at once may both find a role missing: the second
-- CREATE ROLE then waits for the first and fails on pg_authid's unique index (23505), which
-- means the role is there.
-- +goose StatementBegin
DO $$
DECLARE
  r text;
BEGIN
  FOREACH r IN ARRAY ARRAY['coupon_issue', 'coupon_relay', 'coupon_admin'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
      BEGIN
        EXECUTE format('CREATE ROLE %I NOLOGIN', r);
      EXCEPTION WHEN unique_violation OR duplicate_object THEN
        NULL; -- created meanwhile by a concurrent migration
      END;
    END IF;
  END LOOP;
END $$;
-- +goose StatementEnd

REVOKE ALL ON ALL TABLES IN SCHEMA public FROM coupon_issue, coupon_relay, coupon_admin;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM coupon_issue, coupon_relay, coupon_admin;

-- Every role: name the tables (schema public), and read the schema version for the start-up
-- check (schema.Check reads goose_db_version and writes nothing).
GRANT USAGE ON SCHEMA public TO coupon_issue, coupon_relay, coupon_admin;
GRANT SELECT ON goose_db_version TO coupon_issue, coupon_relay, coupon_admin;

-- coupon_issue: the statements of shared/issuance (queries.go), the lost-COMMIT settlement and
-- the budget gauge (shared/telemetry). It changes two counters, never a budget, a coupon after
-- its insert, or the relay's bookkeeping, and deletes nothing.
--   campaign_budgets: the campaign CTE, the why-not and stripe-with-room reads and the gauge
--     read the definition and counters (SELECT); R1 adds to issued_yen, and the striped add's
--     FOR UPDATE SKIP LOCKED needs UPDATE on a column: UPDATE (issued_yen) and nothing else.
GRANT SELECT ON campaign_budgets TO coupon_issue;
GRANT UPDATE (issued_yen) ON campaign_budgets TO coupon_issue;
--   issued_coupons: R2's insert names these five columns (coupon_id takes its default); its
--     RETURNING reads coupon_id and amount_yen, its ON CONFLICT arbiter campaign_id, member_id
--     and legacy_duplicate, as do the why-not read and the settlement's coupon read: SELECT on
--     those columns only. No UPDATE, no DELETE: a coupon is never changed by the function.
GRANT INSERT (campaign_id, member_id, month, amount_yen, issued_at) ON issued_coupons TO coupon_issue;
GRANT SELECT (coupon_id, campaign_id, member_id, amount_yen, legacy_duplicate) ON issued_coupons TO coupon_issue;
--   member_monthly_usage: R3 creates the member x month row if missing (INSERT of the key; its
--     ON CONFLICT arbiter reads the key) and adds to used_yen, judged on the row (SELECT, and
--     UPDATE (used_yen) only).
GRANT SELECT ON member_monthly_usage TO coupon_issue;
GRANT INSERT (member_id, month) ON member_monthly_usage TO coupon_issue;
GRANT UPDATE (used_yen) ON member_monthly_usage TO coupon_issue;
--   notification_outbox: the outbox row is inserted with these four columns, nothing read back;
--     the relay's columns keep their defaults.
GRANT INSERT (coupon_id, member_id, created_at, trace_parent) ON notification_outbox TO coupon_issue;
--   The settlement of a lost COMMIT answer reads pg_stat_activity and calls pg_terminate_backend
--     on a backend of its own user: both allowed to every role for its own sessions.

-- coupon_relay: the statements of shared/outbox (queries.go) and the outbox gauges
-- (shared/telemetry). It reads coupons and LINE accounts and updates the relay's columns of
-- the outbox; it inserts and deletes nothing.
--   notification_outbox: the claim, the marks and the gauges read the rows (SELECT); the claim
--     and the marks write only the relay's bookkeeping (00004, 00005), never coupon_id,
--     member_id, created_at or trace_parent. The claim's FOR UPDATE SKIP LOCKED is covered by
--     this column-level UPDATE.
GRANT SELECT ON notification_outbox TO coupon_relay;
GRANT UPDATE (sent_at, attempts, next_attempt_at, claimed_by, last_error, parked_at, skipped_at, first_pushed_at)
  ON notification_outbox TO coupon_relay;
--   issued_coupons: the claim joins on coupon_id for the message's campaign and value.
GRANT SELECT (coupon_id, campaign_id, amount_yen) ON issued_coupons TO coupon_relay;
--   member_line_accounts: the claim reads the member's LINE user id.
GRANT SELECT ON member_line_accounts TO coupon_relay;

-- coupon_admin: couponctl's operator verbs. It reads every table (campaign show, reconcile,
-- legacy report, outbox status) and writes only what a verb writes. It owns nothing, so it can
-- neither change the schema nor TRUNCATE, and it never writes a coupon or a budget after
-- the fact.
GRANT SELECT ON campaigns, campaign_budgets, issued_coupons, member_monthly_usage, notification_outbox,
  member_line_accounts, legacy_overshoot TO coupon_admin;
--   campaign create: the definition and its budget stripes.
GRANT INSERT (campaign_id, discount_yen, budget_yen) ON campaigns TO coupon_admin;
GRANT INSERT (campaign_id, stripe, discount_yen, budget_yen, starts_at, ends_at) ON campaign_budgets TO coupon_admin;
--   legacy rollback writes the Before code's counter back (campaigns.issued_yen).
GRANT UPDATE (issued_yen) ON campaigns TO coupon_admin;
--   reconcile --repair locks (FOR UPDATE) and rebuilds the counters; it creates a missing usage
--     row, and locks an existing one with ON CONFLICT DO UPDATE SET used_yen.
GRANT UPDATE (issued_yen) ON campaign_budgets TO coupon_admin;
GRANT INSERT (member_id, month), UPDATE (used_yen) ON member_monthly_usage TO coupon_admin;
--   outbox requeue reopens parked and skipped rows (FOR UPDATE OF the rows it reopens); outbox
--     prune deletes sent and skipped rows past the retention (the daily operator job: the relay
--     deletes nothing).
GRANT UPDATE (parked_at, skipped_at, attempts, next_attempt_at, first_pushed_at) ON notification_outbox TO coupon_admin;
GRANT DELETE ON notification_outbox TO coupon_admin;
--   line link (insert, or relink with ON CONFLICT DO UPDATE) and line unlink.
GRANT INSERT (member_id, line_user_id), UPDATE (line_user_id, linked_at), DELETE ON member_line_accounts TO coupon_admin;

-- +goose Down
-- The grants go; the roles stay: they are cluster-wide, other databases of the server may use
-- them, and runtime users are members (drop them by hand with DROP ROLE once nothing uses them).
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM coupon_issue, coupon_relay, coupon_admin;
REVOKE USAGE ON SCHEMA public FROM coupon_issue, coupon_relay, coupon_admin;
