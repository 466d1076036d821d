-- +goose Up
-- No relay of any release takes a lease on a coupon that may not be pushed (issue 30, item 4:
-- what may be pushed is decided in the database). outbox_claim (00015) judges expiry and voids,
-- but the previous release's RelayOutbox claims with its own inline UPDATE (980de4a,
-- shared/outbox/outboxdb/relay.go), which knows voids and not expiry: beside this release it
-- pushed coupons whose expires_at had passed. Its statement, its arguments and what it reads
-- back stay as they are; the row is refused under it.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue issuances behind a long transaction

-- outbox_lease_refused is the BEFORE UPDATE trigger of notification_outbox below. The update it
-- sees takes a lease (a run's id set in claimed_by); it returns NULL, so that PostgreSQL neither
-- changes the row nor returns it from the statement's RETURNING, when the row's coupon is voided
-- or expires by the lease's end (NEW.next_attempt_at), outbox_claim's own rule; otherwise NEW.
-- The refused row stays open and unleased: outbox_claim closes it as skipped, with its reason,
-- on its next run. It takes no lock: it reads the coupon row by its primary key, in a snapshot
-- of its own taken after the claim locked the outbox row (READ COMMITTED, a VOLATILE function),
-- so it sees a void that committed meanwhile. A void that is still open holds the outbox row
-- (00018), which every claim skips. It runs with the rights of the statement that fires it, so it
-- reads its one table by its schema-qualified name, which no temporary table can stand in for,
-- instead of a SET search_path, which is set and restored on every call, once per leased row
-- (BenchmarkClaimLeaseGuard measures both, docs/performance.md).
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
