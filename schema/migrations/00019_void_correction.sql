-- +goose Up
-- A void made without --allow-reissue can be corrected (issue 31, item 3): before this, the
-- member's pair answered COUPON_VOIDED for good. coupon_allow_reissue releases the pair of a
-- coupon voided without reissue, writes the coupon's history, and changes no counter (the
-- coupon's yen went back to R1's stripe and R3's month at the void). coupon_void (00011) is
-- unchanged: the previous release's `couponctl coupon void` still gets ALREADY_VOIDED for a
-- voided coupon.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue issuances behind a long transaction

-- coupon_changes: a coupon's history after its void, oldest first by change_id ('allow_reissue'
-- is the one change so far). changed_by is the database login, as campaign_changes records it.
CREATE TABLE coupon_changes (
  change_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  coupon_id  uuid NOT NULL REFERENCES issued_coupons (coupon_id),
  changed_at timestamptz NOT NULL DEFAULT now(),
  changed_by text NOT NULL DEFAULT session_user,
  what       text NOT NULL CONSTRAINT what_known CHECK (what IN ('allow_reissue')),
  reason     text NOT NULL CONSTRAINT reason_given CHECK (btrim(reason) <> '')
);
CREATE INDEX coupon_changes_coupon ON coupon_changes (coupon_id, change_id);

-- coupon_allow_reissue's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION coupon_allow_reissue(p_coupon_id uuid, p_reason text,
  OUT result text, OUT campaign_id text, OUT member_id text, OUT voided_at timestamptz, OUT voided_by text,
  OUT changed_at timestamptz, OUT changed_by text)
RETURNS record
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_c issued_coupons;
BEGIN
  IF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every change needs a reason (--reason TEXT)';
  END IF;
  SELECT * INTO v_c FROM issued_coupons c WHERE c.coupon_id = p_coupon_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI404', MESSAGE = format('coupon %s does not exist', p_coupon_id);
  END IF;
  campaign_id := v_c.campaign_id; member_id := v_c.member_id; voided_at := v_c.voided_at; voided_by := v_c.voided_by;
  IF v_c.voided_at IS NULL THEN
    result := 'NOT_VOIDED'; RETURN;
  ELSIF v_c.reissue_allowed THEN
    result := 'ALREADY_ALLOWED'; RETURN;
  END IF;
  UPDATE issued_coupons c SET reissue_allowed = true WHERE c.coupon_id = p_coupon_id;
  INSERT INTO coupon_changes (coupon_id, what, reason) VALUES (p_coupon_id, 'allow_reissue', p_reason)
  RETURNING coupon_changes.changed_at, coupon_changes.changed_by INTO changed_at, changed_by;
  result := 'RELEASED';
END
$$;
-- +goose StatementEnd

REVOKE ALL ON FUNCTION coupon_allow_reissue(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coupon_allow_reissue(uuid, text) TO coupon_admin;
GRANT SELECT ON coupon_changes TO coupon_admin;

-- +goose Down
DROP FUNCTION coupon_allow_reissue(uuid, text);
DROP TABLE coupon_changes;
