-- +goose Up
-- The database alone holds R3's cap, the issue time and the shape of every issuance argument
-- (issue 30, items 2 and 3):
--   coupon_rules       the one row of rule settings: R3's monthly cap in yen, 2,000 (the member
--                      cap regulation) until an operator changes it with coupon_rules_set
--                      (`couponctl rules set`), which writes coupon_rules_changes. It was each
--                      client's MONTHLY_CAP_YEN: two instances could enforce two caps.
--   issue_coupons_batch reads the cap from coupon_rules and ignores its p_cap_yen (the previous
--                      release still passes its own), takes the issue time from the database's
--                      clock (refusing a caller's time more than issue_clock_skew() away), and
--                      refuses malformed arguments (issuance_args_check) with 22023: an array
--                      counted from 0 let one member be charged to others. grant_coupons_batch,
--                      issue_coupon and grant_coupon call it, so the same holds for each.
--   outbox_claim       refuses its malformed arguments (outbox_claim_args_check), a due time
--                      after the database's clock among them.
-- No function the previous release calls changes its arguments or its answers.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue issuances behind a long transaction

-- coupon_rules: the rule settings in force, one row (the key is always true). changed_at and
-- changed_by are the last change's; coupon_rules_changes keeps every change.
-- monthly_cap_yen is at most 1,000,000,000: issue_coupons_batch adds a coupon's yen to a
-- member's used_yen (at most the cap) before comparing, and a coupon above the cap is refused
-- before any sum, so the sum stays within PostgreSQL's integer.
CREATE TABLE coupon_rules (
  one             boolean PRIMARY KEY DEFAULT true CONSTRAINT one_row CHECK (one),
  monthly_cap_yen integer NOT NULL CONSTRAINT monthly_cap_range CHECK (monthly_cap_yen BETWEEN 1 AND 1000000000),
  changed_at      timestamptz NOT NULL DEFAULT now(),
  changed_by      text NOT NULL DEFAULT session_user
);
INSERT INTO coupon_rules (monthly_cap_yen) VALUES (2000);

-- coupon_rules_changes: the rule settings' history, oldest first by change_id; before and after
-- hold the settings changed ({} before the first row, which this migration writes).
CREATE TABLE coupon_rules_changes (
  change_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  changed_at timestamptz NOT NULL DEFAULT now(),
  changed_by text NOT NULL DEFAULT session_user,
  before     jsonb NOT NULL,
  after      jsonb NOT NULL,
  reason     text NOT NULL CONSTRAINT reason_given CHECK (btrim(reason) <> '')
);
INSERT INTO coupon_rules_changes (before, after, reason)
VALUES ('{}', '{"monthly_cap_yen": 2000}', 'migration 00021: R3''s cap moves from MONTHLY_CAP_YEN into the database, at its default');
GRANT SELECT ON coupon_rules, coupon_rules_changes TO coupon_admin;

-- monthly_cap_yen's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
CREATE FUNCTION monthly_cap_yen() RETURNS integer
LANGUAGE sql STABLE SET search_path = public, pg_temp
RETURN (SELECT r.monthly_cap_yen FROM coupon_rules r);
REVOKE ALL ON FUNCTION monthly_cap_yen() FROM PUBLIC;

-- coupon_rules_set, the form 00029 dropped; the form of 00026 holds its rules: its contract is its
-- COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION coupon_rules_set(p_monthly_cap_yen integer, p_reason text)
RETURNS SETOF coupon_rules_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
SET lock_timeout = '1s'
AS $$
DECLARE
  v_before integer;
  v_at     timestamptz;
BEGIN
  IF p_monthly_cap_yen IS NULL OR p_monthly_cap_yen NOT BETWEEN 1 AND 1000000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('a monthly cap of %s yen: want 1 to 1000000000', coalesce(p_monthly_cap_yen::text, 'NULL'));
  ELSIF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every change needs a reason (--reason TEXT)';
  END IF;
  LOCK TABLE coupon_rules IN ACCESS EXCLUSIVE MODE;
  SELECT r.monthly_cap_yen, clock_timestamp() INTO STRICT v_before, v_at FROM coupon_rules r;
  IF v_before = p_monthly_cap_yen THEN
    RETURN;
  END IF;
  UPDATE coupon_rules SET monthly_cap_yen = p_monthly_cap_yen, changed_at = v_at, changed_by = session_user;
  RETURN QUERY INSERT INTO coupon_rules_changes (changed_at, before, after, reason)
    VALUES (v_at, jsonb_build_object('monthly_cap_yen', v_before),
            jsonb_build_object('monthly_cap_yen', p_monthly_cap_yen), p_reason)
    RETURNING *;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION coupon_rules_set(integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coupon_rules_set(integer, text) TO coupon_admin;

-- issue_clock_skew's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
CREATE FUNCTION issue_clock_skew() RETURNS interval LANGUAGE sql IMMUTABLE RETURN interval '5 seconds';

-- issuance_batch_max's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
CREATE FUNCTION issuance_batch_max() RETURNS integer LANGUAGE sql IMMUTABLE RETURN 128;

-- arg_array_check's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION arg_array_check(p_fn text, p_name text, p_arr anyarray, p_n integer, p_nulls_ok boolean)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF p_arr IS NULL OR array_ndims(p_arr) IS DISTINCT FROM 1 OR array_lower(p_arr, 1) <> 1 OR cardinality(p_arr) <> p_n THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: %s is %s: want one dimension, %s elements, from index 1 ([1:%s])',
                       p_fn, p_name, coalesce(array_dims(p_arr), 'NULL or empty'), p_n, p_n);
  ELSIF NOT p_nulls_ok AND array_position(p_arr, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: %s holds a NULL at index %s', p_fn, p_name, array_position(p_arr, NULL));
  END IF;
END
$$;
-- +goose StatementEnd

-- issuance_args_check's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION issuance_args_check(p_fn text, p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[],
  p_issued_at timestamptz[], p_trace_parents text[])
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  n     integer := coalesce(cardinality(p_member_ids), 0);
  v_bad text;
BEGIN
  IF p_campaign_id IS NULL OR p_campaign_id !~ '^[A-Za-z0-9_-]{1,64}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: campaign id %L: want 1-64 of [A-Za-z0-9_-]', p_fn, p_campaign_id);
  ELSIF n NOT BETWEEN 1 AND issuance_batch_max() THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: %s members: want 1 to %s', p_fn, n, issuance_batch_max());
  END IF;
  PERFORM arg_array_check(p_fn, 'p_member_ids', p_member_ids, n, false);
  PERFORM arg_array_check(p_fn, 'p_coupon_ids', p_coupon_ids, n, false);
  PERFORM arg_array_check(p_fn, 'p_issued_at', p_issued_at, n, false);
  PERFORM arg_array_check(p_fn, 'p_trace_parents', p_trace_parents, n, true);
  SELECT m INTO v_bad FROM unnest(p_member_ids) m WHERE m !~ '^[!-~]{1,128}$' LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: member id %L: want 1-128 bytes of visible ASCII (0x21-0x7E)', p_fn, v_bad);
  END IF;
  IF (SELECT count(DISTINCT c) FROM unnest(p_coupon_ids) c) <> n THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = format('%s: a coupon id given twice', p_fn);
  END IF;
  SELECT t INTO v_bad FROM unnest(p_trace_parents) t WHERE t !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: trace %L: want a W3C traceparent, 00-<32 hex>-<16 hex>-<2 hex>', p_fn, v_bad);
  END IF;
