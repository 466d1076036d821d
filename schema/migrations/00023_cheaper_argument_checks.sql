-- +goose Up
-- The argument checks, the cap's read and the clock that 00021 put at the top of
-- issue_coupons_batch, cheaper for a request alone (issue 29: a batch of one still cost
-- PostgreSQL more than issue_coupon's own body of 00011; docs/performance.md, "A leaner batch of
-- one (00020)"). The same checks, refusals (22023) and lock order; issue_coupons_batch's body does
-- not change. Backend CPU per call on a throwaway PostgreSQL, one transaction per call, 00021's
-- helpers and these in turns:
--   * issuance_args_check, 70-104 us, now 27-36:
--     - an id's format judged by its length and a class of the characters it may not hold
--       ('[^!-~]'), not by a counted repetition ('^[!-~]{1,128}$'), whose match took 13 us for a
--       member id, against 0.7 (the regex is compiled once; matching the repetition is slow);
--     - a traceparent likewise: its length, the places of its dashes, hex between them;
--     - the members' ids, coupon ids and traces in one pass over the entries, not a query each
--       (SELECT ... FROM unnest, an executor's start each);
--     - the arrays' shapes judged by one inlined expression (arg_array_fits); arg_array_check,
--       which names the array at fault, runs only when that expression fails;
--   * monthly_cap_yen, 56-68 us, now 8-15: PL/pgSQL, which keeps its read's plan for the session;
--   * issue_clock, 15-20 us, now 10-15: the skew judged in a loop over the times, not a query.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue issuances behind a long transaction

-- arg_array_fits's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION arg_array_fits(p_arr anyarray, p_n integer, p_nulls_ok boolean) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT array_ndims(p_arr) IS NOT DISTINCT FROM 1 AND array_lower(p_arr, 1) = 1 AND cardinality(p_arr) = p_n
     AND (p_nulls_ok OR array_position(p_arr, NULL) IS NULL)
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION arg_array_fits(anyarray, integer, boolean) FROM PUBLIC;

-- arg_array_check's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION arg_array_check(p_fn text, p_name text, p_arr anyarray, p_n integer, p_nulls_ok boolean)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF NOT arg_array_fits(p_arr, p_n, true) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: %s is %s: want one dimension, %s elements, from index 1 ([1:%s])',
                       p_fn, p_name, coalesce(array_dims(p_arr), 'NULL or empty'), p_n, p_n);
  ELSIF NOT arg_array_fits(p_arr, p_n, p_nulls_ok) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: %s holds a NULL at index %s', p_fn, p_name, array_position(p_arr, NULL));
  END IF;
END
$$;
-- +goose StatementEnd

-- issuance_args_check's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION issuance_args_check(p_fn text, p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[],
  p_issued_at timestamptz[], p_trace_parents text[])
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  n integer := coalesce(cardinality(p_member_ids), 0);
BEGIN
  IF p_campaign_id IS NULL OR length(p_campaign_id) NOT BETWEEN 1 AND 64 OR p_campaign_id ~ '[^A-Za-z0-9_-]' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: campaign id %L: want 1-64 of [A-Za-z0-9_-]', p_fn, p_campaign_id);
  ELSIF n NOT BETWEEN 1 AND issuance_batch_max() THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: %s members: want 1 to %s', p_fn, n, issuance_batch_max());
  ELSIF NOT (arg_array_fits(p_member_ids, n, false) AND arg_array_fits(p_coupon_ids, n, false)
             AND arg_array_fits(p_issued_at, n, false) AND arg_array_fits(p_trace_parents, n, true)) THEN
    PERFORM arg_array_check(p_fn, 'p_member_ids', p_member_ids, n, false);
    PERFORM arg_array_check(p_fn, 'p_coupon_ids', p_coupon_ids, n, false);
    PERFORM arg_array_check(p_fn, 'p_issued_at', p_issued_at, n, false);
    PERFORM arg_array_check(p_fn, 'p_trace_parents', p_trace_parents, n, true);
  END IF;
  FOR k IN 1 .. n LOOP
    IF length(p_member_ids[k]) NOT BETWEEN 1 AND 128 OR p_member_ids[k] ~ '[^!-~]' THEN
      RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = format('%s: member id %L: want 1-128 bytes of visible ASCII (0x21-0x7E)', p_fn, p_member_ids[k]);
    ELSIF array_position(p_coupon_ids, p_coupon_ids[k], k + 1) IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = format('%s: a coupon id given twice', p_fn);
    ELSIF p_trace_parents[k] IS NOT NULL
          -- 00-<32 hex>-<16 hex>-<2 hex>: 55 bytes, its dashes at 3, 36 and 53 and nowhere else.
          AND NOT (length(p_trace_parents[k]) = 55 AND substr(p_trace_parents[k], 36, 1) = '-'
                   AND substr(p_trace_parents[k], 53, 1) = '-' AND p_trace_parents[k] ~ '^00-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+$') THEN
      RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = format('%s: trace %L: want a W3C traceparent, 00-<32 hex>-<16 hex>-<2 hex>', p_fn, p_trace_parents[k]);
    END IF;
  END LOOP;
END
$$;
-- +goose StatementEnd

-- issue_clock's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION issue_clock(p_fn text, p_issued_at timestamptz[]) RETURNS timestamptz[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_now timestamptz := clock_timestamp();
  a     timestamptz;
BEGIN
  FOREACH a IN ARRAY p_issued_at LOOP
    IF a NOT BETWEEN v_now - issue_clock_skew() AND v_now + issue_clock_skew() THEN
      RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
        MESSAGE = format('%s: issue time %s is more than %s from the database''s clock (%s), which decides it',
                         p_fn, a, issue_clock_skew(), v_now);
    END IF;
  END LOOP;
  RETURN array_fill(v_now, ARRAY[cardinality(p_issued_at)]);
END
$$;
-- +goose StatementEnd

-- monthly_cap_yen's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION monthly_cap_yen() RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN (SELECT r.monthly_cap_yen FROM public.coupon_rules r);
END
$$;
-- +goose StatementEnd

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
