-- +goose Up
-- One judge, one clock (issue 39; the long form: docs/design.md, "One judge, one clock").
-- - The clock: issue_now() is the one instant the database reads; every function below that read
--   clock_timestamp() or now() reads it instead (a test replaces it to move the clock).
-- - The judge: campaign_judge (a campaign at an instant) and issue_judge (members of it, in the
--   refusal order) are the one statement of what a member would be answered; the issuance, the
--   dry run, grant's pre-check (grant_check) and the people's state (campaign_state) call them.
-- - The issuance's next name, issue_coupons_batch_v3 (and grant_coupons_batch_v3), takes no issue
--   time and no cap, which the database decides, and answers the month and the instant it
--   stamped; the _v2 names stay, same arguments and answers, as thin wrappers for the release
--   that calls them.
-- - The changes refuse, under the campaign's lock, what may not be done to an ended campaign.
-- - Every instant a function takes is finite and in range (instant_check).
SET LOCAL lock_timeout = '5s';

-- +goose StatementBegin
CREATE FUNCTION issue_now() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE
RETURN clock_timestamp();
-- +goose StatementEnd
COMMENT ON FUNCTION issue_now() IS
'The database''s clock: the one instant every function of this schema reads (issue times, months, '
'releases, periods, expiries, change stamps). clock_timestamp() in production; a test replaces '
'it (CREATE OR REPLACE) to move the clock. No argument, no error. Rule: shared CONTRACT "month" '
'(docs/api.md): the database, never a caller, decides the issue time.';