END
$$;
-- +goose StatementEnd

-- issue_clock's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION issue_clock(p_fn text, p_issued_at timestamptz[]) RETURNS timestamptz[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_now timestamptz := clock_timestamp();
  v_bad timestamptz;
BEGIN
  SELECT a INTO v_bad FROM unnest(p_issued_at) a
   WHERE a NOT BETWEEN v_now - issue_clock_skew() AND v_now + issue_clock_skew() LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: issue time %s is more than %s from the database''s clock (%s), which decides it',
                       p_fn, v_bad, issue_clock_skew(), v_now);
  END IF;
  RETURN array_fill(v_now, ARRAY[cardinality(p_issued_at)]);
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION issue_clock_skew(), issuance_batch_max(), arg_array_check(text, text, anyarray, integer, boolean),
  issuance_args_check(text, text, uuid[], text[], timestamptz[], text[]), issue_clock(text, timestamptz[]) FROM PUBLIC;

-- issue_coupons_batch, as 00020 made it (same arguments and answers), its argument check, its
-- cap and its clock replaced by the three lines after BEGIN, in this order: the cap's read is the
-- call's first lock (coupon_rules_set), the clock comes after it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION issue_coupons_batch(
  p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_issued_at timestamptz[],
  p_cap_yen integer, p_trace_parents text[])
