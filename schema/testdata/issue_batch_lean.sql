-- issue_batch_lean: a TEST FIXTURE, not production and not a migration: a template of two bodies
-- of issue_coupons_batch_v2's rules (schema/current/issue_coupons_batch_v2.sql, 00027) for any
-- number of members, each written as lean as this project could write one, to learn how close a
-- body for n members can come to a body for one (testdata/issue_one_scalar.sql).
-- BenchmarkIssuanceBackendCPU runs them as the "lean-set" and "lean-per-member" variants;
-- TestLeanFixturesAnswerAsTheBatch holds both to the batch's answers and rows. Of the template's
-- placeholders, Stripes is the batch's stripe loops (R1), read from
-- schema/current/issue_coupons_batch_v3.sql at each run with its verdict's amount and kind as
-- v_amount and v_releases, and Members the
-- member phase (the reads, R2's and R3's writes) of one of them:
-- - issue_batch_lean_set.sql: set-based, as 00027 (one cursor over the members for the reads,
--   each write one statement over unnest);
-- - issue_batch_lean_per_member.sql: one statement per member, in member order in each phase.
-- The rest is 00027's body with less work in it, each change measured on its own
-- (docs/performance.md, "How close a body for n members comes to one for one member"):
-- - the argument checks as one expression over the arrays and a loop over the entries, calling
--   issuance_args_check and issue_clock only when one fails (for their messages), instead of two
--   calls each time;
-- - every entry at one instant, the database's clock, as issue_clock already made them: one
--   month, one expiry;
-- - the answers by RETURN NEXT from the arrays, a member's later entries as its first.
-- One difference in locks, never in answers: an audience-only campaign's audience rows are locked
-- for every member given, before the members' reads; 00027 locks those of members that hold no
-- coupon of it, after them. A member holding one is answered alike either way.
CREATE FUNCTION {{.Name}}(p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_issued_at timestamptz[], p_cap_yen integer, p_trace_parents text[])
RETURNS TABLE (i integer, result text, coupon text, amount integer, reason text, expires_at timestamptz,
               next_release_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_at       timestamptz;   -- the issue time of every entry: the database's clock (issue_clock)
  v_month    text;          -- its Asia/Tokyo month, R3's
  v_amount   integer;
  v_starts   timestamptz;
  v_ends     timestamptz;
  v_paused   timestamptz;
  v_days     integer;
  v_until    timestamptz;
  v_expiry   timestamptz;   -- an issued coupon's expiry
  v_audience boolean;       -- audience-only: only campaign_audience's members
  v_members  text[];        -- of those, the members of this call with an audience row
  v_releases boolean;       -- coupons released on a schedule (campaign_releases)
  v_released bigint;        -- coupons released by v_at
  v_next     timestamptz;   -- the next release after it
  v_now      timestamptz;
  v_reason   text;
  v_res      text[];        -- each member's first entry: its answer, NULL while still to be issued
  v_cpn      text[];
  v_rsn      text[];
  v_exp      timestamptz[];
  v_try      integer[];     -- entries the coupons' insert tries, member order
  v_written  integer[];     -- entries whose coupon was inserted, member order
  v_kept     integer[];     -- entries whose usage was added too
  v_take     integer;
  v_held     smallint := -1; -- the highest stripe held
  v_taken    smallint[] := '{}';
  v_stripe   smallint;
  v_room     integer;
  v_left     integer[];     -- entries still without a stripe, member order
  r          record;
  k          integer;
BEGIN
  IF p_campaign_id IS NULL OR length(p_campaign_id) NOT BETWEEN 1 AND 64 OR p_campaign_id ~ '[^A-Za-z0-9_-]'
     OR NOT (cardinality(p_member_ids) BETWEEN 1 AND issuance_batch_max()
             AND arg_array_fits(p_member_ids, cardinality(p_member_ids), false) AND arg_array_fits(p_coupon_ids, cardinality(p_member_ids), false)
             AND arg_array_fits(p_issued_at, cardinality(p_member_ids), false) AND arg_array_fits(p_trace_parents, cardinality(p_member_ids), true)) THEN
    PERFORM issuance_args_check('issue_coupons_batch_v2', p_campaign_id, p_coupon_ids, p_member_ids, p_issued_at, p_trace_parents);
  END IF;
  p_cap_yen := monthly_cap_yen();
  v_at := clock_timestamp();
  FOR k IN 1 .. cardinality(p_member_ids) LOOP
    IF length(p_member_ids[k]) NOT BETWEEN 1 AND 128 OR p_member_ids[k] ~ '[^!-~]'
       OR array_position(p_coupon_ids, p_coupon_ids[k], k + 1) IS NOT NULL
       OR (p_trace_parents[k] IS NOT NULL AND NOT (length(p_trace_parents[k]) = 55 AND substr(p_trace_parents[k], 36, 1) = '-'
                                                   AND substr(p_trace_parents[k], 53, 1) = '-' AND p_trace_parents[k] ~ '^00-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+$'))
       OR p_issued_at[k] NOT BETWEEN v_at - issue_clock_skew() AND v_at + issue_clock_skew() THEN
      PERFORM issuance_args_check('issue_coupons_batch_v2', p_campaign_id, p_coupon_ids, p_member_ids, p_issued_at, p_trace_parents);
      PERFORM issue_clock('issue_coupons_batch_v2', p_issued_at);
    END IF;
  END LOOP;
  v_month := to_char(v_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM');

  -- Reads: what the committed state already refuses.
  SELECT b.discount_yen, b.starts_at, b.ends_at, b.paused_at, b.coupon_valid_days, b.coupons_expire_at, b.audience_only, b.releases
    INTO v_amount, v_starts, v_ends, v_paused, v_days, v_until, v_audience, v_releases
    FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  IF NOT FOUND THEN
    RETURN QUERY SELECT u.o::integer, 'UNKNOWN_CAMPAIGN'::text, NULL::text, NULL::integer, NULL::text, NULL::timestamptz, NULL::timestamptz
                   FROM generate_series(1, cardinality(p_member_ids)) AS u(o);
    RETURN;
  END IF;
  IF v_audience THEN
    -- Audience-only: the members' audience rows, held (FOR KEY SHARE, in member order, before
    -- every other lock) until the COMMIT, so that a removal waits for the member's issuance in
    -- flight and none commits after it returns. No row: NOT_ELIGIBLE, nothing written.
    SELECT coalesce(array_agg(a.member_id), '{}') INTO v_members
      FROM (SELECT a.member_id FROM campaign_audience a
             WHERE a.campaign_id = p_campaign_id AND a.member_id = ANY (p_member_ids)
             ORDER BY a.member_id FOR KEY SHARE) a;
  END IF;
  IF v_releases THEN
    -- Released coupons: what the schedule has released by the reads' time, and the next release.
    SELECT coalesce(sum(cr.coupons) FILTER (WHERE cr.at <= v_at), 0)
      INTO v_released FROM campaign_releases cr WHERE cr.campaign_id = p_campaign_id;
    v_next := release_next(p_campaign_id, v_at, v_starts, v_ends, v_until);
  END IF;
  v_reason := coalesce(campaign_inactive_reason(v_starts, v_ends, v_paused, v_until, v_at),
                       CASE WHEN v_released = 0 THEN 'NOT_STARTED' END);
  v_expiry := coupon_expiry(v_at, v_days, v_until);
  v_res := array_fill(NULL::text, ARRAY[cardinality(p_member_ids)]);
  v_cpn := v_res; v_rsn := v_res;
  v_exp := array_fill(NULL::timestamptz, ARRAY[cardinality(p_member_ids)]);
{{.Members}}  -- 3. The transactional outbox rows.
  INSERT INTO notification_outbox (coupon_id, member_id, created_at, trace_parent)
  SELECT p_coupon_ids[t.e], p_member_ids[t.e], v_at, p_trace_parents[t.e] FROM unnest(v_kept) AS t(e);

{{.Stripes}}  IF cardinality(v_left) > 0 THEN
    -- Not placed: their rows go, and each is answered as the stripes say.
    SELECT campaign_inactive_reason(b.starts_at, b.ends_at, b.paused_at, b.coupons_expire_at, greatest(v_at, clock_timestamp()))
      INTO v_reason FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
    IF v_releases THEN
      v_next := release_next(p_campaign_id, clock_timestamp(), v_starts, v_ends, v_until);
    END IF;
    DELETE FROM notification_outbox x USING unnest(v_left) AS t(e) WHERE x.coupon_id = p_coupon_ids[t.e];
    UPDATE member_monthly_usage mu SET used_yen = mu.used_yen - v_amount
      FROM unnest(v_left) AS t(e)
     WHERE mu.member_id = p_member_ids[t.e] AND mu.month = v_month;
    DELETE FROM issued_coupons c USING unnest(v_left) AS t(e) WHERE c.coupon_id = p_coupon_ids[t.e];
    FOREACH k IN ARRAY v_left LOOP
      v_rsn[k] := v_reason;
      v_res[k] := CASE WHEN v_reason IS NOT NULL THEN 'CAMPAIGN_NOT_ACTIVE'
                       WHEN EXISTS (SELECT 1 FROM campaign_budgets s WHERE s.campaign_id = p_campaign_id
                                       AND s.issued_yen + v_amount <= s.budget_yen
                                       AND (NOT v_releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v_amount, clock_timestamp()) > 0)) THEN 'RETRY'
                       ELSE 'BUDGET_EXCEEDED' END;
    END LOOP;
  END IF;

  -- The answers: a member's first entry with no answer yet was issued; a later entry of a member
  -- answers as its first did (ISSUED as ALREADY_ISSUED).
  FOR k IN 1 .. cardinality(p_member_ids) LOOP
    i := array_position(p_member_ids, p_member_ids[k]);
    result := coalesce(v_res[i], 'ISSUED');
    coupon := CASE WHEN result = 'ISSUED' THEN p_coupon_ids[i]::text ELSE v_cpn[i] END;
    amount := CASE WHEN result = 'ISSUED' AND i = k THEN v_amount END;
    reason := v_rsn[i];
    expires_at := CASE WHEN result = 'ISSUED' THEN v_expiry ELSE v_exp[i] END;
    next_release_at := CASE WHEN result = 'BUDGET_EXCEEDED' OR reason = 'NOT_STARTED' THEN v_next END;
    IF result = 'ISSUED' AND i <> k THEN
      result := 'ALREADY_ISSUED';
    END IF;
    i := k;
    RETURN NEXT;
  END LOOP;
END
$$;
