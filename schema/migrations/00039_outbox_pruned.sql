-- +goose Up
-- outbox_pruned: what a pruned outbox row's push came to, one narrow row per pruned coupon,
-- written by the prune (shared/outbox/outboxdb, Prune) in the statement that deletes the row
-- (issue 42; docs/operations.md, "Outbox retention"). Until now the prune updated the coupon row
-- (issued_coupons.outbox_pruned_at and outbox_outcome, 00011 and 00035): a coupon's page is full,
-- so the new version went to another page with a new entry in each of its three indexes, random
-- leaves of indexes far larger than the cache, and at a checkpoint every 31-47 s nearly every one
-- of them wrote its full page into the WAL: 13.6 KB per pruned row. This table is keyed by the
-- coupon's issue time first, the order the prune reaches coupons in, so its inserts fill the
-- right edge of its one index, page after page; the coupon row is not touched.
-- A reader finds a coupon's outcome by (issued_at, coupon_id) in either place: here, or in the
-- coupon's columns (written by the prunes before this one, and by the previous release's prune,
-- which keeps running beside it: the two take disjoint outbox rows, SKIP LOCKED).
-- A new table: no table the issuance reads or writes is altered or locked, and the prune no
-- longer takes coupon rows (docs/design.md, "Lock order"). No foreign key to issued_coupons: its
-- check would lock each coupon row (FOR KEY SHARE), the write this table saves.
SET LOCAL lock_timeout = '5s';

CREATE TABLE outbox_pruned (
  issued_at timestamptz NOT NULL,
  coupon_id uuid NOT NULL,
  outcome   text NOT NULL CONSTRAINT outcome_known CHECK (outcome IN ('sent', 'skipped', 'skipped:voided', 'skipped:redeemed',
                                                                      'skipped:expired', 'skipped:no_line_account')),
  pruned_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (issued_at, coupon_id)
);
GRANT SELECT, INSERT ON outbox_pruned TO coupon_admin;
GRANT SELECT ON outbox_pruned TO coupon_console;
COMMENT ON TABLE outbox_pruned IS
'What a coupon''s LINE push came to once the prune deleted its outbox row (since 00039): sent, skipped:REASON (the row''s skip_reason), skipped (no reason recorded). A coupon pruned before 00039, or by the previous release''s prune, has it in issued_coupons.outbox_pruned_at and outbox_outcome instead.';

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