-- +goose StatementBegin
CREATE FUNCTION instant_in_range(p_at timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_at IS NULL OR (p_at >= '2000-01-01 00:00:00+09' AND p_at < '2200-01-01 00:00:00+09');
-- +goose StatementEnd
COMMENT ON FUNCTION instant_in_range(timestamptz) IS
'Whether p_at is an instant this schema holds: NULL, or finite and in [2000-01-01, 2200-01-01) '
'Asia/Tokyo (no infinity, no typo of a year far off). The range, stated once: instant_check and '
'the tables'' CHECK constraints (instants_in_range) call it.';

-- +goose StatementBegin
CREATE FUNCTION instant_check(p_fn text, p_name text, p_at timestamptz) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
  IF NOT instant_in_range(p_at) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: %s %s: want a finite instant from 2000-01-01 to before 2200-01-01 (Asia/Tokyo)', p_fn, p_name, p_at);
  END IF;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION instant_check(text, text, timestamptz) FROM PUBLIC;
COMMENT ON FUNCTION instant_check(text, text, timestamptz) IS
'Refuses an instant argument outside instant_in_range: p_fn names the function and p_name the '
'argument in the message. NULL passes (the callers say whether one is allowed). Errors: 22023 '
'invalid_parameter_value. Every function that takes an instant calls it first, so that the '
'database holds no instant a reader cannot show.';


-- +goose StatementBegin
CREATE TYPE campaign_verdict AS (
  campaign_id       text,
  discount_yen      integer,     -- one coupon's face value; NULL: no such campaign
  starts_at         timestamptz,
  ends_at           timestamptz,
  paused_at         timestamptz,
  coupon_valid_days integer,
  coupons_expire_at timestamptz,
  audience_only     boolean,
  releases          boolean,
  released          bigint,      -- coupons released by the instant (a campaign with releases)
  reason            text,        -- NOT_STARTED, ENDED, PAUSED: why it issues nothing; NULL: open
  remaining_coupons integer,     -- coupons its budget stripes can still issue at the instant
  next_release_at   timestamptz, -- when its releases open more coupons next (release_next)
  budget_yen        bigint,      -- the stripes' sums
  issued_yen        bigint,
  stripes           integer
);
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION campaign_judge(p_campaign_id text, p_at timestamptz) RETURNS SETOF campaign_verdict
LANGUAGE sql STABLE
BEGIN ATOMIC
  SELECT f.campaign_id, f.discount_yen, f.starts_at, f.ends_at, f.paused_at, f.coupon_valid_days, f.coupons_expire_at,
         f.audience_only, f.releases, r.released,
         coalesce(campaign_inactive_reason(f.starts_at, f.ends_at, f.paused_at, f.coupons_expire_at, p_at),
                  CASE WHEN r.released = 0 THEN 'NOT_STARTED' END),
         t.remaining::integer,
         CASE WHEN f.releases THEN release_next(p_campaign_id, p_at, f.starts_at, f.ends_at, f.coupons_expire_at) END,
         t.budget_yen, t.issued_yen, t.stripes::integer
    FROM campaign_budgets f
   CROSS JOIN LATERAL (SELECT CASE WHEN f.releases THEN
                                (SELECT coalesce(sum(cr.coupons) FILTER (WHERE cr.at <= p_at), 0)
                                   FROM campaign_releases cr WHERE cr.campaign_id = p_campaign_id) END AS released) r
   CROSS JOIN LATERAL (
     SELECT sum(s.budget_yen) AS budget_yen, sum(s.issued_yen) AS issued_yen, count(*) AS stripes,
            sum(greatest(0, least((s.budget_yen - s.issued_yen) / s.discount_yen,
                                  CASE WHEN f.releases THEN release_share(r.released, s.stripe, s.k) - s.issued_yen / s.discount_yen END))) AS remaining
       FROM (SELECT b.stripe, b.budget_yen, b.issued_yen, b.discount_yen, count(*) OVER () AS k
               FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id) s) t
   WHERE f.campaign_id = p_campaign_id AND f.stripe = 0;
END;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION campaign_judge(text, timestamptz) FROM PUBLIC;
COMMENT ON FUNCTION campaign_judge(text, timestamptz) IS
'Judges campaign p_campaign_id at instant p_at, from plain reads of the committed state (no '
'lock): one campaign_verdict row, none when the campaign does not exist. reason is why it '
'issues nothing then, in this order: ENDED (at or after ends_at or coupons_expire_at), PAUSED, '
'NOT_STARTED (before starts_at, or before its first release); NULL when open. remaining_coupons '
'is what its budget stripes can still issue at p_at (R1, and for a campaign with releases what '
'they have released so far, shared over the stripes by release_share), next_release_at when its '
'releases open more (release_next). One half of the one judge: issue_judge adds the members, '
'campaign_state reads it for people. docs/design.md, "One judge, one clock".';

-- +goose StatementBegin
CREATE FUNCTION issue_judge(v campaign_verdict, p_member_ids text[], p_at timestamptz, p_cap_yen integer)
RETURNS TABLE (i integer, result text, coupon text, amount integer, reason text, expires_at timestamptz,
               remaining_coupons integer, next_release_at timestamptz)
LANGUAGE sql STABLE
BEGIN ATOMIC
  SELECT m.k::integer, a.result,
         c.coupon_id::text,
         CASE WHEN a.result = 'AVAILABLE' THEN v.discount_yen END,
         CASE WHEN a.result = 'CAMPAIGN_NOT_ACTIVE' THEN v.reason END,
         CASE WHEN c.coupon_id IS NOT NULL THEN c.expires_at
              WHEN a.result = 'AVAILABLE' THEN coupon_expiry(p_at, v.coupon_valid_days, v.coupons_expire_at) END,
         CASE WHEN a.result IN ('AVAILABLE', 'BUDGET_EXCEEDED') THEN v.remaining_coupons END,
         CASE WHEN a.result IN ('AVAILABLE', 'BUDGET_EXCEEDED') OR a.result = 'CAMPAIGN_NOT_ACTIVE' AND v.reason = 'NOT_STARTED'
              THEN v.next_release_at END
    FROM unnest(p_member_ids) WITH ORDINALITY AS m(member_id, k)
    LEFT JOIN issued_coupons c
      ON c.campaign_id = v.campaign_id AND c.member_id = m.member_id AND NOT c.legacy_duplicate AND NOT c.reissue_allowed
    LEFT JOIN campaign_audience au
      ON v.audience_only AND au.campaign_id = v.campaign_id AND au.member_id = m.member_id
    LEFT JOIN member_monthly_usage mu
      ON v.reason IS NULL AND mu.member_id = m.member_id AND mu.month = to_char(p_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM')
   CROSS JOIN LATERAL (SELECT CASE
           WHEN v.discount_yen IS NULL THEN 'UNKNOWN_CAMPAIGN'
           WHEN c.coupon_id IS NOT NULL THEN CASE WHEN c.voided_at IS NOT NULL THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END
           WHEN v.audience_only AND au.member_id IS NULL THEN 'NOT_ELIGIBLE'
           WHEN v.reason IS NOT NULL THEN 'CAMPAIGN_NOT_ACTIVE'
           WHEN v.discount_yen > p_cap_yen - coalesce(mu.used_yen, 0) THEN 'MONTHLY_CAP'
           WHEN v.remaining_coupons = 0 THEN 'BUDGET_EXCEEDED'
           ELSE 'AVAILABLE' END AS result) a
   ORDER BY m.k;
END;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION issue_judge(campaign_verdict, text[], timestamptz, integer) FROM PUBLIC;
COMMENT ON FUNCTION issue_judge(campaign_verdict, text[], timestamptz, integer) IS
'The one judge of whether each member of p_member_ids may get a coupon of the campaign v '
'(campaign_judge at p_at, a row of NULLs when it does not exist) at p_at under R3''s cap '
'p_cap_yen, and why not: one row per entry (i from 1, a member given twice answered twice '
'alike), result AVAILABLE (with the amount and the expiry a coupon issued at p_at gets) or the '
'refusal, first that applies: UNKNOWN_CAMPAIGN; ALREADY_ISSUED or COUPON_VOIDED (R2, with the '
'coupon and its expiry); NOT_ELIGIBLE (audience-only); CAMPAIGN_NOT_ACTIVE (with the reason); '
'MONTHLY_CAP (R3: the member''s month would pass p_cap_yen yen); BUDGET_EXCEEDED (R1: no coupon '
'left now). remaining_coupons on AVAILABLE and BUDGET_EXCEEDED, next_release_at on those and on '
'NOT_STARTED. Plain reads, no lock, nothing written: the writes of issue_coupons_batch_v3 then '
'enforce R1-R3 on the rows they lock. docs/design.md, "One judge, one clock".';

-- +goose StatementBegin
CREATE FUNCTION campaign_state(p_campaign_id text, p_at timestamptz)
RETURNS TABLE (state text, reason text, opens_at timestamptz, next_release_at timestamptz, remaining_coupons integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
BEGIN
  IF p_at IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'campaign_state: the instant p_at is required (issue_now())';
  END IF;
  PERFORM instant_check('campaign_state', 'p_at', p_at);
  RETURN QUERY
  SELECT CASE v.reason
           WHEN 'ENDED' THEN CASE WHEN v.ends_at <= p_at THEN 'ENDED' ELSE 'EXPIRED' END
           WHEN 'PAUSED' THEN 'PAUSED'
           WHEN 'NOT_STARTED' THEN 'NOT_STARTED'
           ELSE CASE WHEN v.remaining_coupons > 0 THEN 'ACTIVE'
                     WHEN v.next_release_at IS NOT NULL THEN 'WAITING_RELEASE'
                     ELSE 'SOLD_OUT' END END,
         v.reason,
         CASE WHEN v.reason = 'NOT_STARTED' THEN CASE WHEN v.releases THEN v.next_release_at ELSE v.starts_at END END,
         v.next_release_at, v.remaining_coupons
    FROM campaign_judge(p_campaign_id, p_at) v;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION campaign_state(text, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION campaign_state(text, timestamptz) TO coupon_admin, coupon_console;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION release_next(p_campaign_id text, p_now timestamptz, p_starts timestamptz, p_ends timestamptz, p_until timestamptz)
RETURNS timestamptz LANGUAGE plpgsql STABLE SET search_path = public, pg_temp
AS $$
BEGIN
  PERFORM instant_check('release_next', 'p_now', p_now);
  PERFORM instant_check('release_next', 'p_starts', p_starts);
  PERFORM instant_check('release_next', 'p_ends', p_ends);
  PERFORM instant_check('release_next', 'p_until', p_until);
  RETURN (SELECT min(o.at) FROM (SELECT greatest(r.at, p_starts) AS at FROM campaign_releases r WHERE r.campaign_id = p_campaign_id) o
           WHERE o.at > p_now AND o.at < least(p_ends, p_until, 'infinity'));
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION campaign_state(text, timestamptz) IS
'Campaign p_campaign_id''s state for people at p_at, read from campaign_judge (the judgement the '
'issuance and the dry run use): ENDED (its end passed; 終了), EXPIRED (its coupons'' fixed '
'expiry passed, its end not; 有効期限切れ), PAUSED (一時停止中), NOT_STARTED (開始前; opens_at: '
'its start, or its first release), and, open: ACTIVE (発行中: coupons left), WAITING_RELEASE '
'(本日分終了: the released coupons are taken and next_release_at opens more), SOLD_OUT (完売). '
'reason is campaign_judge''s, remaining_coupons the coupons left at p_at. No row: no such '
'campaign. A read, no lock. Errors: 22023 for a p_at missing or out of range. couponctl campaign show/list and the console show it; no other '
'code derives a state.';

-- +goose StatementBegin
CREATE FUNCTION campaign_refuse_ended(p_first campaign_budgets, p_what text, p_at timestamptz) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
  IF campaign_inactive_reason(p_first.starts_at, p_first.ends_at, p_first.paused_at, p_first.coupons_expire_at, p_at) = 'ENDED' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s has ended, at %s: a %s does not reopen it; move its end first '
                       '(couponctl campaign update %s --ends T, or --coupons-expire T, --reason TEXT); nothing changed',
                       p_first.campaign_id, least(p_first.ends_at, p_first.coupons_expire_at), p_what, p_first.campaign_id);
  END IF;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION campaign_refuse_ended(campaign_budgets, text, timestamptz) FROM PUBLIC;
COMMENT ON FUNCTION campaign_refuse_ended(campaign_budgets, text, timestamptz) IS
'Refuses change p_what (its name, for the message) of the campaign whose stripe 0 is p_first if '
'the campaign has ended at p_at (campaign_inactive_reason: at or after its end or its coupons'' '
'fixed expiry): only a move of its end or of that expiry reopens it. Called by the change '
'functions after they lock the campaign, so that the judgement and the change see the same '
'row. Errors: CI422, naming the end and how to move it.';

-- +goose StatementBegin
CREATE FUNCTION issuance_args_check_v3(p_fn text, p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_trace_parents text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
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
             AND arg_array_fits(p_trace_parents, n, true)) THEN
    PERFORM arg_array_check(p_fn, 'p_member_ids', p_member_ids, n, false);
    PERFORM arg_array_check(p_fn, 'p_coupon_ids', p_coupon_ids, n, false);
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
REVOKE ALL ON FUNCTION issuance_args_check_v3(text, text, uuid[], text[], text[]) FROM PUBLIC;
COMMENT ON FUNCTION issuance_args_check_v3(text, text, uuid[], text[], text[]) IS
'Checks the arguments of an issuance call named p_fn: a campaign id of 1-64 [A-Za-z0-9_-]; 1 to '
'issuance_batch_max() members, each 1-128 bytes of visible ASCII; as many distinct coupon ids '
'and trace parents (each NULL or a W3C traceparent), every array one dimension from index 1 '
'without NULLs (trace parents may be NULL). Errors: 22023 invalid_parameter_value naming the '
'argument. Nothing read or written.';

-- +goose StatementBegin
CREATE FUNCTION issue_coupons_batch_v3(p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_trace_parents text[])
RETURNS TABLE (i integer, result text, coupon text, amount integer, reason text, expires_at timestamptz,
               next_release_at timestamptz, month text, issued_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
  n          integer := cardinality(p_member_ids);
  v_at       timestamptz;   -- the issue time: the database's clock as the call starts
  v_month    text;          -- R3's month: v_at's Asia/Tokyo calendar month
  v_cap      integer;       -- R3's cap, read after the lock on coupon_rules
  v          campaign_verdict; -- the judge's verdict on the campaign, as the call starts
  v_later    campaign_verdict; -- and again, for the members not placed
  v_now      timestamptz;
  v_res      text[];
  v_cpn      text[];
  v_rsn      text[];
  v_exp      timestamptz[];
  v_nxt      timestamptz[];
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
  PERFORM issuance_args_check_v3('issue_coupons_batch_v3', p_campaign_id, p_coupon_ids, p_member_ids, p_trace_parents);
  v_at := issue_now();
  v_month := to_char(v_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM');
  v_cap := monthly_cap_yen();
  v_res := array_fill(NULL::text, ARRAY[n]);
  v_cpn := v_res; v_rsn := v_res;
  v_exp := array_fill(NULL::timestamptz, ARRAY[n]);
  v_nxt := v_exp;
  IF n = 1 THEN
    v_first := '{1}';
  ELSE
    SELECT array_agg(x.f ORDER BY x.o) INTO v_first
      FROM (SELECT u.o, min(u.o) OVER (PARTITION BY u.m) AS f FROM unnest(p_member_ids) WITH ORDINALITY AS u(m, o)) x;
  END IF;

  -- The one judge, on the committed state: what each member would be answered now.
  SELECT * INTO v FROM campaign_judge(p_campaign_id, v_at);
  FOR r IN SELECT * FROM issue_judge(v, p_member_ids, v_at, v_cap) LOOP
    IF r.result = 'AVAILABLE' THEN
      IF v_first[r.i] = r.i THEN v_tried := v_tried + 1; END IF;
    ELSE
      v_res[r.i] := r.result;
    END IF;
    v_cpn[r.i] := r.coupon; v_rsn[r.i] := r.reason; v_exp[r.i] := r.expires_at; v_nxt[r.i] := r.next_release_at;
  END LOOP;
  IF v.audience_only AND v_tried > 0 THEN
    -- Audience-only: the audience rows of the members to issue, held (FOR KEY SHARE, in member
    -- order, before every other lock) until the COMMIT, so that a removal waits for the member's
    -- issuance in flight and none commits after it returns; a member removed since the judge
    -- read its row has none left to hold: NOT_ELIGIBLE, nothing written.
    FOR r IN SELECT u.o FROM unnest(p_member_ids) WITH ORDINALITY AS u(m, o)
              WHERE v_res[u.o] IS NULL AND v_first[u.o] = u.o
                AND u.m NOT IN (SELECT a.member_id FROM campaign_audience a
                                 WHERE a.campaign_id = p_campaign_id AND a.member_id = ANY (p_member_ids)
                                 ORDER BY a.member_id FOR KEY SHARE) LOOP
      v_res[r.o] := 'NOT_ELIGIBLE'; v_tried := v_tried - 1;
    END LOOP;
  END IF;

  IF v_tried > 0 THEN -- the writes, in lock order: none when the judge refused every member
    -- 1. R2: the coupons, in member order; a conflict is a concurrent request of the member that
    --    committed its coupon while this insert waited.
    WITH w AS (
      INSERT INTO issued_coupons AS c (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, expires_at)
      SELECT u.cid, p_campaign_id, u.m, v_month, v.discount_yen, v_at, v_exp[u.o]
        FROM unnest(p_member_ids, p_coupon_ids) WITH ORDINALITY AS u(m, cid, o)
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
      SELECT p_member_ids[o], v_month, v.discount_yen
        FROM unnest(v_written) AS o ORDER BY p_member_ids[o]
      ON CONFLICT (member_id, month) DO UPDATE SET used_yen = mu.used_yen + EXCLUDED.used_yen
       WHERE mu.used_yen + EXCLUDED.used_yen <= v_cap
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
    SELECT p_coupon_ids[o], p_member_ids[o], v_at, p_trace_parents[o] FROM unnest(v_kept) AS o;

    -- 4. R1 and the campaign's state: the budget stripes, in stripe order, last.
    v_left := v_kept;
    WHILE cardinality(v_left) > 0 LOOP
      -- A stripe with room that nobody holds, one at a time (a FOR loop over the query would lock
      -- the rows it prefetches), in any order, locked and written in one statement: SKIP LOCKED
      -- waits for nobody, so the instant taken just before it is the write's.
      v_now := greatest(v_at, issue_now());
      WITH free AS (
        SELECT s.stripe, least((s.budget_yen - s.issued_yen) / v.discount_yen, cardinality(v_left),
                               CASE WHEN v.releases THEN release_room(p_campaign_id, s.stripe, s.issued_yen / v.discount_yen, v_now) END) AS take
          FROM campaign_budgets s
         WHERE s.campaign_id = p_campaign_id AND s.stripe <> ALL (v_taken) AND s.issued_yen + v.discount_yen <= s.budget_yen
           AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, v_now) IS NULL
           AND (NOT v.releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v.discount_yen, v_now) > 0)
         ORDER BY random() LIMIT 1
           FOR UPDATE SKIP LOCKED)
      UPDATE campaign_budgets b SET issued_yen = b.issued_yen + free.take * v.discount_yen
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
      v_now := greatest(v_at, issue_now());
      SELECT s.stripe INTO v_stripe FROM campaign_budgets s
       WHERE s.campaign_id = p_campaign_id AND s.stripe > v_held AND s.issued_yen + v.discount_yen <= s.budget_yen
         AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, v_now) IS NULL
         AND (NOT v.releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v.discount_yen, v_now) > 0)
       ORDER BY CASE WHEN v_held < 0 THEN random() ELSE s.stripe END LIMIT 1;
      EXIT WHEN NOT FOUND;
      v_now := greatest(v_at, issue_now());
      SELECT least((s.budget_yen - s.issued_yen) / v.discount_yen,
                   CASE WHEN v.releases THEN release_room(p_campaign_id, s.stripe, s.issued_yen / v.discount_yen, v_now) END)
        INTO v_room FROM campaign_budgets s
       WHERE s.campaign_id = p_campaign_id AND s.stripe = v_stripe AND s.issued_yen + v.discount_yen <= s.budget_yen
         AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, v_now) IS NULL
         AND (NOT v.releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v.discount_yen, v_now) > 0)
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
      UPDATE campaign_budgets SET issued_yen = issued_yen + v_take * v.discount_yen
       WHERE campaign_id = p_campaign_id AND stripe = v_stripe;
      v_left := v_left[v_take + 1 :];
    END LOOP;
    IF cardinality(v_left) > 0 THEN
      -- Not placed: their rows go, and each is answered as the judge says now (with this call's
      -- stripes written): not active, or RETRY while a stripe has room, else no coupon left.
      DELETE FROM notification_outbox x USING unnest(v_left) AS o WHERE x.coupon_id = p_coupon_ids[o];
      UPDATE member_monthly_usage mu SET used_yen = mu.used_yen - v.discount_yen
        FROM unnest(v_left) AS o
       WHERE mu.member_id = p_member_ids[o] AND mu.month = v_month;
      DELETE FROM issued_coupons c USING unnest(v_left) AS o WHERE c.coupon_id = p_coupon_ids[o];
      SELECT * INTO v_later FROM campaign_judge(p_campaign_id, greatest(v_at, issue_now()));
      FOREACH k IN ARRAY v_left LOOP
        v_rsn[k] := v_later.reason; v_nxt[k] := v_later.next_release_at;
        v_res[k] := CASE WHEN v_later.reason IS NOT NULL THEN 'CAMPAIGN_NOT_ACTIVE'
                         WHEN v_later.remaining_coupons > 0 THEN 'RETRY'
                         ELSE 'BUDGET_EXCEEDED' END;
      END LOOP;
    END IF;
    FOREACH k IN ARRAY v_kept LOOP
      CONTINUE WHEN k = ANY (v_left);
      v_res[k] := 'ISSUED'; v_cpn[k] := p_coupon_ids[k]::text;
    END LOOP;
  END IF;

  -- Later entries of a member answer as its first did.
  FOR k IN 1 .. n LOOP
    CONTINUE WHEN v_first[k] = k;
    v_res[k] := CASE v_res[v_first[k]] WHEN 'ISSUED' THEN 'ALREADY_ISSUED' ELSE v_res[v_first[k]] END;
    v_cpn[k] := v_cpn[v_first[k]]; v_rsn[k] := v_rsn[v_first[k]]; v_exp[k] := v_exp[v_first[k]]; v_nxt[k] := v_nxt[v_first[k]];
  END LOOP;
  FOR k IN 1 .. n LOOP
    i := k; result := v_res[k]; coupon := v_cpn[k]; amount := CASE WHEN v_res[k] = 'ISSUED' THEN v.discount_yen END;
    reason := CASE WHEN v_res[k] = 'CAMPAIGN_NOT_ACTIVE' THEN v_rsn[k] END;
    expires_at := CASE WHEN v_res[k] IN ('ISSUED', 'ALREADY_ISSUED', 'COUPON_VOIDED') THEN v_exp[k] END;
    next_release_at := CASE WHEN v_res[k] = 'BUDGET_EXCEEDED' OR v_rsn[k] = 'NOT_STARTED' AND v_res[k] = 'CAMPAIGN_NOT_ACTIVE' THEN v_nxt[k] END;
    month := CASE WHEN v_res[k] = 'ISSUED' THEN v_month END;
    issued_at := CASE WHEN v_res[k] = 'ISSUED' THEN v_at END;
    RETURN NEXT;
  END LOOP;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION issue_coupons_batch_v3(text, uuid[], text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION issue_coupons_batch_v3(text, uuid[], text[], text[]) TO coupon_issue;
-- The month a lost answer's coupon was stamped with, which the service settles it with.
GRANT SELECT (month) ON issued_coupons TO coupon_issue;
COMMENT ON FUNCTION issue_coupons_batch_v3(text, uuid[], text[], text[]) IS
'IssueCoupon''s transaction, for one request or a coalesced group of one campaign, in one call: '
'gives each member of p_member_ids (1 to issuance_batch_max(); a member given twice is answered '
'once, later entries ALREADY_ISSUED) a coupon of campaign p_campaign_id with id p_coupon_ids[k] '
'(made by the service) and outbox trace p_trace_parents[k], or says why not. The issue time is '
'issue_now() as the call starts, R3''s cap the rule setting (monthly_cap_yen): neither is an '
'argument. issue_judge decides each refusal on the committed state; then, in the lock order of '
'docs/design.md "Lock order": the audience rows (first), the coupons (R2: one live coupon per '
'pair, a conflict answered ALREADY_ISSUED or COUPON_VOIDED), the member x month rows (R3: added '
'within the cap), the outbox rows (the transactional outbox), the budget stripes (R1, last; a '
'release''s coupons never before its instant). Answers one row per entry: i from 1, result '
'(ISSUED, a refusal of issue_judge, or RETRY: send the member again), coupon, amount (ISSUED), '
'reason (CAMPAIGN_NOT_ACTIVE), expires_at, next_release_at (BUDGET_EXCEEDED, NOT_STARTED), '
'month and issued_at (ISSUED: the Asia/Tokyo month and the instant the database stamped). '
'Errors: 22023 for malformed arguments (issuance_args_check_v3); 55P03, 40P01, 57014 as the '
'session''s timeouts say (the service''s retry policy: shared/issuance/run.go, Service.run).';

-- +goose StatementBegin
CREATE FUNCTION grant_coupons_batch_v3(p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_trace_parents text[])
RETURNS TABLE (i integer, result text, coupon text, amount integer, reason text, expires_at timestamptz,
               next_release_at timestamptz, month text, issued_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  a record;
BEGIN
  FOR a IN SELECT * FROM issue_coupons_batch_v3(p_campaign_id, p_coupon_ids, p_member_ids, p_trace_parents) LOOP
    IF a.result = 'ISSUED' THEN
      UPDATE issued_coupons c SET granted_by = session_user WHERE c.coupon_id = a.coupon::uuid;
    END IF;
    i := a.i; result := a.result; coupon := a.coupon; amount := a.amount; reason := a.reason; expires_at := a.expires_at;
    next_release_at := a.next_release_at; month := a.month; issued_at := a.issued_at;
    RETURN NEXT;
  END LOOP;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION grant_coupons_batch_v3(text, uuid[], text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION grant_coupons_batch_v3(text, uuid[], text[], text[]) TO coupon_admin;
COMMENT ON FUNCTION grant_coupons_batch_v3(text, uuid[], text[], text[]) IS
'couponctl grant''s call: issue_coupons_batch_v3 with its arguments, answers and errors, and each '
'coupon it issues records the database login that granted it (issued_coupons.granted_by). '
'Executed by coupon_admin.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION issue_coupons_batch_v2(p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_issued_at timestamptz[], p_cap_yen integer, p_trace_parents text[])
RETURNS TABLE (i integer, result text, coupon text, amount integer, reason text, expires_at timestamptz, next_release_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
  PERFORM issuance_args_check('issue_coupons_batch_v2', p_campaign_id, p_coupon_ids, p_member_ids, p_issued_at, p_trace_parents);
  PERFORM issue_clock('issue_coupons_batch_v2', p_issued_at);
  RETURN QUERY SELECT b.i, b.result, b.coupon, b.amount, b.reason, b.expires_at, b.next_release_at
                 FROM issue_coupons_batch_v3(p_campaign_id, p_coupon_ids, p_member_ids, p_trace_parents) b;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION grant_coupons_batch_v2(p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_issued_at timestamptz[], p_cap_yen integer, p_trace_parents text[])
RETURNS TABLE (i integer, result text, coupon text, amount integer, reason text, expires_at timestamptz, next_release_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
BEGIN
  PERFORM issuance_args_check('grant_coupons_batch_v2', p_campaign_id, p_coupon_ids, p_member_ids, p_issued_at, p_trace_parents);
  PERFORM issue_clock('grant_coupons_batch_v2', p_issued_at);
  RETURN QUERY SELECT b.i, b.result, b.coupon, b.amount, b.reason, b.expires_at, b.next_release_at
                 FROM grant_coupons_batch_v3(p_campaign_id, p_coupon_ids, p_member_ids, p_trace_parents) b;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION issuance_args_check(p_fn text, p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_issued_at timestamptz[], p_trace_parents text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  PERFORM issuance_args_check_v3(p_fn, p_campaign_id, p_coupon_ids, p_member_ids, p_trace_parents);
  IF NOT arg_array_fits(p_issued_at, cardinality(p_member_ids), false) THEN
    PERFORM arg_array_check(p_fn, 'p_issued_at', p_issued_at, cardinality(p_member_ids), false);
  END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION issue_clock(p_fn text, p_issued_at timestamp with time zone[])
 RETURNS timestamp with time zone[]
 LANGUAGE plpgsql
AS $$
DECLARE
  v_now timestamptz := issue_now();
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION issue_dry_run_batch(p_campaign_id text, p_member_ids text[])
RETURNS TABLE (i integer, result text, coupon text, amount integer, reason text, expires_at timestamptz,
               remaining_coupons integer, next_release_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  n     integer := coalesce(cardinality(p_member_ids), 0);
  v_at  timestamptz := issue_now();
  v     campaign_verdict;
  v_bad text;
BEGIN
  IF p_campaign_id IS NULL OR p_campaign_id !~ '^[A-Za-z0-9_-]{1,64}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('issue_dry_run_batch: campaign id %L: want 1-64 of [A-Za-z0-9_-]', p_campaign_id);
  ELSIF n NOT BETWEEN 1 AND issuance_batch_max() THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('issue_dry_run_batch: %s members: want 1 to %s', n, issuance_batch_max());
  ELSIF NOT arg_array_fits(p_member_ids, n, false) THEN
    PERFORM arg_array_check('issue_dry_run_batch', 'p_member_ids', p_member_ids, n, false);
  END IF;
  SELECT m INTO v_bad FROM unnest(p_member_ids) m WHERE length(m) NOT BETWEEN 1 AND 128 OR m ~ '[^!-~]' LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('issue_dry_run_batch: member id %L: want 1-128 bytes of visible ASCII (0x21-0x7E)', v_bad);
  END IF;
  SELECT * INTO v FROM campaign_judge(p_campaign_id, v_at);
  RETURN QUERY SELECT * FROM issue_judge(v, p_member_ids, v_at, (SELECT r.monthly_cap_yen FROM coupon_rules r));
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION issue_dry_run_batch(text, text[]) IS
'IssueCoupon''s dry run for a group of one campaign: what issue_coupons_batch_v3 would answer each '
'member of p_member_ids (1 to issuance_batch_max()) for campaign p_campaign_id at issue_now(), as '
'issue_judge answers it (the same judge, the same order): AVAILABLE with the amount and expiry, '
'or the refusal; remaining_coupons and next_release_at where issue_judge gives them. Plain reads '
'of the committed state: no lock, nothing written; an issuance in flight may take the last '
'coupon after it answers. Errors: 22023 for a malformed campaign id, member id or array.';

-- +goose StatementBegin
CREATE FUNCTION grant_check(p_campaign_id text, p_member_ids text[])
RETURNS TABLE (result text, reason text, members bigint, remaining_coupons integer, next_release_at timestamptz, opens_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_at  timestamptz := issue_now();
  v     campaign_verdict;
  v_bad text;
BEGIN
  IF p_campaign_id IS NULL OR p_campaign_id !~ '^[A-Za-z0-9_-]{1,64}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('grant_check: campaign id %L: want 1-64 of [A-Za-z0-9_-]', p_campaign_id);
  ELSIF coalesce(cardinality(p_member_ids), 0) = 0 OR NOT arg_array_fits(p_member_ids, cardinality(p_member_ids), false) THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('grant_check: p_member_ids is %s: want at least one member, one dimension from index 1, no NULLs',
                       coalesce(array_dims(p_member_ids), 'NULL or empty'));
  END IF;
  SELECT m INTO v_bad FROM unnest(p_member_ids) m WHERE length(m) NOT BETWEEN 1 AND 128 OR m ~ '[^!-~]' LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('grant_check: member id %L: want 1-128 bytes of visible ASCII (0x21-0x7E)', v_bad);
  END IF;
  SELECT * INTO v FROM campaign_judge(p_campaign_id, v_at);
  RETURN QUERY
  SELECT j.result, j.reason, count(*), min(j.remaining_coupons), min(j.next_release_at),
         CASE WHEN j.reason = 'NOT_STARTED' THEN CASE WHEN v.releases THEN v.next_release_at ELSE v.starts_at END END
    FROM issue_judge(v, p_member_ids, v_at, (SELECT r.monthly_cap_yen FROM coupon_rules r)) j
   GROUP BY j.result, j.reason ORDER BY 3 DESC, 1;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION grant_check(text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION grant_check(text, text[]) TO coupon_admin;
COMMENT ON FUNCTION grant_check(text, text[]) IS
'couponctl grant''s pre-check: what issue_judge answers each member of p_member_ids (one '
'dimension from index 1, no NULLs, any number) for campaign p_campaign_id at issue_now(), '
'counted by result and reason, most first; remaining_coupons and next_release_at as '
'issue_judge gives them, opens_at (NOT_STARTED) its start or first release. Plain reads, no '
'lock, nothing written. Errors: 22023 for a malformed campaign id, member id or array (any '
'length). Executed by coupon_admin.';

-- The clock: each function below reads issue_now() where it read clock_timestamp() or now(), and
-- those that take an instant check it (instant_check); the changes refuse, under the campaign's
-- lock, what may not be done to an ended campaign (campaign_refuse_ended). Otherwise as before.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.campaign_audience_change(p_campaign_id text, p_member_ids text[], p_add boolean, p_reason text)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  n       integer := coalesce(cardinality(p_member_ids), 0);
  v_only  boolean;
  v_bad   text;
  v_count integer;
BEGIN
  SELECT b.audience_only INTO v_only FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI404', MESSAGE = format('campaign %s does not exist', p_campaign_id);
  ELSIF NOT v_only THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s is open to every member (created without audience-only); nothing changed', p_campaign_id);
  ELSIF p_add IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'campaign_audience_change: add or remove: neither was given';
  ELSIF n NOT BETWEEN 1 AND 1000 OR NOT arg_array_fits(p_member_ids, n, false) THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: %s member ids (%s): want 1 to 1000 a call, one dimension from index 1, no NULLs; nothing changed',
                       p_campaign_id, n, coalesce(array_dims(p_member_ids), 'none'));
  END IF;
  SELECT m INTO v_bad FROM unnest(p_member_ids) AS m WHERE length(m) NOT BETWEEN 1 AND 128 OR m ~ '[^!-~]' LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('member id %L: want 1-128 bytes of visible ASCII (0x21-0x7E); nothing changed', v_bad);
  END IF;
  IF p_add THEN
    INSERT INTO campaign_audience (campaign_id, member_id)
    SELECT DISTINCT p_campaign_id, m FROM unnest(p_member_ids) AS m ORDER BY 2
    ON CONFLICT DO NOTHING;
  ELSE
    WITH held AS (
      SELECT a.member_id FROM campaign_audience a
       WHERE a.campaign_id = p_campaign_id AND a.member_id = ANY (p_member_ids)
       ORDER BY a.member_id
         FOR UPDATE)
    DELETE FROM campaign_audience a USING held WHERE a.campaign_id = p_campaign_id AND a.member_id = held.member_id;
  END IF;
  GET DIAGNOSTICS v_count = ROW_COUNT;
  PERFORM campaign_change_record(p_campaign_id, issue_now(), 'audience', '{}'::jsonb,
    jsonb_build_object(CASE WHEN p_add THEN 'added' ELSE 'removed' END, v_count, 'given', n), p_reason);
  RETURN v_count;
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.campaign_change_budget(p_campaign_id text, p_budget_yen bigint, p_add_yen bigint, p_stripes integer, p_reason text)
 RETURNS SETOF campaign_changes
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  v_first    campaign_budgets;
  v_k        integer;
  v_budget   bigint;
  v_issued   bigint;
  v_new      bigint;
  v_new_k    integer;
  v_coupons  bigint;
  v_used     bigint;
  v_b        bigint;
  v_n        bigint;
  v_at       timestamptz;
  v_before   jsonb;
  v_after    jsonb;
BEGIN
  IF p_budget_yen IS NOT NULL AND p_add_yen IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'give a budget or an amount to add, not both';
  END IF;
  SELECT count(*), sum(l.budget_yen), sum(l.issued_yen) INTO v_k, v_budget, v_issued FROM campaign_lock(p_campaign_id) l;
  SELECT * INTO v_first FROM campaign_budgets WHERE campaign_id = p_campaign_id AND stripe = 0;
  v_at := issue_now();
  PERFORM campaign_refuse_ended(v_first, 'budget change', v_at);
  v_new := coalesce(p_budget_yen, v_budget + p_add_yen, v_budget);
  v_new_k := coalesce(p_stripes, v_k);
  IF v_new < v_issued THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: a budget of %s yen is below the %s yen already issued; nothing changed', p_campaign_id, v_new, v_issued);
  ELSIF v_new < v_first.discount_yen OR v_new > 2147483647 THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: a budget of %s yen is not between one %s yen coupon and 2147483647 yen; nothing changed', p_campaign_id, v_new, v_first.discount_yen);
  ELSIF v_new_k NOT BETWEEN 1 AND 64 OR v_new_k > v_new / v_first.discount_yen THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: %s stripes for a budget of %s coupons: want 1-64 stripes and at least one coupon each; nothing changed',
                       p_campaign_id, v_new_k, v_new / v_first.discount_yen);
  END IF;
  IF v_new = v_budget AND v_new_k = v_k THEN
    RETURN;
  END IF;
  v_before := jsonb_build_object('budget_yen', v_budget, 'issued_yen', v_issued, 'stripes', v_k);
  v_after := jsonb_build_object('budget_yen', v_new, 'issued_yen', v_issued, 'stripes', v_new_k);

  -- The layout: stripe i gets b coupons of budget and n coupons issued, the first stripes one
  -- more of each; the yen that make no whole coupon stay on stripe 0. n <= b on every stripe,
  -- since the issued coupons are at most the budget's coupons.
  v_coupons := v_new / v_first.discount_yen;
  v_used := v_issued / v_first.discount_yen;
  DELETE FROM campaign_budgets WHERE campaign_id = p_campaign_id AND stripe >= v_new_k;
  FOR i IN 0 .. v_new_k - 1 LOOP
    v_b := (v_coupons / v_new_k + (i < v_coupons % v_new_k)::integer) * v_first.discount_yen;
    v_n := (v_used / v_new_k + (i < v_used % v_new_k)::integer) * v_first.discount_yen;
    IF i = 0 THEN
      v_b := v_b + v_new - v_coupons * v_first.discount_yen;
      v_n := v_n + v_issued - v_used * v_first.discount_yen;
    END IF;
    INSERT INTO campaign_budgets (campaign_id, stripe, discount_yen, budget_yen, issued_yen, starts_at, ends_at, paused_at,
                                  coupon_valid_days, coupons_expire_at)
    VALUES (p_campaign_id, i, v_first.discount_yen, v_b, v_n, v_first.starts_at, v_first.ends_at, v_first.paused_at,
            v_first.coupon_valid_days, v_first.coupons_expire_at)
    ON CONFLICT (campaign_id, stripe) DO UPDATE SET budget_yen = EXCLUDED.budget_yen, issued_yen = EXCLUDED.issued_yen;
  END LOOP;
  UPDATE campaigns SET budget_yen = v_new WHERE campaign_id = p_campaign_id;

  IF v_new <> v_budget THEN
    RETURN NEXT campaign_change_record(p_campaign_id, v_at, 'budget', v_before, v_after, p_reason);
  END IF;
  IF v_new_k <> v_k THEN
    RETURN NEXT campaign_change_record(p_campaign_id, v_at, 'stripes', v_before, v_after, p_reason);
  END IF;
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.campaign_change_state(p_campaign_id text, p_what text, p_starts timestamp with time zone, p_ends timestamp with time zone, p_set_starts boolean, p_set_ends boolean, p_reason text)
 RETURNS SETOF campaign_changes
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  v_first  campaign_budgets;
  v_at     timestamptz;
  v_starts timestamptz;
  v_ends   timestamptz;
  v_paused timestamptz;
BEGIN
  PERFORM instant_check('campaign_change_state', 'p_starts', p_starts);
  PERFORM instant_check('campaign_change_state', 'p_ends', p_ends);
  PERFORM FROM campaign_lock(p_campaign_id);
  SELECT * INTO v_first FROM campaign_budgets WHERE campaign_id = p_campaign_id AND stripe = 0;
  v_at := issue_now();
  IF p_what IN ('pause', 'resume') THEN
    PERFORM campaign_refuse_ended(v_first, p_what, v_at);
  END IF;
  v_starts := v_first.starts_at;
  v_ends := v_first.ends_at;
  v_paused := v_first.paused_at;
  CASE p_what
  WHEN 'pause' THEN
    v_paused := coalesce(v_paused, v_at);
  WHEN 'resume' THEN
    v_paused := NULL;
  WHEN 'end' THEN
    IF v_starts >= v_at THEN -- at its very start, an end now would leave it no period (period_ordered)
      RAISE EXCEPTION USING ERRCODE = 'CI422',
        MESSAGE = format('campaign %s has not started (it starts %s): pause it, or move its period with --starts and --ends; nothing changed', p_campaign_id, v_starts);
    END IF;
    IF v_ends IS NULL OR v_ends > v_at THEN
      v_ends := v_at;
    END IF;
  WHEN 'period' THEN
    IF p_set_starts THEN v_starts := p_starts; END IF;
    IF p_set_ends THEN v_ends := p_ends; END IF;
    IF v_starts >= v_ends THEN
      RAISE EXCEPTION USING ERRCODE = 'CI422',
        MESSAGE = format('campaign %s: starts %s is not before ends %s; nothing changed', p_campaign_id, v_starts, v_ends);
    END IF;
  ELSE
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = format('campaign_change_state: unknown change %L', p_what);
  END CASE;
  IF v_starts IS NOT DISTINCT FROM v_first.starts_at AND v_ends IS NOT DISTINCT FROM v_first.ends_at
     AND v_paused IS NOT DISTINCT FROM v_first.paused_at THEN
    RETURN;
  END IF;
  UPDATE campaign_budgets SET starts_at = v_starts, ends_at = v_ends, paused_at = v_paused
   WHERE campaign_id = p_campaign_id;
  RETURN NEXT campaign_change_record(p_campaign_id, v_at, p_what,
    jsonb_build_object('starts_at', v_first.starts_at, 'ends_at', v_first.ends_at, 'paused_at', v_first.paused_at),
    jsonb_build_object('starts_at', v_starts, 'ends_at', v_ends, 'paused_at', v_paused),
    p_reason);
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.campaign_change_validity(p_campaign_id text, p_valid_days integer, p_expire_at timestamp with time zone, p_reason text)
 RETURNS SETOF campaign_changes
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  v_first campaign_budgets;
  v_at    timestamptz;
BEGIN
  PERFORM instant_check('campaign_change_validity', 'p_expire_at', p_expire_at);
  PERFORM FROM campaign_lock(p_campaign_id);
  SELECT * INTO v_first FROM campaign_budgets WHERE campaign_id = p_campaign_id AND stripe = 0;
  v_at := issue_now();
  IF p_valid_days IS NOT NULL AND p_expire_at IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'give a validity in days or an expiry instant, not both';
  ELSIF p_valid_days NOT BETWEEN 1 AND 3650 THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: a validity of %s days: want 1 to 3650; nothing changed', p_campaign_id, p_valid_days);
  ELSIF p_expire_at <= v_at THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: coupons expiring at %s would be issued expired; nothing changed', p_campaign_id, p_expire_at);
  END IF;
  IF v_first.coupon_valid_days IS NOT DISTINCT FROM p_valid_days AND v_first.coupons_expire_at IS NOT DISTINCT FROM p_expire_at THEN
    RETURN;
  END IF;
  UPDATE campaign_budgets SET coupon_valid_days = p_valid_days, coupons_expire_at = p_expire_at
   WHERE campaign_id = p_campaign_id;
  RETURN NEXT campaign_change_record(p_campaign_id, v_at, 'validity',
    jsonb_build_object('coupon_valid_days', v_first.coupon_valid_days, 'coupons_expire_at', v_first.coupons_expire_at),
    jsonb_build_object('coupon_valid_days', p_valid_days, 'coupons_expire_at', p_expire_at),
    p_reason);
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.campaign_create(p_campaign_id text, p_discount_yen integer, p_budget_yen integer, p_stripes integer, p_starts timestamp with time zone, p_ends timestamp with time zone, p_valid_days integer, p_expire_at timestamp with time zone, p_reason text)
 RETURNS SETOF campaign_changes
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  v_coupons bigint; -- bigint: stripe 0's share plus the leftover yen is summed before it is narrowed
  v_b       bigint;
BEGIN
  PERFORM instant_check('campaign_create', 'p_starts', p_starts);
  PERFORM instant_check('campaign_create', 'p_ends', p_ends);
  PERFORM instant_check('campaign_create', 'p_expire_at', p_expire_at);
  IF p_campaign_id IS NULL OR p_campaign_id !~ '^[A-Za-z0-9_-]{1,64}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign id %L: want 1-64 of [A-Za-z0-9_-]', p_campaign_id);
  ELSIF p_discount_yen IS NULL OR p_discount_yen <= 0 OR p_budget_yen IS NULL OR p_budget_yen < p_discount_yen THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: a %s yen coupon and a budget of %s yen: want a positive discount and a budget of at least one coupon', p_campaign_id, p_discount_yen, p_budget_yen);
  ELSIF p_stripes IS NULL OR p_stripes NOT BETWEEN 1 AND 64 OR p_stripes > p_budget_yen / p_discount_yen THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: %s stripes for a budget of %s coupons: want 1-64 stripes and at least one coupon each', p_campaign_id, p_stripes, p_budget_yen / p_discount_yen);
  ELSIF p_valid_days NOT BETWEEN 1 AND 3650 THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: a validity of %s days: want 1 to 3650', p_campaign_id, p_valid_days);
  ELSIF p_valid_days IS NOT NULL AND p_expire_at IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'give a validity in days or an expiry instant, not both';
  ELSIF p_starts >= p_ends THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: starts %s is not before ends %s', p_campaign_id, p_starts, p_ends);
  ELSIF p_expire_at <= issue_now() THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: coupons expiring at %s would be issued expired (the database''s clock is %s)', p_campaign_id, p_expire_at, issue_now());
  END IF;
  INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES (p_campaign_id, p_discount_yen, p_budget_yen)
  ON CONFLICT DO NOTHING;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI409', MESSAGE = 'exists', DETAIL = format('campaign %s exists', p_campaign_id);
  END IF;
  v_coupons := p_budget_yen / p_discount_yen;
  FOR i IN 0 .. p_stripes - 1 LOOP
    v_b := (v_coupons / p_stripes + (i < v_coupons % p_stripes)::integer) * p_discount_yen;
    IF i = 0 THEN
      v_b := v_b + p_budget_yen - v_coupons * p_discount_yen;
    END IF;
    INSERT INTO campaign_budgets (campaign_id, stripe, discount_yen, budget_yen, starts_at, ends_at, coupon_valid_days, coupons_expire_at)
    VALUES (p_campaign_id, i, p_discount_yen, v_b, p_starts, p_ends, p_valid_days, p_expire_at);
  END LOOP;
  RETURN NEXT campaign_change_record(p_campaign_id, issue_now(), 'create', '{}'::jsonb,
    jsonb_build_object('discount_yen', p_discount_yen, 'budget_yen', p_budget_yen, 'stripes', p_stripes,
      'starts_at', p_starts, 'ends_at', p_ends, 'coupon_valid_days', p_valid_days, 'coupons_expire_at', p_expire_at),
    p_reason);
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.campaign_create(p_campaign_id text, p_discount_yen integer, p_budget_yen integer, p_stripes integer, p_starts timestamp with time zone, p_ends timestamp with time zone, p_valid_days integer, p_expire_at timestamp with time zone, p_reason text, p_release_at timestamp with time zone[], p_release_coupons integer[], p_audience_only boolean)
 RETURNS SETOF campaign_changes
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  n        integer := coalesce(cardinality(p_release_at), 0);
  v_create campaign_changes;
  v_bad    record;
  v_sum    bigint;
BEGIN
  FOR k IN 1 .. n LOOP
    PERFORM instant_check('campaign_create', format('p_release_at[%s]', k), p_release_at[k]);
  END LOOP;
  IF NOT (n = coalesce(cardinality(p_release_coupons), 0)
          AND (n = 0 OR (arg_array_fits(p_release_at, n, false) AND arg_array_fits(p_release_coupons, n, false)))) THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: releases at %s of %s coupons: want as many instants as counts, one dimension from index 1, no NULLs',
                       p_campaign_id, coalesce(array_dims(p_release_at), 'none'), coalesce(array_dims(p_release_coupons), 'none'));
  ELSIF p_audience_only IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: audience-only is neither true nor false', p_campaign_id);
  END IF;
  SELECT * INTO STRICT v_create FROM campaign_create(p_campaign_id, p_discount_yen, p_budget_yen, p_stripes, p_starts, p_ends,
                                                     p_valid_days, p_expire_at, p_reason);
  SELECT r.at, r.coupons, count(*) OVER (PARTITION BY r.at) AS same INTO v_bad
    FROM unnest(p_release_at, p_release_coupons) AS r(at, coupons)
   ORDER BY coalesce(r.coupons < 1 OR r.at >= p_ends, false) DESC, count(*) OVER (PARTITION BY r.at) DESC LIMIT 1;
  IF v_bad.coupons < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: a release of %s coupons at %s: want at least 1', p_campaign_id, v_bad.coupons, v_bad.at);
  ELSIF v_bad.at >= p_ends THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: a release at %s is not before the campaign''s end %s', p_campaign_id, v_bad.at, p_ends);
  ELSIF v_bad.same > 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: two releases at %s: want one an instant', p_campaign_id, v_bad.at);
  END IF;
  SELECT sum(c) INTO v_sum FROM unnest(p_release_coupons) AS c;
  IF v_sum > p_budget_yen / p_discount_yen THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: releases of %s coupons in all, above the budget''s %s coupons of %s yen', p_campaign_id, v_sum, p_budget_yen / p_discount_yen, p_discount_yen);
  END IF;
  INSERT INTO campaign_releases (campaign_id, at, coupons) SELECT p_campaign_id, r.at, r.coupons FROM unnest(p_release_at, p_release_coupons) AS r(at, coupons);
  UPDATE campaign_budgets SET audience_only = p_audience_only, releases = n > 0 WHERE campaign_id = p_campaign_id;
  UPDATE campaign_changes c
     SET after = c.after || jsonb_build_object('audience_only', p_audience_only,
           'releases', (SELECT coalesce(jsonb_agg(jsonb_build_object('at', r.at, 'coupons', r.coupons) ORDER BY r.at), '[]')
                          FROM unnest(p_release_at, p_release_coupons) AS r(at, coupons)))
   WHERE c.change_id = v_create.change_id
  RETURNING * INTO v_create;
  RETURN NEXT v_create;
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.campaign_release_add(p_campaign_id text, p_at timestamp with time zone, p_coupons integer, p_reason text)
 RETURNS SETOF campaign_changes
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  v_first  campaign_budgets;
  v_now    timestamptz;
  v_budget bigint;
  v_sum    bigint;
BEGIN
  PERFORM instant_check('campaign_release_add', 'p_at', p_at);
  SELECT * INTO v_first FROM campaign_budgets WHERE campaign_id = p_campaign_id AND stripe = 0 FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI404', MESSAGE = format('campaign %s does not exist', p_campaign_id);
  END IF;
  v_now := issue_now();
  PERFORM campaign_refuse_ended(v_first, 'release', v_now);
  SELECT sum(b.budget_yen) INTO v_budget FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id;
  SELECT coalesce(sum(r.coupons), 0) INTO v_sum FROM campaign_releases r WHERE r.campaign_id = p_campaign_id;
  IF NOT v_first.releases THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s was created without releases and issues its whole budget from its start; nothing changed', p_campaign_id);
  ELSIF p_at IS NULL OR p_at <= v_now THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: a release at %s is not after the database''s clock (%s); nothing changed', p_campaign_id, p_at, v_now);
  ELSIF p_at >= v_first.ends_at THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: a release at %s is not before the campaign''s end %s; nothing changed', p_campaign_id, p_at, v_first.ends_at);
  ELSIF p_coupons IS NULL OR p_coupons < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: a release of %s coupons: want at least 1; nothing changed', p_campaign_id, p_coupons);
  ELSIF EXISTS (SELECT 1 FROM campaign_releases r WHERE r.campaign_id = p_campaign_id AND r.at = p_at) THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: a release at %s exists already; nothing changed', p_campaign_id, p_at);
  ELSIF v_sum + p_coupons > v_budget / v_first.discount_yen THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: releases of %s coupons in all, above the budget''s %s coupons of %s yen; nothing changed',
                       p_campaign_id, v_sum + p_coupons, v_budget / v_first.discount_yen, v_first.discount_yen);
  END IF;
  INSERT INTO campaign_releases (campaign_id, at, coupons) VALUES (p_campaign_id, p_at, p_coupons);
  RETURN NEXT campaign_change_record(p_campaign_id, v_now, 'release',
    jsonb_build_object('released_coupons', v_sum),
    jsonb_build_object('released_coupons', v_sum + p_coupons, 'at', p_at, 'coupons', p_coupons),
    p_reason);
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.console_budget(p_campaign_id text, p_budget_yen bigint, p_add_yen bigint, p_stripes integer, p_operator text, p_reason text)
 RETURNS TABLE(applied boolean, request_id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  v_email  text := operator_require(p_operator, 'operator', format('a budget change of campaign %s', p_campaign_id));
  v_line   bigint;
  v_budget bigint;
  v_first  campaign_budgets;
  v_ids    bigint[];
BEGIN
  PERFORM operator_lock_timeout();
  IF p_budget_yen IS NULL AND p_add_yen IS NULL AND p_stripes IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: nothing to change: give a budget, an amount to add or stripes', p_campaign_id);
  ELSIF p_budget_yen IS NOT NULL AND p_add_yen IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'give a budget or an amount to add, not both';
  ELSIF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every change needs a reason (--reason TEXT)';
  END IF;
  SELECT r.approval_above_yen INTO STRICT v_line FROM coupon_rules r;
  SELECT sum(l.budget_yen) INTO v_budget FROM campaign_lock(p_campaign_id) l;
  SELECT * INTO v_first FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  PERFORM campaign_refuse_ended(v_first, 'budget change', issue_now()); -- a request for one could only lapse
  IF coalesce(p_budget_yen - v_budget, p_add_yen, 0) > v_line THEN
    INSERT INTO campaign_change_request_rows AS q (campaign_id, kind, args, requested_by, request_reason, requested_at)
    VALUES (p_campaign_id, 'budget',
            jsonb_strip_nulls(jsonb_build_object('budget_yen', p_budget_yen, 'add_yen', p_add_yen, 'stripes', p_stripes)),
            v_email, p_reason, issue_now())
    RETURNING false, q.request_id INTO applied, request_id;
    RETURN NEXT;
    RETURN;
  END IF;
  v_ids := ARRAY(SELECT c.change_id FROM campaign_change_budget(p_campaign_id, p_budget_yen, p_add_yen, p_stripes, p_reason) c);
  PERFORM FROM operator_changes_mark(v_ids, v_email, NULL);
  applied := true; request_id := NULL;
  RETURN NEXT;
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.console_decide(p_request_id bigint, p_approve boolean, p_operator text, p_reason text)
 RETURNS SETOF campaign_change_requests
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  v_email text := operator_require(p_operator, 'approver', format('deciding request %s', p_request_id));
  v_r     campaign_change_request_rows;
  v_at    timestamptz;
  v_ids   bigint[];
BEGIN
  PERFORM operator_lock_timeout();
  IF p_approve IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'console_decide: say approve (true) or reject (false)';
  ELSIF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every decision needs a reason';
  END IF;
  SELECT * INTO v_r FROM campaign_change_request_rows q WHERE q.request_id = p_request_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI404', MESSAGE = format('request %s does not exist', p_request_id);
  END IF;
  v_at := issue_now();
  IF v_r.decision IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI409',
      MESSAGE = format('request %s was %s by %s at %s; nothing changed', p_request_id, v_r.decision, v_r.decided_by, v_r.decided_at);
  ELSIF v_at >= v_r.requested_at + change_request_lifetime() THEN
    RAISE EXCEPTION USING ERRCODE = 'CI409',
      MESSAGE = format('request %s lapsed at %s, %s h after it was made; nothing changed: ask for it again',
                       p_request_id, v_r.requested_at + change_request_lifetime(),
                       (extract(epoch FROM change_request_lifetime()) / 3600)::integer);
  ELSIF v_r.requested_by = v_email THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
      MESSAGE = format('request %s was made by %s: a different approver decides it (four eyes); nothing changed', p_request_id, v_email);
  END IF;
  IF p_approve THEN
    IF v_r.kind = 'budget' THEN
      v_ids := ARRAY(SELECT c.change_id FROM campaign_change_budget(v_r.campaign_id, (v_r.args ->> 'budget_yen')::bigint,
                       (v_r.args ->> 'add_yen')::bigint, (v_r.args ->> 'stripes')::integer, v_r.request_reason) c);
    ELSE
      v_ids := ARRAY(SELECT c.change_id FROM campaign_change_state(v_r.campaign_id, 'period',
                       (v_r.args ->> 'starts_at')::timestamptz, (v_r.args ->> 'ends_at')::timestamptz,
                       v_r.args ? 'starts_at', v_r.args ? 'ends_at', v_r.request_reason) c);
    END IF;
    PERFORM FROM operator_changes_mark(v_ids, v_email, p_request_id);
  END IF;
  UPDATE campaign_change_request_rows q
     SET decision = CASE WHEN p_approve THEN 'approved' ELSE 'rejected' END,
         decided_by = v_email, decision_reason = p_reason, decided_at = v_at
   WHERE q.request_id = p_request_id;
  RETURN QUERY SELECT * FROM campaign_change_requests q WHERE q.request_id = p_request_id;
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.console_period(p_campaign_id text, p_starts timestamp with time zone, p_ends timestamp with time zone, p_operator text, p_reason text)
 RETURNS TABLE(applied boolean, request_id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  v_email text;
BEGIN
  PERFORM instant_check('console_period', 'p_starts', p_starts);
  PERFORM instant_check('console_period', 'p_ends', p_ends);
  v_email := operator_require(p_operator, 'operator', format('a period change of campaign %s', p_campaign_id));
  PERFORM operator_lock_timeout();
  IF p_starts IS NULL AND p_ends IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: nothing to change: give a start, an end or both', p_campaign_id);
  ELSIF p_starts >= p_ends THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: starts %s is not before ends %s; nothing changed', p_campaign_id, p_starts, p_ends);
  ELSIF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every change needs a reason (--reason TEXT)';
  ELSIF NOT EXISTS (SELECT 1 FROM campaigns c WHERE c.campaign_id = p_campaign_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'CI404', MESSAGE = format('campaign %s does not exist', p_campaign_id);
  END IF;
  INSERT INTO campaign_change_request_rows AS q (campaign_id, kind, args, requested_by, request_reason, requested_at)
  VALUES (p_campaign_id, 'period', jsonb_strip_nulls(jsonb_build_object('starts_at', p_starts, 'ends_at', p_ends)),
          v_email, p_reason, issue_now())
  RETURNING false, q.request_id INTO applied, request_id;
  RETURN NEXT;
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.console_role_set(p_email text, p_role text, p_reason text)
 RETURNS SETOF console_role_changes
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET lock_timeout TO '1s'
AS $function$
DECLARE
  v_email  text := operator_email(p_email);
  v_before text;
  v_at     timestamptz;
BEGIN
  IF p_role IS NULL OR p_role NOT IN ('viewer', 'operator', 'approver') THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('role %L: want viewer, operator or approver', p_role);
  ELSIF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every change needs a reason (--reason TEXT)';
  END IF;
  LOCK TABLE console_roles IN SHARE ROW EXCLUSIVE MODE;
  v_at := issue_now();
  SELECT coalesce((SELECT r.role FROM console_roles r WHERE r.email = v_email), 'viewer') INTO v_before;
  IF v_before = p_role THEN
    RETURN;
  END IF;
  INSERT INTO console_roles AS r (email, role, changed_at, changed_by) VALUES (v_email, p_role, v_at, session_user)
  ON CONFLICT (email) DO UPDATE SET role = EXCLUDED.role, changed_at = EXCLUDED.changed_at, changed_by = EXCLUDED.changed_by;
  RETURN QUERY INSERT INTO console_role_changes (email, before, after, reason, changed_by, changed_at)
    VALUES (v_email, v_before, p_role, p_reason, session_user, v_at)
    RETURNING *;
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.counters_repair(p_reason text)
 RETURNS TABLE(kind text, key text, before_yen bigint, after_yen bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  r       record;
  s       record;
  v_live  bigint;
  v_left  bigint;
  v_put   bigint;
  v_total bigint;
  v_budget bigint;
BEGIN
  IF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every repair needs a reason';
  END IF;
  FOR r IN WITH live AS (SELECT c.member_id, c.month, sum(c.amount_yen) AS s FROM issued_coupons c
                          WHERE c.voided_at IS NULL GROUP BY c.member_id, c.month)
           SELECT member_id, month FROM live l FULL JOIN member_monthly_usage u USING (member_id, month)
            WHERE coalesce(l.s, 0) <> coalesce(u.used_yen, 0)
            ORDER BY member_id, month LOOP
    INSERT INTO member_monthly_usage AS u (member_id, month) VALUES (r.member_id, r.month)
    ON CONFLICT (member_id, month) DO UPDATE SET used_yen = u.used_yen
    RETURNING u.used_yen INTO before_yen;
    UPDATE member_monthly_usage u SET used_yen = (
      SELECT coalesce(sum(c.amount_yen), 0) FROM issued_coupons c
       WHERE c.member_id = r.member_id AND c.month = r.month AND c.voided_at IS NULL)
     WHERE u.member_id = r.member_id AND u.month = r.month
    RETURNING u.used_yen INTO after_yen;
    IF after_yen <> before_yen THEN
      kind := 'usage'; key := r.member_id || ' ' || r.month; RETURN NEXT;
    END IF;
  END LOOP;
  FOR r IN SELECT b.campaign_id
             FROM (SELECT campaign_id, sum(issued_yen) AS issued_yen FROM campaign_budgets GROUP BY campaign_id) b
             LEFT JOIN (SELECT campaign_id, sum(amount_yen) AS s FROM issued_coupons
                         WHERE voided_at IS NULL GROUP BY campaign_id) l USING (campaign_id)
            WHERE b.issued_yen <> coalesce(l.s, 0)
            ORDER BY b.campaign_id LOOP
    SELECT sum(l.issued_yen), sum(l.budget_yen) INTO v_total, v_budget FROM campaign_lock(r.campaign_id) l;
    SELECT coalesce(sum(c.amount_yen), 0) INTO v_live FROM issued_coupons c
     WHERE c.campaign_id = r.campaign_id AND c.voided_at IS NULL;
    IF v_live > v_budget THEN
      kind := 'refused'; key := r.campaign_id; before_yen := v_budget; after_yen := v_live; RETURN NEXT;
      CONTINUE;
    END IF;
    CONTINUE WHEN v_live = v_total;
    v_left := v_live;
    FOR s IN SELECT b.stripe, b.budget_yen, b.issued_yen FROM campaign_budgets b
              WHERE b.campaign_id = r.campaign_id ORDER BY b.stripe LOOP
      v_put := least(v_left, s.budget_yen);
      v_left := v_left - v_put;
      CONTINUE WHEN v_put = s.issued_yen;
      UPDATE campaign_budgets b SET issued_yen = v_put WHERE b.campaign_id = r.campaign_id AND b.stripe = s.stripe;
    END LOOP;
    PERFORM campaign_change_record(r.campaign_id, issue_now(), 'repair',
      jsonb_build_object('issued_yen', v_total), jsonb_build_object('issued_yen', v_live), p_reason);
    kind := 'campaign'; key := r.campaign_id; before_yen := v_total; after_yen := v_live; RETURN NEXT;
  END LOOP;
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.coupon_rules_set(p_monthly_cap_yen integer, p_approval_above_yen bigint, p_reason text)
 RETURNS SETOF coupon_rules_changes
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET lock_timeout TO '1s'
AS $function$
DECLARE
  v_rules  coupon_rules;
  v_at     timestamptz;
  v_before jsonb := '{}';
  v_after  jsonb := '{}';
BEGIN
  IF p_monthly_cap_yen IS NULL AND p_approval_above_yen IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'nothing to set: give a monthly cap, an approval line or both';
  ELSIF p_monthly_cap_yen NOT BETWEEN 1 AND 1000000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('a monthly cap of %s yen: want 1 to 1000000000', p_monthly_cap_yen);
  ELSIF p_approval_above_yen NOT BETWEEN 0 AND 2147483647 THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('an approval line of %s yen: want 0 to 2147483647', p_approval_above_yen);
  ELSIF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every change needs a reason (--reason TEXT)';
  END IF;
  IF p_monthly_cap_yen IS NOT NULL THEN
    LOCK TABLE coupon_rules IN ACCESS EXCLUSIVE MODE;
  END IF;
  SELECT * INTO STRICT v_rules FROM coupon_rules r FOR UPDATE;
  v_at := issue_now();
  IF p_monthly_cap_yen <> v_rules.monthly_cap_yen THEN
    v_before := v_before || jsonb_build_object('monthly_cap_yen', v_rules.monthly_cap_yen);
    v_after := v_after || jsonb_build_object('monthly_cap_yen', p_monthly_cap_yen);
  END IF;
  IF p_approval_above_yen <> v_rules.approval_above_yen THEN
    v_before := v_before || jsonb_build_object('approval_above_yen', v_rules.approval_above_yen);
    v_after := v_after || jsonb_build_object('approval_above_yen', p_approval_above_yen);
  END IF;
  IF v_after = '{}' THEN
    RETURN;
  END IF;
  UPDATE coupon_rules SET monthly_cap_yen = coalesce(p_monthly_cap_yen, monthly_cap_yen),
         approval_above_yen = coalesce(p_approval_above_yen, approval_above_yen), changed_at = v_at, changed_by = session_user;
  RETURN QUERY INSERT INTO coupon_rules_changes (changed_at, before, after, reason)
    VALUES (v_at, v_before, v_after, p_reason)
    RETURNING *;
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.coupon_void(p_coupon_id uuid, p_reason text, p_allow_reissue boolean, OUT result text, OUT campaign_id text, OUT member_id text, OUT month text, OUT amount_yen integer, OUT voided_at timestamp with time zone, OUT voided_by text, OUT push text, OUT pushed_at timestamp with time zone)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  v_c      issued_coupons;
  v_o      notification_outbox;
  v_stripe smallint;
BEGIN
  IF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every void needs a reason (--reason TEXT)';
  END IF;
  SELECT * INTO v_c FROM issued_coupons c WHERE c.coupon_id = p_coupon_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI404', MESSAGE = format('coupon %s does not exist', p_coupon_id);
  END IF;
  campaign_id := v_c.campaign_id; member_id := v_c.member_id; month := v_c.month; amount_yen := v_c.amount_yen;
  voided_at := v_c.voided_at; voided_by := v_c.voided_by;
  IF v_c.voided_at IS NOT NULL OR v_c.redeemed_at IS NOT NULL THEN
    SELECT * INTO v_o FROM notification_outbox o WHERE o.coupon_id = p_coupon_id;
    push := outbox_push_state(v_c.outbox_pruned_at, v_o);
    pushed_at := v_o.sent_at;
    result := CASE WHEN v_c.voided_at IS NOT NULL THEN 'ALREADY_VOIDED' ELSE 'REDEEMED' END;
    RETURN;
  END IF;

  -- R3: the member's month gets the coupon's yen back.
  UPDATE member_monthly_usage u SET used_yen = u.used_yen - v_c.amount_yen
   WHERE u.member_id = v_c.member_id AND u.month = v_c.month AND u.used_yen >= v_c.amount_yen;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'internal_error', MESSAGE = format(
      'coupon_void: the %s counter of member %s holds less than the coupon''s %s yen: run couponctl reconcile',
      v_c.month, v_c.member_id, v_c.amount_yen);
  END IF;

  -- The outbox row, after the usage row as the issuance writes them: locked while it is open, so
  -- that no claim of any release takes it while this void is open (FOR UPDATE SKIP LOCKED skips
  -- it), and closed as skipped when it was not pushed, so that no claim takes it after. One a
  -- relay run holds (claimed, its lease running) may be pushed now: said so. A closed row (sent,
  -- skipped, parked) is read, not locked: `outbox prune` holds closed rows while it waits for
  -- their coupon rows, which this void holds.
  SELECT * INTO v_o FROM notification_outbox o
   WHERE o.coupon_id = p_coupon_id AND o.sent_at IS NULL AND o.skipped_at IS NULL AND o.parked_at IS NULL
     FOR UPDATE;
  IF NOT FOUND THEN
    SELECT * INTO v_o FROM notification_outbox o WHERE o.coupon_id = p_coupon_id;
  END IF;
  push := outbox_push_state(v_c.outbox_pruned_at, v_o);
  pushed_at := v_o.sent_at;
  IF push = 'not sent' THEN
    UPDATE notification_outbox o SET skipped_at = issue_now(), skip_reason = 'voided',
           last_error = 'skipped: the coupon was voided (couponctl coupon show)'
     WHERE o.coupon_id = p_coupon_id;
  END IF;

  -- R1: one budget stripe holding at least the coupon's yen gets them back, last.
  LOOP
    WITH held AS (
      SELECT s.campaign_id, s.stripe FROM campaign_budgets s
       WHERE s.campaign_id = v_c.campaign_id AND s.issued_yen >= v_c.amount_yen
       ORDER BY s.issued_yen DESC LIMIT 1
         FOR UPDATE SKIP LOCKED)
    UPDATE campaign_budgets b SET issued_yen = b.issued_yen - v_c.amount_yen
      FROM held
     WHERE b.campaign_id = held.campaign_id AND b.stripe = held.stripe;
    EXIT WHEN FOUND;
    SELECT s.stripe INTO v_stripe FROM campaign_budgets s
     WHERE s.campaign_id = v_c.campaign_id AND s.issued_yen >= v_c.amount_yen
     ORDER BY s.issued_yen DESC LIMIT 1;
    IF NOT FOUND THEN
      RAISE EXCEPTION USING ERRCODE = 'internal_error', MESSAGE = format(
        'coupon_void: no budget stripe of campaign %s holds the coupon''s %s yen: run couponctl reconcile',
        v_c.campaign_id, v_c.amount_yen);
    END IF;
    UPDATE campaign_budgets SET issued_yen = issued_yen - v_c.amount_yen
     WHERE campaign_budgets.campaign_id = v_c.campaign_id AND stripe = v_stripe AND issued_yen >= v_c.amount_yen;
    EXIT WHEN FOUND;
  END LOOP;

  UPDATE issued_coupons c SET voided_at = issue_now(), voided_by = session_user, void_reason = p_reason,
         reissue_allowed = coalesce(p_allow_reissue, false)
   WHERE c.coupon_id = p_coupon_id
  RETURNING c.voided_at, c.voided_by INTO voided_at, voided_by;
  result := 'VOIDED';
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.outbox_claim(p_limit integer, p_run uuid, p_lease interval, p_due_at timestamp with time zone, p_key_window interval)
 RETURNS TABLE(coupon_id text, member_id text, attempts integer, campaign_id text, amount_yen integer, line_user_id text, key_expired boolean, prev_next_attempt_at timestamp with time zone, prev_first_pushed_at timestamp with time zone, trace_parent text, expires_at timestamp with time zone, skip_reason text)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
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
                WHEN i.expires_at <= issue_now() + p_lease THEN 'expired'
                WHEN l.line_user_id IS NULL THEN 'no_line_account' END AS skip_reason
      FROM due JOIN issued_coupons i ON i.coupon_id = due.coupon_id
           LEFT JOIN member_line_accounts l ON l.member_id = due.member_id
  )
  UPDATE notification_outbox o
     SET next_attempt_at = CASE WHEN j.skip_reason IS NULL THEN issue_now() + p_lease ELSE o.next_attempt_at END,
         claimed_by = CASE WHEN j.skip_reason IS NULL THEN p_run END,
         first_pushed_at = CASE WHEN j.skip_reason IS NULL THEN COALESCE(o.first_pushed_at, issue_now()) ELSE o.first_pushed_at END,
         skipped_at = CASE WHEN j.skip_reason IS NOT NULL THEN issue_now() END,
         skip_reason = j.skip_reason,
         last_error = CASE j.skip_reason
           WHEN 'voided' THEN 'skipped: the coupon was voided (couponctl coupon show)'
           WHEN 'expired' THEN 'skipped: the coupon expired before its push (couponctl coupon show)'
           WHEN 'no_line_account' THEN 'skipped: the member has no LINE account linked (couponctl line link, then outbox requeue)'
           ELSE o.last_error END
    FROM judged j
   WHERE outbox_claim_args_check(p_limit, p_run, p_lease, p_due_at, p_key_window) AND o.coupon_id = j.coupon_id
  RETURNING o.coupon_id::text, o.member_id, o.attempts, j.campaign_id, j.amount_yen, COALESCE(j.line_user_id, ''),
            j.skip_reason IS NULL AND COALESCE(o.first_pushed_at < issue_now() - p_key_window, false),
            j.next_attempt_at, j.first_pushed_at, o.trace_parent, j.expires_at, j.skip_reason
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.outbox_claim_args_check(p_limit integer, p_run uuid, p_lease interval, p_due_at timestamp with time zone, p_key_window interval)
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  PERFORM instant_check('outbox_claim', 'p_due_at', p_due_at);
  IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1000 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = format('outbox_claim: a limit of %s rows: want 1 to 1000', p_limit);
  ELSIF p_run IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = 'outbox_claim: the claiming run is required';
  ELSIF p_lease IS NULL OR p_lease <= interval '0' OR p_lease > interval '23 hours'
     OR p_key_window IS NULL OR p_key_window <= interval '0' OR p_key_window > interval '23 hours' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('outbox_claim: a lease of %s and a retry-key window of %s: want each above 0 and at most 23 hours', p_lease, p_key_window);
  ELSIF p_due_at IS NULL OR p_due_at > issue_now() + issue_clock_skew() THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('outbox_claim: due at %s, after the database''s clock (%s)', p_due_at, issue_now());
  END IF;
  RETURN true;
END
$function$
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.outbox_push_state(p_pruned timestamp with time zone, o notification_outbox)
 RETURNS text
 LANGUAGE sql
 STABLE
 SET search_path TO 'public', 'pg_temp'
AS $function$
  SELECT CASE WHEN p_pruned IS NOT NULL THEN 'pruned'
              WHEN o.coupon_id IS NULL THEN 'no outbox row'
              WHEN o.sent_at IS NOT NULL THEN 'sent'
              WHEN o.skipped_at IS NOT NULL THEN 'skipped'
              WHEN o.parked_at IS NOT NULL THEN 'parked'
              WHEN o.claimed_by IS NOT NULL AND o.next_attempt_at > issue_now() THEN 'in flight'
              ELSE 'not sent' END
$function$
-- +goose StatementEnd


-- The instants the campaigns hold, in range from now on (the tables refuse any other, 23514).
-- Those an earlier release took become their equal in range: an end or an expiry past the
-- range (infinity) is none, a start before it (-infinity) is none; any other moves to the
-- range's bound. Coupons stamped with an expiry past the range have none, as their campaign.
-- And every stamp a table gives by default comes from issue_now() (goose's own table aside).
-- Last in this migration, so that the tables are held briefly: the coupons' scan before any table
-- lock (row locks only), then every table in one statement, the stripes first, as the
-- issuance's judge reads them first (campaign_judge), then its tables in its order. The lock is
-- asked for 100 ms at a time and let go in between: a transaction that read a table and then
-- writes it (the issuance reads the stripes, then updates one; a void locks its coupon, then a
-- stripe) would otherwise queue behind this request while this one waits for it, a deadlock
-- (40P01) that aborted the migration beside live traffic. Letting go, it never waits past the
-- deadlock check (deadlock_timeout, 1 s), and no issuance waits more than 100 ms behind it.
UPDATE issued_coupons SET expires_at = CASE WHEN expires_at < '2000-01-01 00:00:00+09' THEN '2000-01-01 00:00:00+09'::timestamptz END
 WHERE NOT instant_in_range(expires_at);
-- +goose StatementBegin
DO $$
DECLARE
  v_until timestamptz := clock_timestamp() + interval '30 seconds';
BEGIN
  PERFORM set_config('lock_timeout', '100ms', true);
  LOOP
    BEGIN
      LOCK TABLE campaign_budgets, campaign_releases, campaigns, campaign_audience, issued_coupons, notification_outbox,
                 coupon_changes, member_line_accounts, coupon_rules, coupon_rules_changes, legacy_overshoot IN ACCESS EXCLUSIVE MODE;
      EXIT;
    EXCEPTION WHEN lock_not_available THEN
      IF clock_timestamp() > v_until THEN
        RAISE;
      END IF;
      PERFORM pg_sleep(random() * 0.1);
    END;
  END LOOP;
  PERFORM set_config('lock_timeout', '5s', true);
END $$;
-- +goose StatementEnd
UPDATE campaign_budgets
   SET starts_at = CASE WHEN instant_in_range(starts_at) THEN starts_at
                        WHEN starts_at >= '2200-01-01 00:00:00+09' THEN '2200-01-01 00:00:00+09'::timestamptz - interval '1 second' END,
       ends_at = CASE WHEN instant_in_range(ends_at) THEN ends_at
                      WHEN ends_at < '2000-01-01 00:00:00+09' THEN '2000-01-01 00:00:00+09'::timestamptz END,
       coupons_expire_at = CASE WHEN instant_in_range(coupons_expire_at) THEN coupons_expire_at
                                WHEN coupons_expire_at < '2000-01-01 00:00:00+09' THEN '2000-01-01 00:00:00+09'::timestamptz END
 WHERE NOT (instant_in_range(starts_at) AND instant_in_range(ends_at) AND instant_in_range(coupons_expire_at));
UPDATE campaign_releases
   SET at = CASE WHEN at < '2000-01-01 00:00:00+09' THEN '2000-01-01 00:00:00+09'::timestamptz
                 ELSE '2200-01-01 00:00:00+09'::timestamptz - interval '1 second' END
 WHERE NOT instant_in_range(at);
ALTER TABLE campaign_budgets ADD CONSTRAINT instants_in_range
  CHECK (instant_in_range(starts_at) AND instant_in_range(ends_at) AND instant_in_range(coupons_expire_at));
ALTER TABLE campaign_releases ADD CONSTRAINT instants_in_range CHECK (instant_in_range(at));
ALTER TABLE campaigns ALTER COLUMN created_at SET DEFAULT issue_now();
ALTER TABLE campaign_audience ALTER COLUMN added_at SET DEFAULT issue_now();
ALTER TABLE issued_coupons ALTER COLUMN issued_at SET DEFAULT issue_now();
ALTER TABLE notification_outbox ALTER COLUMN created_at SET DEFAULT issue_now(), ALTER COLUMN next_attempt_at SET DEFAULT issue_now();
ALTER TABLE coupon_changes ALTER COLUMN changed_at SET DEFAULT issue_now();
ALTER TABLE member_line_accounts ALTER COLUMN linked_at SET DEFAULT issue_now();
ALTER TABLE coupon_rules ALTER COLUMN changed_at SET DEFAULT issue_now();
ALTER TABLE coupon_rules_changes ALTER COLUMN changed_at SET DEFAULT issue_now();
ALTER TABLE legacy_overshoot ALTER COLUMN recorded_at SET DEFAULT issue_now();
-- A request's lapse, as console_decide judges it.
CREATE OR REPLACE VIEW campaign_change_requests AS
 SELECT r.request_id, r.campaign_id, r.kind, r.args, r.requested_by, r.request_reason, r.requested_at,
        CASE WHEN r.decision IS NOT NULL THEN r.decision
             WHEN issue_now() >= r.requested_at + change_request_lifetime() THEN 'lapsed'
             ELSE 'pending' END AS state,
        r.decided_by, r.decision_reason, r.decided_at, r.requested_at + change_request_lifetime() AS lapses_at
   FROM campaign_change_request_rows r;

-- The contracts of the functions above whose contract changed (00030 set the others').
COMMENT ON FUNCTION issue_coupons_batch_v2(text, uuid[], text[], timestamptz[], integer, text[]) IS
$$The previous release's issuance call, kept as a thin wrapper (docs/deploy.md, "Releases"): it
checks its arguments as before (issuance_args_check, 22023) and its issue times against the
database's clock (issue_clock: 22023 beyond issue_clock_skew()), then answers
issue_coupons_batch_v3's rows for p_campaign_id, p_coupon_ids, p_member_ids and p_trace_parents,
without their month and issued_at: the same results and columns as 00027's body. p_issued_at and
p_cap_yen decide nothing: the database's clock and coupon_rules do. Errors: those of the checks and
of issue_coupons_batch_v3. SECURITY DEFINER, executable by coupon_issue.$$;
COMMENT ON FUNCTION grant_coupons_batch_v2(text, uuid[], text[], timestamptz[], integer, text[]) IS
$$The previous release's grant call, kept as a thin wrapper: the checks of issue_coupons_batch_v2,
then grant_coupons_batch_v3's rows without their month and issued_at. SECURITY DEFINER, executable
by coupon_admin.$$;
COMMENT ON FUNCTION issuance_args_check(text, text, uuid[], text[], timestamptz[], text[]) IS
$$The previous release's argument check: issuance_args_check_v3's, then p_issued_at one time per
member from index 1 without NULLs. Errors: 22023 invalid_parameter_value naming p_fn and the
argument at fault.$$;
COMMENT ON FUNCTION issue_clock(text, timestamptz[]) IS
$$The previous release's issue times checked against the database's clock (issue_now()), read once:
22023 invalid_parameter_value, naming the calling function p_fn, for one more than
issue_clock_skew() from it; answered, one per element of p_issued_at, as that clock. Only the
wrappers of the previous release call it; issue_coupons_batch_v3 takes no issue time.$$;
COMMENT ON FUNCTION campaign_change_state(text, text, timestamptz, timestamptz, boolean, boolean, text) IS
$$Pauses (p_what 'pause'), resumes ('resume') or ends now ('end') campaign p_campaign_id, or moves
its period ('period': to p_starts and p_ends, each kept when p_set_starts or p_set_ends is false,
NULL an open bound), for reason p_reason. Once it commits, no coupon of the campaign commits while
its stripes show it inactive: the issuance judges the stripe it writes, and this change holds every
stripe (campaign_lock) until it commits. Under that lock it judges what may be done: a pause or a
resume of a campaign that has ended (its end or its coupons' expiry passed, at issue_now()) is
refused (campaign_refuse_ended): only a period or validity change reopens one. 'end' makes the
change's time (issue_now()) the campaign's ends_at. It answers the campaign_changes row, or none
when the campaign already was in that state. Errors: 22023 for an instant out of range
(instant_check) or another p_what, CI404 for no such campaign, CI422 for a pause or resume of an
ended campaign, ending a campaign that has not started or starts at this instant (pause it, or move its period), a start not
before the end, or a blank reason, 55P03 as campaign_lock. docs/design.md, "Changing a live
campaign". SECURITY DEFINER, executable by coupon_admin (couponctl campaign pause, resume, end,
update).$$;
COMMENT ON FUNCTION campaign_change_budget(text, bigint, bigint, integer, text) IS
$$Lays campaign p_campaign_id's budget out anew: p_budget_yen in yen (NULL keeps it), or the budget
in force plus p_add_yen (negative cuts), over p_stripes budget stripes (NULL keeps their number,
1 to 64), for reason p_reason. Both the budget and the issued yen are spread over the stripes in
whole coupons, as evenly as possible (yen no coupon can use stay on stripe 0), so every stripe
keeps issued_yen <= budget_yen, the stripes sum to exactly the new budget, and the issued yen,
summed, stay what they were. A stripe it adds gets stripe 0's definition. It answers one
campaign_changes row per thing changed ('budget', 'stripes'), none when nothing changed. Errors:
CI404 for no such campaign, CI422, changing nothing, for a campaign that has ended (judged under
its lock, campaign_refuse_ended), a budget and an add together, a budget below the yen already
issued, below one coupon or above 2,147,483,647 yen, a number of stripes outside 1 to 64 or above
the budget's coupons, or a blank reason, 55P03 as campaign_lock. R1, and docs/design.md,
"Changing a live campaign". SECURITY DEFINER, executable by coupon_admin (couponctl campaign
update).$$;
COMMENT ON FUNCTION campaign_release_add(text, timestamptz, integer, text) IS
$$Releases p_coupons more coupons of campaign p_campaign_id at instant p_at, for reason p_reason,
and answers the 'release' campaign_changes row. It locks stripe 0 (FOR UPDATE), as every change of
a campaign does, so that two adds, or an add and a budget change, read each other's result, and
issuances do not wait for it, since an instant in the future binds no issuance in flight. Errors:
22023 for an instant out of range (instant_check), CI404 for an unknown campaign, CI422 for a
campaign that has ended (campaign_refuse_ended), one created without releases (it issues its whole
budget from its start), an instant not after the database's clock (issue_now()), at or after the
campaign's end, or already used, a count below 1, releases summing above the budget's coupons, or
a blank reason, 55P03 when stripe 0 waits past the lock_timeout. docs/design.md, "Lock order" and
"Releases, audiences and the dry run". SECURITY DEFINER, executable by coupon_admin (couponctl
campaign update --release).$$;
COMMENT ON FUNCTION campaign_change_validity(text, integer, timestamptz, text) IS
$$Sets the validity campaign p_campaign_id gives the coupons issued from now on: p_valid_days
Asia/Tokyo days (1 to 3650), or until p_expire_at, or none (both NULL), for reason p_reason.
Coupons already issued keep theirs. A later expiry reopens a campaign that its expiry ended. It
takes the change protocol (campaign_lock) and answers the campaign_changes row, or none when the
validity is unchanged. Errors: 22023 for an instant out of range (instant_check), CI404 for no
such campaign, CI422 for both at once, days out of range, an instant that has passed at
issue_now() (coupons would be issued expired) or a blank reason, 55P03 as campaign_lock.
docs/design.md, "Voids, expiry and grants". SECURITY DEFINER, executable by coupon_admin
(couponctl campaign update).$$;
COMMENT ON FUNCTION campaign_create(text, integer, integer, integer, timestamptz, timestamptz, integer, timestamptz, text) IS
$$Creates campaign p_campaign_id, open to every member and without releases: p_discount_yen yen a
coupon, p_budget_yen yen of budget over p_stripes budget stripes (1 to 64, each an equal share of
whole coupons, the first stripes one more, the yen that make no whole coupon on stripe 0), active
from p_starts to p_ends (NULL: unbounded), its coupons valid p_valid_days Asia/Tokyo days (1 to
3650) or until p_expire_at (or no validity), for reason p_reason. It answers the 'create'
campaign_changes row. Errors: 22023 for an instant out of range (instant_check), CI422 for a
malformed id, a discount not positive, a budget below one coupon, stripes out of range or above
the budget's coupons, days out of range, both validities, a start not before the end, a fixed
expiry that has passed at issue_now(), or a blank reason (internal/ops/campaign's Validate
refuses the same but the expiry, which the database's clock judges), CI409 (message 'exists') for a
campaign id that exists. It waits only for a concurrent create of the same id. R1; docs/design.md,
"Lock order". SECURITY DEFINER, executable by coupon_admin (couponctl campaign create; the
12-argument form calls it).$$;
COMMENT ON FUNCTION campaign_create(text, integer, integer, integer, timestamptz, timestamptz, integer, timestamptz, text, timestamptz[], integer[], boolean) IS
$$Creates a campaign as the 9-argument campaign_create does, then gives it releases and an
audience: p_release_coupons[k] coupons released at p_release_at[k] (both NULL or empty: no
schedule, the whole budget from the start; coupons not taken roll over, and budget_yen still caps
everything), and p_audience_only (true: only the members of campaign_audience may be issued it).
Both are set once, here, and never changed, so a read of them (on stripe 0) needs no lock. Its
'create' history row names the releases and the audience. Errors: the 9-argument form's, 22023 for
a release instant out of range (instant_check), and CI422 for release arrays of unequal length,
with NULLs or not one dimension from index 1, a NULL p_audience_only, a release of fewer than 1
coupon, at or after the campaign's end, two releases at one instant, or releases summing above the
budget's coupons (budget_yen / discount_yen). docs/design.md, "Releases, audiences and the dry
run". SECURITY DEFINER, executable by coupon_admin (couponctl campaign create with its release and
audience flags).$$;
COMMENT ON FUNCTION console_period(text, timestamptz, timestamptz, text, text) IS
$$Asks to move campaign p_campaign_id's period to start at p_starts and end at p_ends (NULL keeps
that bound), for the person p_operator (an operator or approver) and reason p_reason: always a
request (applied false, its request_id), applied by console_decide through campaign_change_state
once a different approver approves it. Errors: 22023 for an instant out of range (instant_check,
judged first), 42501 for a viewer, CI404 for no such campaign, CI422 for a malformed email, no
bound given, a start not before the end or a blank reason. docs/roles.md, "The console". SECURITY
DEFINER, executable by coupon_console.$$;
COMMENT ON FUNCTION outbox_claim_args_check(integer, uuid, interval, timestamptz, interval) IS
$$Refuses, with 22023 invalid_parameter_value, outbox_claim's arguments that shared/outbox never
sends: a due time p_due_at out of range (instant_check), a limit p_limit outside 1 to 1000 rows
(RELAY_BATCH_SIZE's range), no run p_run, a lease p_lease or a retry-key window p_key_window not
above 0 and at most 23 hours (inside LINE's 24), a due time missing or after the database's clock
(issue_now()) plus issue_clock_skew(): a caller's clock would claim rows before they are due. It
answers true, so that the claim's UPDATE gates on it in its WHERE, a one-time filter evaluated
before any row is read (00021).$$;
COMMENT ON FUNCTION console_budget(text, bigint, bigint, integer, text, text) IS
$$Changes campaign p_campaign_id's budget (p_budget_yen yen, or p_add_yen yen added, negative
cuts) and stripes (p_stripes), as campaign_change_budget takes them, for the person p_operator (an
operator or approver) and reason p_reason. A raise of more than coupon_rules.approval_above_yen
over the budget in force becomes a request instead (applied false, its request_id), which
console_decide applies once a different approver approves it. Otherwise the change is applied
(applied true, request_id NULL) and its history rows name the person. It reads the line
(coupon_rules, ACCESS SHARE) before it locks the stripes, as an issuance reads the cap, then
judges the change on what it holds: a campaign that has ended is refused before any request is
filed (campaign_refuse_ended). Errors: 42501 for a viewer, CI422 for a malformed email, nothing to
change, a budget and an add together, a blank reason or an ended campaign, otherwise
campaign_change_budget's, and 55P03 after operator_lock_timeout's 1 s. R1; docs/roles.md, "The
console"; docs/design.md, "Lock order". SECURITY DEFINER, executable by coupon_console.$$;
COMMENT ON FUNCTION release_next(text, timestamptz, timestamptz, timestamptz, timestamptz) IS
$$The first instant after p_now at which campaign p_campaign_id's releases (campaign_releases) open
more coupons: a release opens at its instant, or at the campaign's start p_starts if that is
later, and never at or after its end p_ends or its coupons' fixed expiry p_until. NULL when none
is to come. campaign_judge's next_release_at, which the issuance, the dry run and campaign_state
answer (00027, docs/api.md, "Releases and audiences"). Errors: 22023 for an instant out of range
(instant_check). Executable by coupon_admin and coupon_console, whose releases before 00031 read
it; this release's read campaign_state.$$;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
