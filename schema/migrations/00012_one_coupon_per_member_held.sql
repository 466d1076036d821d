-- +goose NO TRANSACTION
-- +goose Up
-- R2 over the coupons that hold their (campaign, member) pair: a coupon voided with reissue
-- allowed (00011, couponctl coupon void --allow-reissue) lets the member be issued the campaign
-- again. The unique index one_coupon_per_member (00003: WHERE NOT legacy_duplicate) becomes
-- WHERE NOT legacy_duplicate AND NOT reissue_allowed. Live coupons are among those, so at most one
-- live coupon per pair still holds.
--
-- How it changes on a live table without locking issuance out (PostgreSQL 15 docs, CREATE INDEX
-- "Building Indexes Concurrently", DROP INDEX CONCURRENTLY, ALTER INDEX): goose runs this file
-- statement by statement outside a transaction (NO TRANSACTION above), on one connection.
--   1. The new index is built beside the old one with CREATE INDEX CONCURRENTLY: writes go on.
--      Until 00011's first void with reissue allowed both say the same, and issue_coupon's
--      ON CONFLICT DO NOTHING (00011) names no index, so it takes whichever conflicts.
--   2. A build that failed or was interrupted leaves an INVALID index that enforces nothing: it is
--      dropped before building, and the step fails loudly if the new one is not valid.
--   3. The old index is dropped with DROP INDEX CONCURRENTLY, which waits for the transactions
--      using it instead of blocking them.
--   4. The new index takes the old name (ALTER INDEX ... RENAME, a SHARE UPDATE EXCLUSIVE lock
--      that writes do not wait for).
-- Every step can run again: run `couponctl migrate` again after any failure.
SET lock_timeout = '3s';

-- +goose StatementBegin
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('one_coupon_per_member_held') AND NOT indisvalid) THEN
    RAISE WARNING 'one_coupon_per_member_held: dropping the INVALID index an interrupted build left behind';
    DROP INDEX one_coupon_per_member_held;
  END IF;
END $$;
-- +goose StatementEnd

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS one_coupon_per_member_held
  ON issued_coupons (campaign_id, member_id) WHERE NOT legacy_duplicate AND NOT reissue_allowed;

-- +goose StatementBegin
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('one_coupon_per_member_held') AND indisvalid) THEN
    DROP INDEX IF EXISTS one_coupon_per_member_held;
    RAISE EXCEPTION 'one_coupon_per_member_held is not a valid index after CREATE INDEX CONCURRENTLY; it was dropped. Check for two coupons of one pair that both hold it (couponctl reconcile) and run couponctl migrate again';
  END IF;
END $$;
-- +goose StatementEnd

DROP INDEX CONCURRENTLY IF EXISTS one_coupon_per_member;

ALTER INDEX one_coupon_per_member_held RENAME TO one_coupon_per_member;

RESET lock_timeout;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
