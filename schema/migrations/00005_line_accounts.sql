-- +goose Up
-- The relay against the real LINE (functions/relay, shared/outbox).
--
-- member_line_accounts maps a member to the LINE user id the push goes to. LINE addresses a
-- push by the user id it gives each user of the channel ("U" + 32 lowercase hex digits, LINE
-- Messaging API reference, "Send push message", property "to"); the member id means nothing to
-- LINE, which answers 400 to it. The members system fills the table (operators and tests:
-- `couponctl line link`). A member without a row is app-only: their coupons are skipped, not
-- pushed.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue readers behind a long transaction
CREATE TABLE member_line_accounts (
  member_id    text PRIMARY KEY
    CONSTRAINT member_id_format CHECK (member_id ~ '^[!-~]{1,128}$'),
  line_user_id text NOT NULL
    CONSTRAINT line_user_id_format CHECK (line_user_id ~ '^U[0-9a-f]{32}$'),
  linked_at    timestamptz NOT NULL DEFAULT now()
);

-- New relay bookkeeping on notification_outbox:
--
--   skipped_at       when the row was closed without a push because its member has no LINE
--                    account linked (the reason in last_error); `couponctl outbox requeue`
--                    reopens it once the member has linked one
--   first_pushed_at  when the row was first claimed for a push (set by the claim, before the
--                    request goes out, so a crash cannot lose it; cleared again when the claim
--                    is given back unpushed). LINE honours a retry key for 24 hours only, so a
--                    row first pushed about 23 hours ago is parked instead of re-sent.
--
-- attempts now counts pushes actually sent to LINE (marked with the outcome), no longer claims.
-- A row is in exactly one of the states sent, parked, skipped, or open (none of the three).
ALTER TABLE notification_outbox
  ADD COLUMN skipped_at      timestamptz,
  ADD COLUMN first_pushed_at timestamptz,
  DROP CONSTRAINT sent_or_parked,
  ADD CONSTRAINT one_final_state CHECK (num_nonnulls(sent_at, parked_at, skipped_at) <= 1);

-- The relay's claim scans open rows in next_attempt_at order; skipped rows leave the index too.
DROP INDEX notification_outbox_due;
CREATE INDEX notification_outbox_due ON notification_outbox (next_attempt_at)
  WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL;
-- Retention deletes closed rows (sent or skipped) oldest first in bounded batches.
CREATE INDEX notification_outbox_closed ON notification_outbox ((COALESCE(sent_at, skipped_at)))
  WHERE sent_at IS NOT NULL OR skipped_at IS NOT NULL;

-- +goose Down
DROP INDEX notification_outbox_closed;
DROP INDEX notification_outbox_due;
CREATE INDEX notification_outbox_due ON notification_outbox (next_attempt_at)
  WHERE sent_at IS NULL AND parked_at IS NULL;
ALTER TABLE notification_outbox
  DROP CONSTRAINT one_final_state,
  DROP COLUMN first_pushed_at,
  DROP COLUMN skipped_at,
  ADD CONSTRAINT sent_or_parked CHECK (sent_at IS NULL OR parked_at IS NULL);
DROP TABLE member_line_accounts;