RETURNS TABLE (i integer, result text, coupon text, amount integer, reason text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  n          integer := cardinality(p_member_ids);
  v_amount   integer;
  v_starts   timestamptz;
  v_ends     timestamptz;
  v_paused   timestamptz;
  v_days     integer;
  v_until    timestamptz;
  v_latest   timestamptz;
  v_now      timestamptz;
  v_reason   text;
  v_res      text[];
  v_cpn      text[];
  v_rsn      text[];
  v_exp      timestamptz[];
  v_first    integer[];     -- the first entry of each entry's member
  v_written  integer[];     -- entries whose coupon was inserted, member order
  v_kept     integer[];     -- entries whose usage was added too
  v_tried    integer := 0;
  v_take     integer;
  v_held     smallint := -1; -- the highest stripe held
  v_taken    smallint[] := '{}';
  v_stripe   smallint;
  v_room     integer;
  v_left     integer[];     -- entries still without a stripe, member order
  r          record;
  k          integer;
BEGIN
  PERFORM issuance_args_check('issue_coupons_batch', p_campaign_id, p_coupon_ids, p_member_ids, p_issued_at, p_trace_parents);
  p_cap_yen := monthly_cap_yen();
  p_issued_at := issue_clock('issue_coupons_batch', p_issued_at);
  v_res := array_fill(NULL::text, ARRAY[n]);
  v_cpn := v_res; v_rsn := v_res;
  v_exp := array_fill(NULL::timestamptz, ARRAY[n]);
  IF n = 1 THEN
    v_first := '{1}'; v_latest := p_issued_at[1];
  ELSE
    SELECT array_agg(x.f ORDER BY x.o), max(x.a) INTO v_first, v_latest
      FROM (SELECT u.o, u.a, min(u.o) OVER (PARTITION BY u.m) AS f
              FROM unnest(p_member_ids, p_issued_at) WITH ORDINALITY AS u(m, a, o)) x;
  END IF;

  -- Reads: what the committed state already refuses.
  SELECT b.discount_yen, b.starts_at, b.ends_at, b.paused_at, b.coupon_valid_days, b.coupons_expire_at
    INTO v_amount, v_starts, v_ends, v_paused, v_days, v_until
    FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  IF NOT FOUND THEN
    FOR k IN 1 .. n LOOP
      i := k; result := 'UNKNOWN_CAMPAIGN'; coupon := NULL; amount := NULL; reason := NULL; expires_at := NULL;
      RETURN NEXT;
    END LOOP;
    RETURN;
  END IF;
  FOR r IN SELECT u.o, c.coupon_id::text AS id, c.voided_at IS NOT NULL AS voided, c.expires_at AS exp
             FROM unnest(p_member_ids) WITH ORDINALITY AS u(m, o)
             JOIN issued_coupons c ON c.campaign_id = p_campaign_id AND c.member_id = u.m
                                  AND NOT c.legacy_duplicate AND NOT c.reissue_allowed LOOP
    v_res[r.o] := CASE WHEN r.voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END;
    v_cpn[r.o] := r.id; v_exp[r.o] := r.exp;
  END LOOP;
  FOR k IN 1 .. n LOOP
    CONTINUE WHEN v_res[k] IS NOT NULL OR v_first[k] <> k;
    v_rsn[k] := campaign_inactive_reason(v_starts, v_ends, v_paused, v_until, p_issued_at[k]);
    IF v_rsn[k] IS NOT NULL THEN
      v_res[k] := 'CAMPAIGN_NOT_ACTIVE';
    ELSIF v_amount > p_cap_yen THEN
      v_res[k] := 'MONTHLY_CAP';
    END IF;
  END LOOP;
  FOR r IN SELECT u.o FROM unnest(p_member_ids, p_issued_at) WITH ORDINALITY AS u(m, a, o)
             JOIN member_monthly_usage mu ON mu.member_id = u.m AND mu.month = to_char(u.a AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM')
            WHERE v_res[u.o] IS NULL AND v_first[u.o] = u.o AND mu.used_yen + v_amount > p_cap_yen LOOP
    v_res[r.o] := 'MONTHLY_CAP';
  END LOOP;
  IF NOT EXISTS (SELECT 1 FROM campaign_budgets s
                  WHERE s.campaign_id = p_campaign_id AND s.issued_yen + v_amount <= s.budget_yen) THEN
    FOR k IN 1 .. n LOOP
      IF v_res[k] IS NULL AND v_first[k] = k THEN v_res[k] := 'BUDGET_EXCEEDED'; END IF;
    END LOOP;
  END IF;
  FOR k IN 1 .. n LOOP -- the entries the coupons' insert tries
    IF v_res[k] IS NULL AND v_first[k] = k THEN v_tried := v_tried + 1; END IF;
  END LOOP;

  -- 1. R2: the coupons, in member order; a conflict is a concurrent request of the member that
  --    committed its coupon while this insert waited.
  WITH w AS (
    INSERT INTO issued_coupons AS c (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, expires_at)
    SELECT u.cid, p_campaign_id, u.m, to_char(u.a AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), v_amount, u.a,
           coupon_expiry(u.a, v_days, v_until)
      FROM unnest(p_member_ids, p_coupon_ids, p_issued_at) WITH ORDINALITY AS u(m, cid, a, o)
     WHERE v_res[u.o] IS NULL AND v_first[u.o] = u.o
     ORDER BY u.m
    ON CONFLICT DO NOTHING
    RETURNING c.coupon_id, c.member_id)
  SELECT coalesce(array_agg(array_position(p_coupon_ids, w.coupon_id) ORDER BY w.member_id), '{}') INTO v_written FROM w;
  IF cardinality(v_written) < v_tried THEN
    -- Some insert met a coupon of its pair: read who holds it.
    FOR r IN SELECT u.o, c.coupon_id::text AS id, c.voided_at IS NOT NULL AS voided, c.expires_at AS exp
               FROM unnest(p_member_ids) WITH ORDINALITY AS u(m, o)
               LEFT JOIN issued_coupons c ON c.campaign_id = p_campaign_id AND c.member_id = u.m
                                         AND NOT c.legacy_duplicate AND NOT c.reissue_allowed
              WHERE v_res[u.o] IS NULL AND v_first[u.o] = u.o AND u.o <> ALL (v_written) LOOP
      v_res[r.o] := CASE WHEN r.id IS NULL THEN 'RETRY' WHEN r.voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END;
      v_cpn[r.o] := r.id; v_exp[r.o] := r.exp;
    END LOOP;
  END IF;

  -- 2. R3: the member x month rows, in member order, each created or added to within the cap.
  WITH w AS (
    INSERT INTO member_monthly_usage AS mu (member_id, month, used_yen)
    SELECT p_member_ids[o], to_char(p_issued_at[o] AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), v_amount
      FROM unnest(v_written) AS o ORDER BY p_member_ids[o]
    ON CONFLICT (member_id, month) DO UPDATE SET used_yen = mu.used_yen + EXCLUDED.used_yen
     WHERE mu.used_yen + EXCLUDED.used_yen <= p_cap_yen
    RETURNING mu.member_id)
  -- (The first entry of a member is the one written.)
  SELECT coalesce(array_agg(array_position(p_member_ids, w.member_id) ORDER BY w.member_id), '{}') INTO v_kept FROM w;
  IF cardinality(v_kept) < cardinality(v_written) THEN
    -- A concurrent issuance used the member's room this month: its coupon goes.
    DELETE FROM issued_coupons c USING unnest(v_written) AS o
     WHERE o <> ALL (v_kept) AND c.coupon_id = p_coupon_ids[o];
    FOREACH k IN ARRAY v_written LOOP
      CONTINUE WHEN k = ANY (v_kept);
      v_res[k] := 'MONTHLY_CAP';
    END LOOP;
  END IF;

  -- 3. The transactional outbox rows.
  INSERT INTO notification_outbox (coupon_id, member_id, created_at, trace_parent)
  SELECT p_coupon_ids[o], p_member_ids[o], p_issued_at[o], p_trace_parents[o] FROM unnest(v_kept) AS o;

  -- 4. R1 and the campaign's state: the budget stripes, in stripe order, last.
  v_left := v_kept;
  WHILE cardinality(v_left) > 0 LOOP
    -- A stripe with room that nobody holds, one at a time (a FOR loop over the query would lock
    -- the rows it prefetches), in any order, locked and written in one statement: SKIP LOCKED
    -- waits for nobody, so the instant taken just before it is the write's.
    v_now := greatest(v_latest, clock_timestamp());
    WITH free AS (
      SELECT s.stripe, least((s.budget_yen - s.issued_yen) / v_amount, cardinality(v_left)) AS take
        FROM campaign_budgets s
       WHERE s.campaign_id = p_campaign_id AND s.stripe <> ALL (v_taken) AND s.issued_yen + v_amount <= s.budget_yen
         AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, v_now) IS NULL
       ORDER BY random() LIMIT 1
         FOR UPDATE SKIP LOCKED)
    UPDATE campaign_budgets b SET issued_yen = b.issued_yen + free.take * v_amount
      FROM free
     WHERE b.campaign_id = p_campaign_id AND b.stripe = free.stripe
    RETURNING b.stripe, free.take INTO v_stripe, v_take;
    EXIT WHEN NOT FOUND;
    v_taken := v_taken || v_stripe;
    v_held := greatest(v_held, v_stripe);
    v_left := v_left[v_take + 1 :];
  END LOOP;
  WHILE cardinality(v_left) > 0 LOOP
    -- Every stripe with room that nobody held is spent: wait for one above those held, or, holding
    -- none (v_held < 0: a batch of one, mostly), for any, at random, so that lone waiters spread
    -- over the stripes instead of queueing on the lowest.
    SELECT s.stripe INTO v_stripe FROM campaign_budgets s
     WHERE s.campaign_id = p_campaign_id AND s.stripe > v_held AND s.issued_yen + v_amount <= s.budget_yen
       AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, greatest(v_latest, clock_timestamp())) IS NULL
     ORDER BY CASE WHEN v_held < 0 THEN random() ELSE s.stripe END LIMIT 1;
    EXIT WHEN NOT FOUND;
    SELECT (s.budget_yen - s.issued_yen) / v_amount INTO v_room FROM campaign_budgets s
     WHERE s.campaign_id = p_campaign_id AND s.stripe = v_stripe AND s.issued_yen + v_amount <= s.budget_yen
       AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, greatest(v_latest, clock_timestamp())) IS NULL
       FOR UPDATE;
    IF NOT FOUND THEN
      -- Its holder took the room, and the row was not locked: look further up, or, holding none,
      -- anywhere the committed state shows room.
      IF v_held >= 0 THEN
        v_held := v_stripe;
      END IF;
      CONTINUE;
    END IF;
    v_held := v_stripe;
    v_take := least(v_room, cardinality(v_left));
    UPDATE campaign_budgets SET issued_yen = issued_yen + v_take * v_amount
     WHERE campaign_id = p_campaign_id AND stripe = v_stripe;
    v_left := v_left[v_take + 1 :];
  END LOOP;
  IF cardinality(v_left) > 0 THEN
    -- Not placed: their rows go, and each is answered as the stripes say.
    SELECT campaign_inactive_reason(b.starts_at, b.ends_at, b.paused_at, b.coupons_expire_at, greatest(v_latest, clock_timestamp()))
      INTO v_reason FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
    DELETE FROM notification_outbox x USING unnest(v_left) AS o WHERE x.coupon_id = p_coupon_ids[o];
    UPDATE member_monthly_usage mu SET used_yen = mu.used_yen - v_amount
      FROM unnest(v_left) AS o
     WHERE mu.member_id = p_member_ids[o] AND mu.month = to_char(p_issued_at[o] AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM');
    DELETE FROM issued_coupons c USING unnest(v_left) AS o WHERE c.coupon_id = p_coupon_ids[o];
    FOR k IN SELECT o FROM unnest(v_left) AS o LOOP
      v_rsn[k] := v_reason;
      v_res[k] := CASE WHEN v_reason IS NOT NULL THEN 'CAMPAIGN_NOT_ACTIVE'
                       WHEN EXISTS (SELECT 1 FROM campaign_budgets s WHERE s.campaign_id = p_campaign_id
                                       AND s.issued_yen + v_amount <= s.budget_yen) THEN 'RETRY'
                       ELSE 'BUDGET_EXCEEDED' END;
    END LOOP;
  END IF;
  FOREACH k IN ARRAY v_kept LOOP
    CONTINUE WHEN k = ANY (v_left);
    v_res[k] := 'ISSUED'; v_cpn[k] := p_coupon_ids[k]::text;
    v_exp[k] := coupon_expiry(p_issued_at[k], v_days, v_until);
  END LOOP;

  -- Later entries of a member answer as its first did.
  FOR k IN 1 .. n LOOP
    CONTINUE WHEN v_first[k] = k;
    v_res[k] := CASE v_res[v_first[k]] WHEN 'ISSUED' THEN 'ALREADY_ISSUED' ELSE v_res[v_first[k]] END;
    v_cpn[k] := v_cpn[v_first[k]]; v_rsn[k] := v_rsn[v_first[k]]; v_exp[k] := v_exp[v_first[k]];
  END LOOP;
  FOR k IN 1 .. n LOOP
    i := k; result := v_res[k]; coupon := v_cpn[k]; amount := CASE WHEN v_res[k] = 'ISSUED' THEN v_amount END;
    reason := v_rsn[k]; expires_at := v_exp[k];
    RETURN NEXT;
  END LOOP;
END
$$;
-- +goose StatementEnd
-- outbox_claim_args_check's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION outbox_claim_args_check(p_limit integer, p_run uuid, p_lease interval, p_due_at timestamptz,
  p_key_window interval)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = format('outbox_claim: a limit of %s rows: want 1 to 1000', p_limit);
  ELSIF p_run IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'outbox_claim: the claiming run is required';
  ELSIF p_lease IS NULL OR p_lease <= interval '0' OR p_lease > interval '23 hours'
     OR p_key_window IS NULL OR p_key_window <= interval '0' OR p_key_window > interval '23 hours' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('outbox_claim: a lease of %s and a retry-key window of %s: want each above 0 and at most 23 hours', p_lease, p_key_window);
  ELSIF p_due_at IS NULL OR p_due_at > now() + issue_clock_skew() THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('outbox_claim: due at %s, after the database''s clock (%s)', p_due_at, now());
  END IF;
  RETURN true;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION outbox_claim_args_check(integer, uuid, interval, timestamptz, interval) FROM PUBLIC;

