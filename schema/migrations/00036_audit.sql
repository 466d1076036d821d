-- +goose NO TRANSACTION
-- +goose Up
-- The console's audit page (issue 40; docs/console.md, "Audit"): every change across campaigns,
-- voids, role grants and rule settings, read by the console's login.
--   - coupon_console may read the histories it did not read yet: console_role_changes (role
--     grants), coupon_rules_changes (rule settings), coupon_changes (reissue corrections).
--   - issued_coupons_voided: the voids by their time, so that the page reads them without
--     scanning every coupon. Built with CREATE INDEX CONCURRENTLY (writes go on; PostgreSQL 15
--     docs, "Building Indexes Concurrently"), outside a transaction, as 00012 builds one: an
--     INVALID index an interrupted build left behind is dropped first, and a build that ends
--     INVALID is dropped and fails loudly. Every step can run again.
-- Grants and an index: nothing the previous release calls is changed.
SET lock_timeout = '3s';

GRANT SELECT ON console_role_changes, coupon_rules_changes, coupon_changes TO coupon_console;

-- +goose StatementBegin
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('issued_coupons_voided') AND NOT indisvalid) THEN
    RAISE WARNING 'issued_coupons_voided: dropping the INVALID index an interrupted build left behind';
    DROP INDEX issued_coupons_voided;
  END IF;
END $$;
-- +goose StatementEnd

CREATE INDEX CONCURRENTLY IF NOT EXISTS issued_coupons_voided ON issued_coupons (voided_at) WHERE voided_at IS NOT NULL;

-- +goose StatementBegin
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('issued_coupons_voided') AND indisvalid) THEN
    DROP INDEX IF EXISTS issued_coupons_voided;
    RAISE EXCEPTION 'issued_coupons_voided is not a valid index after CREATE INDEX CONCURRENTLY; it was dropped: run couponctl migrate again';
  END IF;
END $$;
-- +goose StatementEnd

RESET lock_timeout;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
