-- +goose NO TRANSACTION
-- +goose Up
-- R2: at most one live coupon per (campaign, member), over the coupons that are not legacy
-- duplicates (00002 marked those). The issuance's ON CONFLICT infers this partial index from its
-- predicate (shared/issuance, sqlCouponInsert).
--
-- CREATE INDEX CONCURRENTLY builds the index without blocking writes to issued_coupons, but it
-- cannot run inside a transaction block (PostgreSQL 15 docs, CREATE INDEX "Building Indexes
-- Concurrently"): goose runs this file statement by statement outside a transaction
-- (NO TRANSACTION above), on one connection. A concurrent build that fails or is interrupted
-- leaves an INVALID index that enforces nothing; the steps below drop such a leftover before
-- building, and fail loudly if the new build is not valid.
SET lock_timeout = '3s';

-- +goose StatementBegin
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('one_coupon_per_member') AND NOT indisvalid) THEN
    RAISE WARNING 'one_coupon_per_member: dropping the INVALID index an interrupted build left behind';
    DROP INDEX one_coupon_per_member;
  END IF;
END $$;
-- +goose StatementEnd

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS one_coupon_per_member
  ON issued_coupons (campaign_id, member_id) WHERE NOT legacy_duplicate;

-- +goose StatementBegin
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('one_coupon_per_member') AND indisvalid) THEN
    DROP INDEX IF EXISTS one_coupon_per_member;
    RAISE EXCEPTION 'one_coupon_per_member is not a valid index after CREATE INDEX CONCURRENTLY; it was dropped. Check for duplicate live coupons (couponctl legacy report) and run couponctl migrate again';
  END IF;
END $$;
-- +goose StatementEnd

RESET lock_timeout;

-- +goose Down
DROP INDEX IF EXISTS one_coupon_per_member;