-- outbox_claim, as 00015 made it (same arguments and answers), gated on outbox_claim_args_check
-- in the UPDATE's WHERE: a condition on the arguments alone is a one-time filter at the top of
-- the plan, evaluated before any row is read (a LIMIT 0 included).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_claim(p_limit integer, p_run uuid, p_lease interval, p_due_at timestamptz,
  p_key_window interval)
RETURNS TABLE (coupon_id text, member_id text, attempts integer, campaign_id text, amount_yen integer,
  line_user_id text, key_expired boolean, prev_next_attempt_at timestamptz, prev_first_pushed_at timestamptz,
  trace_parent text, expires_at timestamptz, skip_reason text)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
  WITH due AS MATERIALIZED (
    SELECT o.coupon_id, o.member_id, o.next_attempt_at, o.first_pushed_at FROM notification_outbox o
     WHERE o.sent_at IS NULL AND o.parked_at IS NULL AND o.skipped_at IS NULL AND o.next_attempt_at <= p_due_at
     ORDER BY o.next_attempt_at
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  ), judged AS (
    SELECT due.coupon_id, due.next_attempt_at, due.first_pushed_at, i.campaign_id, i.amount_yen, i.expires_at,
           l.line_user_id,
           CASE WHEN i.voided_at IS NOT NULL THEN 'voided'
                WHEN i.expires_at <= now() + p_lease THEN 'expired'
                WHEN l.line_user_id IS NULL THEN 'no_line_account' END AS skip_reason
      FROM due JOIN issued_coupons i ON i.coupon_id = due.coupon_id
           LEFT JOIN member_line_accounts l ON l.member_id = due.member_id
  )
  UPDATE notification_outbox o
     SET next_attempt_at = CASE WHEN j.skip_reason IS NULL THEN now() + p_lease ELSE o.next_attempt_at END,
         claimed_by = CASE WHEN j.skip_reason IS NULL THEN p_run END,
         first_pushed_at = CASE WHEN j.skip_reason IS NULL THEN COALESCE(o.first_pushed_at, now()) ELSE o.first_pushed_at END,
         skipped_at = CASE WHEN j.skip_reason IS NOT NULL THEN now() END,
         skip_reason = j.skip_reason,
         last_error = CASE j.skip_reason
           WHEN 'voided' THEN 'skipped: the coupon was voided (couponctl coupon show)'
           WHEN 'expired' THEN 'skipped: the coupon expired before its push (couponctl coupon show)'
           WHEN 'no_line_account' THEN 'skipped: the member has no LINE account linked (couponctl line link, then outbox requeue)'
           ELSE o.last_error END
    FROM judged j
   WHERE outbox_claim_args_check(p_limit, p_run, p_lease, p_due_at, p_key_window) AND o.coupon_id = j.coupon_id
  RETURNING o.coupon_id::text, o.member_id, o.attempts, j.campaign_id, j.amount_yen, COALESCE(j.line_user_id, ''),
            j.skip_reason IS NULL AND COALESCE(o.first_pushed_at < now() - p_key_window, false),
            j.next_attempt_at, j.first_pushed_at, o.trace_parent, j.expires_at, j.skip_reason
$$;
-- +goose StatementEnd

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
