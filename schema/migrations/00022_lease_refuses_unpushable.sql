-- +goose Up
-- No relay of any release takes a lease on a coupon that may not be pushed (issue 30, item 4:
-- what may be pushed is decided in the database). outbox_claim (00015) judges expiry and voids,
-- but the previous release's RelayOutbox claims with its own inline UPDATE (980de4a,
-- shared/outbox/outboxdb/relay.go), which knows voids and not expiry: beside this release it
-- pushed coupons whose expires_at had passed. Its statement, its arguments and what it reads
-- back stay as they are; the row is refused under it.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue issuances behind a long transaction

-- outbox_lease_refused's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION outbox_lease_refused() RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.issued_coupons c
              WHERE c.coupon_id = NEW.coupon_id
                AND (c.voided_at IS NOT NULL OR c.expires_at <= NEW.next_attempt_at)) THEN
    RETURN NULL;
  END IF;
  RETURN NEW;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION outbox_lease_refused() FROM PUBLIC;

-- The WHEN condition is the lease: every claim of either release sets claimed_by to its run,
-- which no claim of the same run finds already there (a run claims only rows due at its start,
-- and a leased row is due after it); the marks, the release of a lease, the void and `outbox
-- requeue` set it to NULL or leave it alone, so the function is not even called for them.
CREATE TRIGGER outbox_lease_refused BEFORE UPDATE OF claimed_by ON notification_outbox
  FOR EACH ROW
  WHEN (NEW.claimed_by IS NOT NULL AND NEW.claimed_by IS DISTINCT FROM OLD.claimed_by)
  EXECUTE FUNCTION outbox_lease_refused();

-- +goose Down
DROP TRIGGER outbox_lease_refused ON notification_outbox;
DROP FUNCTION outbox_lease_refused();
