-- +goose Up
-- Relay bookkeeping on the transactional outbox (functions/relay, shared/outbox). The columns
-- docs/api.md names (coupon_id, member_id, created_at, sent_at) keep their names and meaning; a row is
-- delivered when sent_at is set, dead-lettered when parked_at is set, and due otherwise.
--
--   attempts         pushes started for the row (counted when it is claimed, so a relay that
--                    crashes mid-push still uses up an attempt)
--   next_attempt_at  the earliest instant a relay may claim the row: the insert time for a new
--                    row, now() + the lease while a relay holds it, now() + the full-jitter
--                    backoff (or LINE's Retry-After) after a failed push
--   claimed_by       the relay run that holds the lease, NULL when no run holds it
--   last_error       why the last push or mark failed (kept after a later success, for history)
--   parked_at        when the row was dead-lettered: LINE refused it (4xx other than 409/429) or
--                    it reached the attempt limit; `couponctl outbox requeue` clears it
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue readers behind a long transaction
ALTER TABLE notification_outbox
  ADD COLUMN attempts        integer     NOT NULL DEFAULT 0
    CONSTRAINT attempts_not_negative CHECK (attempts >= 0),
  ADD COLUMN next_attempt_at timestamptz NOT NULL DEFAULT now(),
  ADD COLUMN claimed_by      uuid,
  ADD COLUMN last_error      text,
  ADD COLUMN parked_at       timestamptz,
  ADD CONSTRAINT sent_or_parked CHECK (sent_at IS NULL OR parked_at IS NULL);

-- The relay's claim scans due rows in next_attempt_at order; sent and parked rows leave the index.
CREATE INDEX notification_outbox_due ON notification_outbox (next_attempt_at)
  WHERE sent_at IS NULL AND parked_at IS NULL;
-- Operators list the dead letters (`couponctl outbox status`).
CREATE INDEX notification_outbox_parked ON notification_outbox (parked_at)
  WHERE parked_at IS NOT NULL;

-- +goose Down
DROP INDEX notification_outbox_parked;
DROP INDEX notification_outbox_due;
ALTER TABLE notification_outbox
  DROP CONSTRAINT sent_or_parked,
  DROP COLUMN parked_at,
  DROP COLUMN last_error,
  DROP COLUMN claimed_by,
  DROP COLUMN next_attempt_at,
  DROP COLUMN attempts;
