-- +goose Up
-- One issuance (docs/design.md, "Coalescing a hot campaign"): the rules R1-R3, voids, validity
-- and the campaign's state are written once, in issue_coupons_batch (00013). A request alone is
-- a batch of one: IssueCoupon calls issue_coupons_batch for every request, and `couponctl grant`
-- calls grant_coupons_batch, below. issue_coupon and grant_coupon stay, with their arguments and
-- their answers, for the release before this one, which calls them while a deploy runs beside
-- it; each becomes a call of a batch of one.
--
-- CREATE OR REPLACE, never DROP: a call in flight in another session when its function is
-- dropped fails with XX000 "cache lookup failed".
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue readers behind a long transaction

-- grant_coupons_batch's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION grant_coupons_batch(
  p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_issued_at timestamptz[],
  p_cap_yen integer, p_trace_parents text[])
RETURNS TABLE (i integer, result text, coupon text, amount integer, reason text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  a record;
BEGIN
  FOR a IN SELECT * FROM issue_coupons_batch(p_campaign_id, p_coupon_ids, p_member_ids, p_issued_at, p_cap_yen, p_trace_parents) LOOP
    IF a.result = 'ISSUED' THEN
      UPDATE issued_coupons c SET granted_by = session_user WHERE c.coupon_id = a.coupon::uuid;
    END IF;
    i := a.i; result := a.result; coupon := a.coupon; amount := a.amount; reason := a.reason; expires_at := a.expires_at;
    RETURN NEXT;
  END LOOP;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION grant_coupons_batch(text, uuid[], text[], timestamptz[], integer, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION grant_coupons_batch(text, uuid[], text[], timestamptz[], integer, text[]) TO coupon_admin;

-- issue_coupon's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION issue_coupon(
  p_coupon_id uuid, p_campaign_id text, p_member_id text, p_issued_at timestamptz,
  p_cap_yen integer, p_trace_parent text,
  OUT result text, OUT coupon text, OUT amount integer, OUT reason text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
BEGIN
  IF p_coupon_id IS NULL OR p_campaign_id IS NULL OR p_member_id IS NULL OR p_issued_at IS NULL
     OR p_cap_yen IS NULL OR p_cap_yen <= 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'issue_coupon: the ids and the issue time are required, and the cap must be positive yen';
  END IF;
  SELECT b.result, b.coupon, b.amount, b.reason, b.expires_at INTO result, coupon, amount, reason, expires_at
    FROM issue_coupons_batch(p_campaign_id, ARRAY[p_coupon_id], ARRAY[p_member_id], ARRAY[p_issued_at],
                             p_cap_yen, ARRAY[p_trace_parent]) b;
  IF result = 'RETRY' THEN
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
      MESSAGE = 'issue_coupon: every budget stripe with room is held by another call; try again';
  END IF;
END
$$;
-- +goose StatementEnd

-- grant_coupon's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION grant_coupon(
  p_coupon_id uuid, p_campaign_id text, p_member_id text, p_issued_at timestamptz,
  p_cap_yen integer, p_trace_parent text,
  OUT result text, OUT coupon text, OUT amount integer, OUT reason text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
BEGIN
  IF p_coupon_id IS NULL OR p_campaign_id IS NULL OR p_member_id IS NULL OR p_issued_at IS NULL
     OR p_cap_yen IS NULL OR p_cap_yen <= 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'grant_coupon: the ids and the issue time are required, and the cap must be positive yen';
  END IF;
  SELECT b.result, b.coupon, b.amount, b.reason, b.expires_at INTO result, coupon, amount, reason, expires_at
    FROM grant_coupons_batch(p_campaign_id, ARRAY[p_coupon_id], ARRAY[p_member_id], ARRAY[p_issued_at],
                             p_cap_yen, ARRAY[p_trace_parent]) b;
  IF result = 'RETRY' THEN
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
      MESSAGE = 'grant_coupon: every budget stripe with room is held by another call; try again';
  END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
