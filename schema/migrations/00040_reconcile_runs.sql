-- +goose NO TRANSACTION
-- +goose Up
-- An incremental reconcile (issue 42; docs/operations.md, "Reconcile: incremental and full"):
-- after a clean run, reconcile checks only what changed since it, found by time.
--   reconcile_runs          one row per clean run: its watermark (every row it has not seen was
--                           stamped at or after it) and each campaign's baseline at it
--   reconcile_run_record    the one writer of reconcile_runs, executable by coupon_admin
--   issued_coupons_issued_brin, notification_outbox_created_brin, coupon_redemptions_at_brin
--                           BRIN indexes on time columns written in order: the lookups of what
--                           changed. An insert into a page range not yet summarized writes nothing
--                           to a BRIN index (vacuum summarizes it): no random index write per
--                           coupon. The voids are found by issued_coupons_voided (00036).
-- The indexes are built with CREATE INDEX CONCURRENTLY (writes go on), outside a transaction, as
-- 00036 builds one: an INVALID index an interrupted build left behind is dropped first, and a
-- build that ends INVALID fails loudly (the next run drops it). Every step can run again. Nothing the
-- previous release calls is changed.
SET lock_timeout = '3s';

CREATE TABLE IF NOT EXISTS reconcile_runs (
  run_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  full_pass   boolean NOT NULL,
  since       timestamptz,
  watermark   timestamptz NOT NULL,
  campaigns   jsonb NOT NULL CONSTRAINT campaigns_object CHECK (jsonb_typeof(campaigns) = 'object'),
  coupons     bigint NOT NULL,
  months      bigint NOT NULL,
  started_at  timestamptz NOT NULL,
  finished_at timestamptz NOT NULL DEFAULT issue_now(),
  ran_by      text NOT NULL DEFAULT session_user,
  CONSTRAINT since_before_watermark CHECK (since IS NULL OR since <= watermark),
  CONSTRAINT full_from_nothing CHECK (full_pass = (since IS NULL))
);
GRANT SELECT ON reconcile_runs TO coupon_admin;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION reconcile_run_record(p_full boolean, p_since timestamptz, p_watermark timestamptz,
                                                p_campaigns jsonb, p_coupons bigint, p_months bigint,
                                                p_started_at timestamptz)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_id bigint;
BEGIN
  PERFORM instant_check('reconcile_run_record', 'p_since', p_since);
  PERFORM instant_check('reconcile_run_record', 'p_watermark', p_watermark);
  PERFORM instant_check('reconcile_run_record', 'p_started_at', p_started_at);
  INSERT INTO reconcile_runs (full_pass, since, watermark, campaigns, coupons, months, started_at)
  VALUES (p_full, CASE WHEN NOT p_full THEN p_since END, p_watermark, p_campaigns, p_coupons, p_months, p_started_at)
  RETURNING run_id INTO v_id;
  RETURN v_id;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION reconcile_run_record(boolean, timestamptz, timestamptz, jsonb, bigint, bigint, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION reconcile_run_record(boolean, timestamptz, timestamptz, jsonb, bigint, bigint, timestamptz) TO coupon_admin;
COMMENT ON FUNCTION reconcile_run_record(boolean, timestamptz, timestamptz, jsonb, bigint, bigint, timestamptz) IS
$$Records a clean reconcile run (couponctl reconcile, internal/ops/reconcile) and answers its
run_id: p_full whether it checked every row (then p_since is not kept), else p_since the watermark
of the clean run it continued; p_watermark the instant at or after which every row the run did not
see was stamped; p_campaigns each campaign's baseline at p_watermark, {"ID": [yen, coupons]}, the
coupons issued before it that were live or voided at or after it; p_coupons the coupons the run
examined (changed since p_since, or every live coupon for a full pass) and p_months their
member-months (0 for a full pass, which examines all); p_started_at when it began. Errors: 22023 for an instant
out of range (instant_check); 23514 for a watermark before p_since or a baseline that is not a JSON
object, 23502 for a NULL watermark.
Writes only reconcile_runs. SECURITY DEFINER, executable by coupon_admin.$$;

-- +goose StatementBegin
DO $$
DECLARE
  v_name text;
BEGIN
  FOREACH v_name IN ARRAY ARRAY['issued_coupons_issued_brin', 'notification_outbox_created_brin', 'coupon_redemptions_at_brin'] LOOP
    IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(v_name) AND NOT indisvalid) THEN
      RAISE WARNING '%: dropping the INVALID index an interrupted build left behind', v_name;
      EXECUTE format('DROP INDEX %I', v_name);
    END IF;
  END LOOP;
END $$;
-- +goose StatementEnd

CREATE INDEX CONCURRENTLY IF NOT EXISTS issued_coupons_issued_brin ON issued_coupons USING brin (issued_at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS notification_outbox_created_brin ON notification_outbox USING brin (created_at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS coupon_redemptions_at_brin ON coupon_redemptions USING brin (at);

-- +goose StatementBegin
DO $$
DECLARE
  v_name text;
BEGIN
  FOREACH v_name IN ARRAY ARRAY['issued_coupons_issued_brin', 'notification_outbox_created_brin', 'coupon_redemptions_at_brin'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(v_name) AND indisvalid) THEN
      RAISE EXCEPTION '% is not a valid index after CREATE INDEX CONCURRENTLY: run couponctl migrate again, which drops it and builds it again', v_name;
    END IF;
  END LOOP;
END $$;
-- +goose StatementEnd

RESET lock_timeout;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
