-- +goose Up
-- One hot campaign beyond one row's commit (docs/design.md, "Coalescing a hot campaign"):
-- IssueCoupon coalesces the requests for one campaign that arrive while a call for it is in
-- flight into one call of issue_coupons_batch, so that a batch of members pays one COMMIT (one WAL
-- flush, one synchronous replication round trip) and one budget stripe write for all of them.
--
-- issue_coupons_batch is the previous release's wrapper of issue_coupons_batch_v2 since 00025,
-- which holds the rules, the answers and the lock order this migration wrote here: each
-- function's contract is its COMMENT ON FUNCTION, printed above it in schema/current/.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue readers behind a long transaction

-- +goose StatementBegin
CREATE FUNCTION issue_coupons_batch(
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
  v_reason   text;
  v_res      text[];
  v_cpn      text[];
  v_rsn      text[];
  v_exp      timestamptz[];
  v_first    integer[];     -- the first entry of each entry's member
  v_written  integer[];     -- entries whose coupon was inserted, member order
  v_kept     integer[];     -- entries whose usage was added too
  v_need     integer;
  v_take     integer;
  v_held     smallint := -1; -- the highest stripe held
  v_taken    smallint[] := '{}';
  v_stripe   smallint;
  v_room     integer;
  v_left     integer[];     -- entries still without a stripe, member order
  r          record;
  k          integer;
BEGIN
  IF p_campaign_id IS NULL OR p_cap_yen IS NULL OR p_cap_yen <= 0 OR n IS NULL
     OR cardinality(p_coupon_ids) IS DISTINCT FROM n OR cardinality(p_issued_at) IS DISTINCT FROM n
     OR cardinality(p_trace_parents) IS DISTINCT FROM n
     OR array_position(p_member_ids, NULL) IS NOT NULL OR array_position(p_coupon_ids, NULL) IS NOT NULL
     OR array_position(p_issued_at, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'issue_coupons_batch: one id, coupon id, issue time and trace per member, and a positive cap in yen';
  END IF;
  v_res := array_fill(NULL::text, ARRAY[n]);
  v_cpn := v_res; v_rsn := v_res;
  v_exp := array_fill(NULL::timestamptz, ARRAY[n]);
  SELECT array_agg(f ORDER BY o) INTO v_first
    FROM (SELECT u.o, min(u.o) OVER (PARTITION BY u.m) AS f FROM unnest(p_member_ids) WITH ORDINALITY AS u(m, o)) x;
  SELECT max(a) INTO v_latest FROM unnest(p_issued_at) AS a;

  -- Reads: what the committed state already refuses.
  SELECT b.discount_yen, b.starts_at, b.ends_at, b.paused_at, b.coupon_valid_days, b.coupons_expire_at
    INTO v_amount, v_starts, v_ends, v_paused, v_days, v_until
    FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  IF NOT FOUND THEN
    RETURN QUERY SELECT g, 'UNKNOWN_CAMPAIGN', NULL::text, NULL::integer, NULL::text, NULL::timestamptz
      FROM generate_series(1, n) g;
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
    v_rsn[k] := campaign_inactive_reason(v_starts, v_ends, v_paused, p_issued_at[k]);
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
    RETURNING c.coupon_id, c.member_id, c.expires_at)
  SELECT array_agg(u.o ORDER BY u.m) INTO v_written
    FROM w JOIN unnest(p_coupon_ids, p_member_ids) WITH ORDINALITY AS u(cid, m, o) ON u.cid = w.coupon_id;
  v_written := coalesce(v_written, '{}');
  FOR r IN SELECT u.o, c.coupon_id::text AS id, c.voided_at IS NOT NULL AS voided, c.expires_at AS exp
             FROM unnest(p_member_ids) WITH ORDINALITY AS u(m, o)
             LEFT JOIN issued_coupons c ON c.campaign_id = p_campaign_id AND c.member_id = u.m
                                       AND NOT c.legacy_duplicate AND NOT c.reissue_allowed
            WHERE v_res[u.o] IS NULL AND v_first[u.o] = u.o AND u.o <> ALL (v_written) LOOP
    v_res[r.o] := CASE WHEN r.id IS NULL THEN 'RETRY' WHEN r.voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END;
    v_cpn[r.o] := r.id; v_exp[r.o] := r.exp;
  END LOOP;

  -- 2. R3: the member x month rows, in member order, each created or added to within the cap.
  WITH w AS (
    INSERT INTO member_monthly_usage AS mu (member_id, month, used_yen)
    SELECT p_member_ids[o], to_char(p_issued_at[o] AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), v_amount
      FROM unnest(v_written) AS o ORDER BY p_member_ids[o]
    ON CONFLICT (member_id, month) DO UPDATE SET used_yen = mu.used_yen + EXCLUDED.used_yen
     WHERE mu.used_yen + EXCLUDED.used_yen <= p_cap_yen
    RETURNING mu.member_id)
  SELECT array_agg(o ORDER BY p_member_ids[o]) INTO v_kept
    FROM unnest(v_written) AS o WHERE p_member_ids[o] IN (SELECT member_id FROM w);
  v_kept := coalesce(v_kept, '{}');
  -- A concurrent issuance used the member's room this month: its coupon goes.
  DELETE FROM issued_coupons c USING unnest(v_written) AS o
   WHERE o <> ALL (v_kept) AND c.coupon_id = p_coupon_ids[o];
  FOR k IN SELECT o FROM unnest(v_written) AS o WHERE o <> ALL (v_kept) LOOP
    v_res[k] := 'MONTHLY_CAP';
  END LOOP;

  -- 3. The transactional outbox rows.
  INSERT INTO notification_outbox (coupon_id, member_id, created_at, trace_parent)
  SELECT p_coupon_ids[o], p_member_ids[o], p_issued_at[o], p_trace_parents[o] FROM unnest(v_kept) AS o;

  -- 4. R1 and the campaign's state: the budget stripes, in stripe order, last.
  v_left := v_kept;
  WHILE cardinality(v_left) > 0 LOOP
    -- A stripe with room that nobody holds, one at a time (a FOR loop over the query would lock
    -- the rows it prefetches), in any order: SKIP LOCKED waits for nobody.
    SELECT s.stripe, (s.budget_yen - s.issued_yen) / v_amount INTO v_stripe, v_room FROM campaign_budgets s
     WHERE s.campaign_id = p_campaign_id AND s.stripe <> ALL (v_taken) AND s.issued_yen + v_amount <= s.budget_yen
       AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, greatest(v_latest, clock_timestamp())) IS NULL
     ORDER BY random() LIMIT 1
       FOR UPDATE SKIP LOCKED;
    EXIT WHEN NOT FOUND;
    v_take := least(v_room, cardinality(v_left));
    UPDATE campaign_budgets SET issued_yen = issued_yen + v_take * v_amount
     WHERE campaign_id = p_campaign_id AND stripe = v_stripe;
    v_taken := v_taken || v_stripe;
    v_held := greatest(v_held, v_stripe);
    v_left := v_left[v_take + 1 :];
  END LOOP;
  WHILE cardinality(v_left) > 0 LOOP
    -- Every stripe with room that nobody held is spent: wait for one above those held.
    SELECT s.stripe INTO v_stripe FROM campaign_budgets s
     WHERE s.campaign_id = p_campaign_id AND s.stripe > v_held AND s.issued_yen + v_amount <= s.budget_yen
       AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, greatest(v_latest, clock_timestamp())) IS NULL
     ORDER BY s.stripe LIMIT 1;
    EXIT WHEN NOT FOUND;
    SELECT (s.budget_yen - s.issued_yen) / v_amount INTO v_room FROM campaign_budgets s
     WHERE s.campaign_id = p_campaign_id AND s.stripe = v_stripe AND s.issued_yen + v_amount <= s.budget_yen
       AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, greatest(v_latest, clock_timestamp())) IS NULL
       FOR UPDATE;
    v_held := v_stripe;
    CONTINUE WHEN NOT FOUND; -- its holder took the room: look further up
    v_take := least(v_room, cardinality(v_left));
    UPDATE campaign_budgets SET issued_yen = issued_yen + v_take * v_amount
     WHERE campaign_id = p_campaign_id AND stripe = v_stripe;
    v_left := v_left[v_take + 1 :];
  END LOOP;
  IF cardinality(v_left) > 0 THEN
    -- Not placed: their rows go, and each is answered as the stripes say.
    SELECT campaign_inactive_reason(b.starts_at, b.ends_at, b.paused_at, greatest(v_latest, clock_timestamp()))
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
  FOR k IN SELECT o FROM unnest(v_kept) AS o WHERE o <> ALL (v_left) LOOP
    v_res[k] := 'ISSUED'; v_cpn[k] := p_coupon_ids[k]::text;
    v_exp[k] := coupon_expiry(p_issued_at[k], v_days, v_until);
  END LOOP;

  -- Later entries of a member answer as its first did.
  FOR k IN 1 .. n LOOP
    CONTINUE WHEN v_first[k] = k;
    v_res[k] := CASE v_res[v_first[k]] WHEN 'ISSUED' THEN 'ALREADY_ISSUED' ELSE v_res[v_first[k]] END;
    v_cpn[k] := v_cpn[v_first[k]]; v_rsn[k] := v_rsn[v_first[k]]; v_exp[k] := v_exp[v_first[k]];
  END LOOP;
  RETURN QUERY SELECT g, v_res[g], v_cpn[g], CASE WHEN v_res[g] = 'ISSUED' THEN v_amount END, v_rsn[g], v_exp[g]
    FROM generate_series(1, n) g;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION issue_coupons_batch(text, uuid[], text[], timestamptz[], integer, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION issue_coupons_batch(text, uuid[], text[], timestamptz[], integer, text[]) TO coupon_issue;

-- +goose Down
DROP FUNCTION issue_coupons_batch(text, uuid[], text[], timestamptz[], integer, text[]);
