-- +goose Up
-- issue_coupons_batch, as 00015 made it (same arguments, answers and lock order), leaner for a
-- request alone, a batch of one (issue 29: a batch of one cost PostgreSQL about 1 core-ms more
-- than issue_coupon's own body of 00011; docs/performance.md, "One issuance path"). What it
-- spent, and what changed (each measured on a throwaway PostgreSQL, pg_stat_statements with
-- track = all, the batch of one beside 00011's body in turns):
--   * the member list's first entries and latest instant: one statement for a batch of several
--     (it was two), none for a batch of one;
--   * which entries the inserts wrote and kept: array_position on the RETURNING rows instead of a
--     hash join with the member list again;
--   * the look-ups that only a lost race needs (the pair's holder after an R2 conflict, the
--     coupons undone after an R3 conflict) run only when the insert wrote fewer rows than it tried;
--   * a stripe with room that nobody holds: locked and updated in one statement, as 00011's body
--     did (it was a SELECT ... FOR UPDATE SKIP LOCKED, then an UPDATE), judged at the instant
--     taken just before it (that statement never waits, so the instant is the write's), which
--     lets the planner inline campaign_inactive_reason instead of running it as a SQL function
--     per row;
--   * the loops over the entries kept and the answers: FOREACH and RETURN NEXT instead of a query
--     each.
-- The rules (R1-R3, voids, validity, the campaign's state) stay in this one body; issue_coupon and
-- grant_coupon (00014) stay its thin wrappers.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue issuances behind a long transaction

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

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
