-- +goose Up
-- issued_coupons.outbox_outcome: what a coupon's LINE push came to, kept when the prune deletes
-- its outbox row (issue 40; docs/operations.md, "Outbox retention"). Before, a pruned row left
-- only outbox_pruned_at, and the console read every pruned coupon as sent, so support would tell
-- a member without a LINE account, or with a voided coupon, that a message was sent. The prune
-- (shared/outbox/outboxdb, Prune) writes, in the statement that deletes the row:
--   sent                     the push was delivered
--   skipped:REASON           closed without a push, REASON the row's skip_reason (voided,
--                            redeemed, expired, no_line_account)
--   skipped                  closed without a push before skip_reason existed (00015)
-- NULL: not pruned, or pruned before this migration or by the previous release's prune: the
-- outcome is not known, and the console says so.
-- The previous release reads named columns of issued_coupons (and rows into PL/pgSQL row types,
-- which take the column), and its prune leaves this one NULL. The column is added without a
-- default and its check NOT VALID: no row is rewritten or scanned under the table's lock, which
-- is asked for 100 ms at a time and let go in between, as 00031 takes its locks, so that no
-- issuance (which inserts coupons) waits behind it for longer, and it never deadlocks one.
SET LOCAL lock_timeout = '5s';

-- +goose StatementBegin
DO $$
DECLARE
  v_until timestamptz := clock_timestamp() + interval '30 seconds';
BEGIN
  PERFORM set_config('lock_timeout', '100ms', true);
  LOOP
    BEGIN
      LOCK TABLE issued_coupons IN ACCESS EXCLUSIVE MODE;
      EXIT;
    EXCEPTION WHEN lock_not_available THEN
      IF clock_timestamp() > v_until THEN
        RAISE;
      END IF;
      PERFORM pg_sleep(random() * 0.1);
    END;
  END LOOP;
  PERFORM set_config('lock_timeout', '5s', true);
END $$;
-- +goose StatementEnd
ALTER TABLE issued_coupons ADD COLUMN outbox_outcome text,
  ADD CONSTRAINT outbox_outcome_known CHECK (outbox_outcome IN ('sent', 'skipped', 'skipped:voided', 'skipped:redeemed',
                                                                'skipped:expired', 'skipped:no_line_account')) NOT VALID;
-- couponctl outbox prune runs as coupon_admin, which may write the two columns the prune writes.
GRANT UPDATE (outbox_outcome) ON issued_coupons TO coupon_admin;
COMMENT ON COLUMN issued_coupons.outbox_outcome IS
'What the coupon''s LINE push came to, written by the prune as it deletes the outbox row: sent, skipped:REASON (the row''s skip_reason), skipped (no reason recorded); NULL when not pruned, or pruned before 00035 or by the previous release (not known).';

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
