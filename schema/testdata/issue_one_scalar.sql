-- issue_coupon_scalar_fixture: a TEST FIXTURE, not production and not a migration. It is
-- issue_coupons_batch_v2 (schema/current/issue_coupons_batch_v2.sql, 00027) for a batch of one,
-- written the way a single-member body is written: one member as scalars, scalar INSERT ...
-- VALUES, one budget stripe statement on the quiet path, no arrays, no unnest, no per-member
-- loops. It takes the same locks in the same order (the coupon, the member's usage, a stripe;
-- coupon_rules' ACCESS SHARE and an audience row's FOR KEY SHARE before them) and calls the same
-- helpers (monthly_cap_yen, campaign_inactive_reason, release_next, release_room, release_share,
-- coupon_expiry). BenchmarkIssuanceBackendCPU runs it as the "scalar" variant, to tell what the
-- batch's array machinery costs a lone issuance from what the rules cost;
-- TestScalarFixtureAnswersAsBatchOfOne holds it to the batch's answers and rows.
--
-- Left out or written differently, and why:
-- - issuance_args_check and issue_clock take arrays: their checks are written here on the
--   scalars, with the same SQLSTATE (22023) and messages, and without the array shape checks
--   and the duplicate coupon id check, which one member cannot fail.
-- - The answer is OUT parameters of one record, not a table with the entry's index i.
-- - A member already holding a coupon is answered at once, before the audience row is locked
--   and the releases are read: the batch reads them for the other entries, and for this entry
--   they change no answer field.
-- - The batch's v_first (a member's later entries) and its stripe bookkeeping over several
--   stripes (v_taken, v_held above -1, takes of more than one coupon) have no case with one
--   member: its first stripe statement takes one coupon, and its waiting loop (v_held < 0) picks
--   a stripe at random each turn, as here.
CREATE FUNCTION issue_coupon_scalar_fixture(p_campaign_id text, p_coupon_id uuid, p_member_id text,
                                            p_issued_at timestamptz, p_cap_yen integer, p_trace_parent text,
                                            OUT result text, OUT coupon text, OUT amount integer, OUT reason text,
                                            OUT expires_at timestamptz, OUT next_release_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  v_amount   integer;
  v_starts   timestamptz;
  v_ends     timestamptz;
  v_paused   timestamptz;
  v_days     integer;
  v_until    timestamptz;
  v_audience boolean;
  v_releases boolean;
  v_released bigint;
  v_next     timestamptz;
  v_now      timestamptz;
  v_month    text;
  v_used     integer;
  v_stripe   smallint;
  v_done     boolean := false;
  r          record;
BEGIN
  -- issuance_args_check and issue_clock, on the scalars.
  IF p_campaign_id IS NULL OR length(p_campaign_id) NOT BETWEEN 1 AND 64 OR p_campaign_id ~ '[^A-Za-z0-9_-]' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('issue_coupon_scalar_fixture: campaign id %L: want 1-64 of [A-Za-z0-9_-]', p_campaign_id);
  ELSIF p_member_id IS NULL OR p_coupon_id IS NULL OR p_issued_at IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'issue_coupon_scalar_fixture: the member id, the coupon id and the issue time are required';
  ELSIF length(p_member_id) NOT BETWEEN 1 AND 128 OR p_member_id ~ '[^!-~]' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('issue_coupon_scalar_fixture: member id %L: want 1-128 bytes of visible ASCII (0x21-0x7E)', p_member_id);
  ELSIF p_trace_parent IS NOT NULL
        AND NOT (length(p_trace_parent) = 55 AND substr(p_trace_parent, 36, 1) = '-'
                 AND substr(p_trace_parent, 53, 1) = '-' AND p_trace_parent ~ '^00-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+$') THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('issue_coupon_scalar_fixture: trace %L: want a W3C traceparent, 00-<32 hex>-<16 hex>-<2 hex>', p_trace_parent);
  END IF;
  p_cap_yen := monthly_cap_yen();
  v_now := clock_timestamp(); -- after the cap's lock, as issue_clock reads it
  IF p_issued_at NOT BETWEEN v_now - issue_clock_skew() AND v_now + issue_clock_skew() THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('issue_coupon_scalar_fixture: issue time %s is more than %s from the database''s clock (%s), which decides it',
                       p_issued_at, issue_clock_skew(), v_now);
  END IF;
  p_issued_at := v_now;
  v_month := to_char(p_issued_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM');

  -- Reads: what the committed state already refuses.
  SELECT b.discount_yen, b.starts_at, b.ends_at, b.paused_at, b.coupon_valid_days, b.coupons_expire_at, b.audience_only, b.releases
    INTO v_amount, v_starts, v_ends, v_paused, v_days, v_until, v_audience, v_releases
    FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  IF NOT FOUND THEN
    result := 'UNKNOWN_CAMPAIGN';
    RETURN;
  END IF;
  SELECT c.coupon_id::text AS id, c.voided_at IS NOT NULL AS voided, c.expires_at AS exp INTO r
    FROM issued_coupons c WHERE c.campaign_id = p_campaign_id AND c.member_id = p_member_id
                            AND NOT c.legacy_duplicate AND NOT c.reissue_allowed;
  IF FOUND THEN
    result := CASE WHEN r.voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END; coupon := r.id; expires_at := r.exp;
    RETURN;
  END IF;
  IF v_audience THEN
    -- The member's audience row, held (FOR KEY SHARE) until the COMMIT, before every other lock.
    PERFORM FROM campaign_audience a WHERE a.campaign_id = p_campaign_id AND a.member_id = p_member_id FOR KEY SHARE;
    IF NOT FOUND THEN
      result := 'NOT_ELIGIBLE';
      RETURN;
    END IF;
  END IF;
  IF v_releases THEN
    SELECT coalesce(sum(cr.coupons) FILTER (WHERE cr.at <= p_issued_at), 0)
      INTO v_released FROM campaign_releases cr WHERE cr.campaign_id = p_campaign_id;
    v_next := release_next(p_campaign_id, p_issued_at, v_starts, v_ends, v_until);
  END IF;
  reason := coalesce(campaign_inactive_reason(v_starts, v_ends, v_paused, v_until, p_issued_at),
                     CASE WHEN v_released = 0 THEN 'NOT_STARTED' END);
  IF reason IS NOT NULL THEN
    result := 'CAMPAIGN_NOT_ACTIVE';
    next_release_at := CASE WHEN reason = 'NOT_STARTED' THEN v_next END;
    RETURN;
  END IF;
  SELECT mu.used_yen INTO v_used FROM member_monthly_usage mu WHERE mu.member_id = p_member_id AND mu.month = v_month;
  IF v_amount > p_cap_yen OR v_used + v_amount > p_cap_yen THEN
    result := 'MONTHLY_CAP';
    RETURN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM campaign_budgets s
                  WHERE s.campaign_id = p_campaign_id AND s.issued_yen + v_amount <= s.budget_yen
                    AND (NOT v_releases OR s.issued_yen / v_amount < release_share(v_released, s.stripe,
                           (SELECT count(*) FROM campaign_budgets c WHERE c.campaign_id = p_campaign_id)))) THEN
    result := 'BUDGET_EXCEEDED'; next_release_at := v_next;
    RETURN;
  END IF;

  -- 1. R2: the coupon; a conflict is a concurrent request of the member that committed its
  --    coupon while this insert waited.
  INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, expires_at)
  VALUES (p_coupon_id, p_campaign_id, p_member_id, v_month, v_amount, p_issued_at, coupon_expiry(p_issued_at, v_days, v_until))
  ON CONFLICT DO NOTHING;
  IF NOT FOUND THEN
    SELECT c.coupon_id::text AS id, c.voided_at IS NOT NULL AS voided, c.expires_at AS exp INTO r
      FROM issued_coupons c WHERE c.campaign_id = p_campaign_id AND c.member_id = p_member_id
                              AND NOT c.legacy_duplicate AND NOT c.reissue_allowed;
    result := CASE WHEN r.id IS NULL THEN 'RETRY' WHEN r.voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END;
    coupon := r.id; expires_at := r.exp;
    RETURN;
  END IF;

  -- 2. R3: the member x month row, created or added to within the cap.
  INSERT INTO member_monthly_usage AS mu (member_id, month, used_yen) VALUES (p_member_id, v_month, v_amount)
  ON CONFLICT (member_id, month) DO UPDATE SET used_yen = mu.used_yen + EXCLUDED.used_yen
   WHERE mu.used_yen + EXCLUDED.used_yen <= p_cap_yen;
  IF NOT FOUND THEN
    -- A concurrent issuance used the member's room this month: the coupon goes.
    DELETE FROM issued_coupons c WHERE c.coupon_id = p_coupon_id;
    result := 'MONTHLY_CAP';
    RETURN;
  END IF;

  -- 3. The transactional outbox row.
  INSERT INTO notification_outbox (coupon_id, member_id, created_at, trace_parent)
  VALUES (p_coupon_id, p_member_id, p_issued_at, p_trace_parent);

  -- 4. R1 and the campaign's state: a stripe with room that nobody holds, at random, locked and
  --    written in one statement (SKIP LOCKED waits for nobody, so the instant taken just before
  --    it is the write's).
  v_now := greatest(p_issued_at, clock_timestamp());
  WITH free AS (
    SELECT s.stripe FROM campaign_budgets s
     WHERE s.campaign_id = p_campaign_id AND s.issued_yen + v_amount <= s.budget_yen
       AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, v_now) IS NULL
       AND (NOT v_releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v_amount, v_now) > 0)
     ORDER BY random() LIMIT 1
       FOR UPDATE SKIP LOCKED)
  UPDATE campaign_budgets b SET issued_yen = b.issued_yen + v_amount
    FROM free
   WHERE b.campaign_id = p_campaign_id AND b.stripe = free.stripe;
  v_done := FOUND;
  WHILE NOT v_done LOOP
    -- Every stripe with room that nobody held is spent: wait for any, at random, so that lone
    -- waiters spread over the stripes; its holder may take the room meanwhile, then look again.
    SELECT s.stripe INTO v_stripe FROM campaign_budgets s
     WHERE s.campaign_id = p_campaign_id AND s.issued_yen + v_amount <= s.budget_yen
       AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, greatest(p_issued_at, clock_timestamp())) IS NULL
       AND (NOT v_releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v_amount, greatest(p_issued_at, clock_timestamp())) > 0)
     ORDER BY random() LIMIT 1;
    EXIT WHEN NOT FOUND;
    PERFORM FROM campaign_budgets s
     WHERE s.campaign_id = p_campaign_id AND s.stripe = v_stripe AND s.issued_yen + v_amount <= s.budget_yen
       AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, greatest(p_issued_at, clock_timestamp())) IS NULL
       AND (NOT v_releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v_amount, greatest(p_issued_at, clock_timestamp())) > 0)
       FOR UPDATE;
    CONTINUE WHEN NOT FOUND;
    UPDATE campaign_budgets SET issued_yen = issued_yen + v_amount
     WHERE campaign_id = p_campaign_id AND stripe = v_stripe;
    v_done := true;
  END LOOP;
  IF NOT v_done THEN
    -- Not placed: its rows go, and it is answered as the stripes say.
    SELECT campaign_inactive_reason(b.starts_at, b.ends_at, b.paused_at, b.coupons_expire_at, greatest(p_issued_at, clock_timestamp()))
      INTO reason FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
    IF v_releases THEN
      v_next := release_next(p_campaign_id, clock_timestamp(), v_starts, v_ends, v_until);
    END IF;
    DELETE FROM notification_outbox x WHERE x.coupon_id = p_coupon_id;
    UPDATE member_monthly_usage mu SET used_yen = mu.used_yen - v_amount WHERE mu.member_id = p_member_id AND mu.month = v_month;
    DELETE FROM issued_coupons c WHERE c.coupon_id = p_coupon_id;
    result := CASE WHEN reason IS NOT NULL THEN 'CAMPAIGN_NOT_ACTIVE'
                   WHEN EXISTS (SELECT 1 FROM campaign_budgets s WHERE s.campaign_id = p_campaign_id
                                   AND s.issued_yen + v_amount <= s.budget_yen
                                   AND (NOT v_releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v_amount, clock_timestamp()) > 0)) THEN 'RETRY'
                   ELSE 'BUDGET_EXCEEDED' END;
    next_release_at := CASE WHEN result = 'BUDGET_EXCEEDED' OR reason = 'NOT_STARTED' THEN v_next END;
    RETURN;
  END IF;
  result := 'ISSUED'; coupon := p_coupon_id::text; amount := v_amount;
  expires_at := coupon_expiry(p_issued_at, v_days, v_until);
END
$$;
