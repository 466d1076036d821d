-- +goose Up
-- next_release_at names when more coupons open, never an instant they cannot: 00025 named the
-- first release after now, so a release before the campaign's start was announced although its
-- coupons open at the start (an app that came back then was refused again, and told no time), and
-- a release at or after the end, or after the coupons' fixed expiry (an end moved earlier with
-- `campaign update --ends`), was announced although it never opens (found trying issue 33 as a new
-- user). release_next is that rule, once; issue_coupons_batch_v2 and issue_dry_run call it where
-- they read the next release, and are otherwise 00025's. The previous release's entries answer no
-- next_release_at and are unchanged.
-- +goose StatementBegin
-- release_next's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
CREATE FUNCTION release_next(p_campaign_id text, p_now timestamptz, p_starts timestamptz, p_ends timestamptz, p_until timestamptz)
RETURNS timestamptz LANGUAGE sql STABLE SET search_path = public, pg_temp
RETURN (SELECT min(o.at) FROM (SELECT greatest(r.at, p_starts) AS at FROM campaign_releases r WHERE r.campaign_id = p_campaign_id) o
         WHERE o.at > p_now AND o.at < least(p_ends, p_until, 'infinity'));
-- +goose StatementEnd
REVOKE ALL ON FUNCTION release_next(text, timestamptz, timestamptz, timestamptz, timestamptz) FROM PUBLIC;
-- couponctl's campaign show, list and grant, and the console's pages, read the next release through
-- it (internal/ops/campaign, Status.NextReleaseAt), and the console's pages the audience's size,
-- which 00026 did not grant it (found merging issues 32 and 33).
GRANT EXECUTE ON FUNCTION release_next(text, timestamptz, timestamptz, timestamptz, timestamptz) TO coupon_admin, coupon_console;
GRANT SELECT ON campaign_audience TO coupon_console;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.issue_coupons_batch_v2(p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_issued_at timestamp with time zone[], p_cap_yen integer, p_trace_parents text[])
 RETURNS TABLE(i integer, result text, coupon text, amount integer, reason text, expires_at timestamp with time zone, next_release_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
  n          integer := cardinality(p_member_ids);
  v_amount   integer;
  v_starts   timestamptz;
  v_ends     timestamptz;
  v_paused   timestamptz;
  v_days     integer;
  v_until    timestamptz;
  v_audience boolean;       -- audience-only: only campaign_audience's members
  v_releases boolean;       -- coupons released on a schedule (campaign_releases)
  v_released bigint;        -- coupons released by the reads' time
  v_next     timestamptz;   -- the next release after it
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
  PERFORM issuance_args_check('issue_coupons_batch_v2', p_campaign_id, p_coupon_ids, p_member_ids, p_issued_at, p_trace_parents);
  p_cap_yen := monthly_cap_yen();
  p_issued_at := issue_clock('issue_coupons_batch_v2', p_issued_at);
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
  SELECT b.discount_yen, b.starts_at, b.ends_at, b.paused_at, b.coupon_valid_days, b.coupons_expire_at, b.audience_only, b.releases
    INTO v_amount, v_starts, v_ends, v_paused, v_days, v_until, v_audience, v_releases
    FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  IF NOT FOUND THEN
    FOR k IN 1 .. n LOOP
      i := k; result := 'UNKNOWN_CAMPAIGN'; coupon := NULL; amount := NULL; reason := NULL; expires_at := NULL; next_release_at := NULL;
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
  IF v_audience THEN
    -- Audience-only: each member's audience row, one index lookup, held (FOR KEY SHARE, in member
    -- order, before every other lock) until the COMMIT, so that a removal waits for the member's
    -- issuance in flight and none commits after it returns. No row: NOT_ELIGIBLE, nothing written.
    FOR r IN SELECT u.o FROM unnest(p_member_ids) WITH ORDINALITY AS u(m, o)
              WHERE v_res[u.o] IS NULL AND v_first[u.o] = u.o
                AND u.m NOT IN (SELECT a.member_id FROM campaign_audience a
                                 WHERE a.campaign_id = p_campaign_id AND a.member_id = ANY (p_member_ids)
                                 ORDER BY a.member_id FOR KEY SHARE) LOOP
      v_res[r.o] := 'NOT_ELIGIBLE';
    END LOOP;
  END IF;
  IF v_releases THEN
    -- Released coupons: what the schedule has released by the reads' time, and the next release.
    SELECT coalesce(sum(cr.coupons) FILTER (WHERE cr.at <= v_latest), 0)
      INTO v_released FROM campaign_releases cr WHERE cr.campaign_id = p_campaign_id;
    v_next := release_next(p_campaign_id, v_latest, v_starts, v_ends, v_until);
  END IF;
  FOR k IN 1 .. n LOOP
    CONTINUE WHEN v_res[k] IS NOT NULL OR v_first[k] <> k;
    v_rsn[k] := coalesce(campaign_inactive_reason(v_starts, v_ends, v_paused, v_until, p_issued_at[k]),
                         CASE WHEN v_released = 0 THEN 'NOT_STARTED' END);
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
                  WHERE s.campaign_id = p_campaign_id AND s.issued_yen + v_amount <= s.budget_yen
                    AND (NOT v_releases OR s.issued_yen / v_amount < release_share(v_released, s.stripe,
                           (SELECT count(*) FROM campaign_budgets c WHERE c.campaign_id = p_campaign_id)))) THEN
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
      SELECT s.stripe, least((s.budget_yen - s.issued_yen) / v_amount, cardinality(v_left),
                             CASE WHEN v_releases THEN release_room(p_campaign_id, s.stripe, s.issued_yen / v_amount, v_now) END) AS take
        FROM campaign_budgets s
       WHERE s.campaign_id = p_campaign_id AND s.stripe <> ALL (v_taken) AND s.issued_yen + v_amount <= s.budget_yen
         AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, v_now) IS NULL
         AND (NOT v_releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v_amount, v_now) > 0)
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
       AND (NOT v_releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v_amount, greatest(v_latest, clock_timestamp())) > 0)
     ORDER BY CASE WHEN v_held < 0 THEN random() ELSE s.stripe END LIMIT 1;
    EXIT WHEN NOT FOUND;
    SELECT least((s.budget_yen - s.issued_yen) / v_amount,
                 CASE WHEN v_releases THEN release_room(p_campaign_id, s.stripe, s.issued_yen / v_amount, greatest(v_latest, clock_timestamp())) END)
      INTO v_room FROM campaign_budgets s
     WHERE s.campaign_id = p_campaign_id AND s.stripe = v_stripe AND s.issued_yen + v_amount <= s.budget_yen
       AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, greatest(v_latest, clock_timestamp())) IS NULL
       AND (NOT v_releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v_amount, greatest(v_latest, clock_timestamp())) > 0)
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
    IF v_releases THEN
      v_next := release_next(p_campaign_id, clock_timestamp(), v_starts, v_ends, v_until);
    END IF;
    DELETE FROM notification_outbox x USING unnest(v_left) AS o WHERE x.coupon_id = p_coupon_ids[o];
    UPDATE member_monthly_usage mu SET used_yen = mu.used_yen - v_amount
      FROM unnest(v_left) AS o
     WHERE mu.member_id = p_member_ids[o] AND mu.month = to_char(p_issued_at[o] AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM');
    DELETE FROM issued_coupons c USING unnest(v_left) AS o WHERE c.coupon_id = p_coupon_ids[o];
    FOR k IN SELECT o FROM unnest(v_left) AS o LOOP
      v_rsn[k] := v_reason;
      v_res[k] := CASE WHEN v_reason IS NOT NULL THEN 'CAMPAIGN_NOT_ACTIVE'
                       WHEN EXISTS (SELECT 1 FROM campaign_budgets s WHERE s.campaign_id = p_campaign_id
                                       AND s.issued_yen + v_amount <= s.budget_yen
                                       AND (NOT v_releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v_amount, clock_timestamp()) > 0)) THEN 'RETRY'
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
    next_release_at := CASE WHEN v_res[k] = 'BUDGET_EXCEEDED' OR v_rsn[k] = 'NOT_STARTED' THEN v_next END;
    RETURN NEXT;
  END LOOP;
END
$function$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.issue_dry_run(p_campaign_id text, p_member_id text)
 RETURNS TABLE(result text, coupon text, amount integer, reason text, expires_at timestamp with time zone, remaining_coupons integer, next_release_at timestamp with time zone)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  v_now      timestamptz := clock_timestamp();
  v_first    campaign_budgets;
  v_released bigint;
  v_k        bigint;
  v_used     integer;
  v_voided   boolean;
BEGIN
  IF p_campaign_id IS NULL OR p_campaign_id !~ '^[A-Za-z0-9_-]{1,64}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = format('issue_dry_run: campaign id %L: want 1-64 of [A-Za-z0-9_-]', p_campaign_id);
  ELSIF p_member_id IS NULL OR length(p_member_id) NOT BETWEEN 1 AND 128 OR p_member_id ~ '[^!-~]' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('issue_dry_run: member id %L: want 1-128 bytes of visible ASCII (0x21-0x7E)', p_member_id);
  END IF;
  SELECT * INTO v_first FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  IF NOT FOUND THEN
    result := 'UNKNOWN_CAMPAIGN';
    RETURN NEXT;
    RETURN;
  END IF;
  SELECT c.coupon_id::text, c.voided_at IS NOT NULL, c.expires_at INTO coupon, v_voided, expires_at
    FROM issued_coupons c
   WHERE c.campaign_id = p_campaign_id AND c.member_id = p_member_id AND NOT c.legacy_duplicate AND NOT c.reissue_allowed;
  IF FOUND THEN
    result := CASE WHEN v_voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END;
    RETURN NEXT;
    RETURN;
  END IF;
  IF v_first.audience_only AND NOT EXISTS (SELECT 1 FROM campaign_audience a WHERE a.campaign_id = p_campaign_id AND a.member_id = p_member_id) THEN
    result := 'NOT_ELIGIBLE';
    RETURN NEXT;
    RETURN;
  END IF;
  IF v_first.releases THEN
    SELECT coalesce(sum(r.coupons) FILTER (WHERE r.at <= v_now), 0)
      INTO v_released FROM campaign_releases r WHERE r.campaign_id = p_campaign_id;
    next_release_at := release_next(p_campaign_id, v_now, v_first.starts_at, v_first.ends_at, v_first.coupons_expire_at);
  END IF;
  reason := coalesce(campaign_inactive_reason(v_first.starts_at, v_first.ends_at, v_first.paused_at, v_first.coupons_expire_at, v_now),
                     CASE WHEN v_released = 0 THEN 'NOT_STARTED' END);
  IF reason IS NOT NULL THEN
    result := 'CAMPAIGN_NOT_ACTIVE';
    next_release_at := CASE WHEN reason = 'NOT_STARTED' THEN next_release_at END;
    RETURN NEXT;
    RETURN;
  END IF;
  SELECT mu.used_yen INTO v_used FROM member_monthly_usage mu
   WHERE mu.member_id = p_member_id AND mu.month = to_char(v_now AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM');
  IF coalesce(v_used, 0) + v_first.discount_yen > (SELECT r.monthly_cap_yen FROM coupon_rules r) THEN
    result := 'MONTHLY_CAP';
    next_release_at := NULL;
    RETURN NEXT;
    RETURN;
  END IF;
  SELECT count(*) INTO v_k FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id;
  SELECT coalesce(sum(greatest(0, least((s.budget_yen - s.issued_yen) / s.discount_yen,
                                        CASE WHEN v_first.releases THEN release_share(v_released, s.stripe, v_k) - s.issued_yen / s.discount_yen END))), 0)
    INTO remaining_coupons FROM campaign_budgets s WHERE s.campaign_id = p_campaign_id;
  IF remaining_coupons = 0 THEN
    result := 'BUDGET_EXCEEDED';
  ELSE
    result := 'AVAILABLE'; amount := v_first.discount_yen; expires_at := coupon_expiry(v_now, v_first.coupon_valid_days, v_first.coupons_expire_at);
  END IF;
  RETURN NEXT;
END
$function$;
-- +goose StatementEnd

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
