-- +goose NO TRANSACTION
-- +goose Up
-- A lone issuance's database CPU, cut (issue 42; docs/performance.md, "A lone issuance's
-- PostgreSQL CPU, cut (00038)"). Same signatures, answers and lock order: the previous release
-- calls every function unchanged.
--
-- The id and month formats of the two tables every issuance writes, checked without regular
-- expressions. PostgreSQL matched '^[!-~]{1,128}$' (its counted repetition) in 15 us a row for
-- ids of 2-7 characters and 44 us for ids of 34-39. Each statement that writes a table also reads
-- and plans every CHECK of the table again (ExecRelCheck: stringToNode, ExecPrepareExpr), so a
-- format is a call of an IMMUTABLE PL/pgSQL function, a tree of two nodes, rather than the
-- expression itself (the same tests written inline cost an insert twice the regexes'). Each
-- accepts what 00002's regex accepted on a database of locale C, as the tests' is
-- (TestPlainChecksAcceptWhatTheRegexesAccepted, schema/check_formats_test.go, over every ASCII
-- character, non-ASCII digits, the lengths at the bounds and every month 0000-00 to 9999-13);
-- where a locale's \d takes other digits (an ICU one), the new month is stricter, and only the
-- database writes months (to_char of its clock).
--
-- How a CHECK is replaced on a big table without locking issuance out (PostgreSQL 15 docs, ALTER
-- TABLE, "ADD table_constraint ... NOT VALID", "VALIDATE CONSTRAINT"): goose runs this file
-- statement by statement outside a transaction (NO TRANSACTION above), on one connection, so that
-- each lock is held only by its own statement; the tables in the issuance's lock order
-- (docs/design.md, "Lock order"), one at a time, each under lock_timeout (55P03 rather than queue
-- issuances behind a long transaction; couponctl migrate tries again).
--   1. The new CHECK is added NOT VALID under a name of its own: an ACCESS EXCLUSIVE lock for a
--      moment, no scan; new rows are checked from then on.
--   2. A month's CHECK is validated: a scan under SHARE UPDATE EXCLUSIVE, beside issuance. The
--      member id's stays NOT VALID, as 00002's was: legacy rows were never held to it.
--   3. The old CHECK is dropped and the new one takes its name, in one transaction.
-- Every step can run again: run couponctl migrate again after any failure.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION month_format_ok(p_month text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
  RETURN length(p_month) = 7 AND substr(p_month, 5, 1) = '-'
     AND ltrim(substr(p_month, 1, 4) || substr(p_month, 6, 2), '0123456789') = ''
     AND substr(p_month, 6, 2) COLLATE "C" BETWEEN '01' AND '12';
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION month_format_ok(text) IS
'Whether p_month is a month as the schema stores one: YYYY-MM, four ASCII digits, a dash, 01 to 12 '
'(NULL for NULL). The CHECK month_format of issued_coupons and member_monthly_usage (00038, in place '
'of 00002''s regular expression). IMMUTABLE, raises nothing.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION member_id_format_ok(p_member_id text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
  RETURN length(p_member_id) BETWEEN 1 AND 128
     AND ltrim(p_member_id, '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!"#$%&''()*+,-./:;<=>?@[\]^_`{|}~') = '';
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION member_id_format_ok(text) IS
'Whether p_member_id is a member id as the schema stores one: 1-128 characters of visible ASCII '
'(0x21-0x7E; NULL for NULL). The CHECK member_id_format of issued_coupons and member_monthly_usage '
'(00038, in place of 00002''s regular expression; docs/api.md, member_id). IMMUTABLE, raises nothing.';

-- The issuance's body, leaner for a member alone (00033's otherwise): its arguments checked in
-- the body, issuance_args_check_v3 called only for the message of a fault; the judge's answers
-- taken in one statement instead of a loop over its rows; no arrays filled before. Replacing a
-- function takes no lock that a running issuance holds.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION issue_coupons_batch_v3(p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_trace_parents text[])
 RETURNS TABLE(i integer, result text, coupon text, amount integer, reason text, expires_at timestamp with time zone, next_release_at timestamp with time zone, month text, issued_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
  n          integer := cardinality(p_member_ids);
  v_at       timestamptz;   -- the issue time: the database's clock as the call starts
  v_month    text;          -- R3's month: v_at's Asia/Tokyo calendar month
  v_cap      integer;       -- R3's cap, read after the lock on coupon_rules
  v          campaign_verdict; -- the judge's verdict on the campaign, as the call starts
  v_later    campaign_verdict; -- and again, for the members not placed
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
  -- The arguments, as issuance_args_check_v3 checks them; it is called only when one fails, for
  -- its message (22023).
  IF NOT coalesce(length(p_campaign_id) BETWEEN 1 AND 64 AND p_campaign_id !~ '[^A-Za-z0-9_-]'
                  AND n BETWEEN 1 AND issuance_batch_max() AND arg_array_fits(p_member_ids, n, false)
                  AND arg_array_fits(p_coupon_ids, n, false) AND arg_array_fits(p_trace_parents, n, true), false) THEN
    PERFORM issuance_args_check_v3('issue_coupons_batch_v3', p_campaign_id, p_coupon_ids, p_member_ids, p_trace_parents);
  END IF;
  FOR k IN 1 .. n LOOP
    IF NOT coalesce(length(p_member_ids[k]) BETWEEN 1 AND 128 AND p_member_ids[k] !~ '[^!-~]'
                    AND array_position(p_coupon_ids, p_coupon_ids[k], k + 1) IS NULL
                    AND (p_trace_parents[k] IS NULL
                         OR length(p_trace_parents[k]) = 55 AND substr(p_trace_parents[k], 36, 1) = '-'
                            AND substr(p_trace_parents[k], 53, 1) = '-' AND p_trace_parents[k] ~ '^00-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+$'), false) THEN
      PERFORM issuance_args_check_v3('issue_coupons_batch_v3', p_campaign_id, p_coupon_ids, p_member_ids, p_trace_parents);
    END IF;
  END LOOP;
  v_at := issue_now();
  v_month := to_char(v_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM');
  v_cap := monthly_cap_yen();
  IF n = 1 THEN
    v_first := '{1}';
  ELSE
    SELECT array_agg(x.f ORDER BY x.o) INTO v_first
      FROM (SELECT u.o, min(u.o) OVER (PARTITION BY u.m) AS f FROM unnest(p_member_ids) WITH ORDINALITY AS u(m, o)) x;
  END IF;

  -- The one judge, on the committed state: what each member would be answered now.
  SELECT * INTO v FROM campaign_judge(p_campaign_id, v_at);
  -- Its answers in one statement, an array each, entry order; v_res NULL where AVAILABLE (still
  -- to be issued), v_tried the members to issue.
  SELECT array_agg(nullif(j.result, 'AVAILABLE') ORDER BY j.i), array_agg(j.coupon ORDER BY j.i),
         array_agg(j.reason ORDER BY j.i), array_agg(j.expires_at ORDER BY j.i), array_agg(j.next_release_at ORDER BY j.i),
         count(*) FILTER (WHERE j.result = 'AVAILABLE' AND v_first[j.i] = j.i)
    INTO v_res, v_cpn, v_rsn, v_exp, v_nxt, v_tried
    FROM issue_judge(v, p_member_ids, v_at, v_cap) j;
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
      -- the rows it prefetches), in any order, locked and written in one statement. Each stripe is
      -- judged at the clock as it is locked (greatest(v_at, issue_now()) in the statement, never
      -- an instant read before it): issue_now() is volatile, so PostgreSQL reads it again when it
      -- re-checks a row that a change committed meanwhile (READ COMMITTED's recheck), and an end
      -- or a period move that committed first is seen at an instant after its own.
      WITH free AS (
        SELECT s.stripe, least((s.budget_yen - s.issued_yen) / v.discount_yen, cardinality(v_left),
                               CASE WHEN v.releases THEN release_room(p_campaign_id, s.stripe, s.issued_yen / v.discount_yen, greatest(v_at, issue_now())) END) AS take
          FROM campaign_budgets s
         WHERE s.campaign_id = p_campaign_id AND s.stripe <> ALL (v_taken) AND s.issued_yen + v.discount_yen <= s.budget_yen
           AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, greatest(v_at, issue_now())) IS NULL
           AND (NOT v.releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v.discount_yen, greatest(v_at, issue_now())) > 0)
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
      SELECT s.stripe INTO v_stripe FROM campaign_budgets s
       WHERE s.campaign_id = p_campaign_id AND s.stripe > v_held AND s.issued_yen + v.discount_yen <= s.budget_yen
         AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, greatest(v_at, issue_now())) IS NULL
         AND (NOT v.releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v.discount_yen, greatest(v_at, issue_now())) > 0)
       ORDER BY CASE WHEN v_held < 0 THEN random() ELSE s.stripe END LIMIT 1;
      EXIT WHEN NOT FOUND;
      -- Locked with a wait: judged, as above, at the clock once the lock is held.
      SELECT least((s.budget_yen - s.issued_yen) / v.discount_yen,
                   CASE WHEN v.releases THEN release_room(p_campaign_id, s.stripe, s.issued_yen / v.discount_yen, greatest(v_at, issue_now())) END)
        INTO v_room FROM campaign_budgets s
       WHERE s.campaign_id = p_campaign_id AND s.stripe = v_stripe AND s.issued_yen + v.discount_yen <= s.budget_yen
         AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, s.coupons_expire_at, greatest(v_at, issue_now())) IS NULL
         AND (NOT v.releases OR release_room(p_campaign_id, s.stripe, s.issued_yen / v.discount_yen, greatest(v_at, issue_now())) > 0)
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
$function$;
-- +goose StatementEnd
COMMENT ON FUNCTION issue_coupons_batch_v3(text, uuid[], text[], text[]) IS
'IssueCoupon''s transaction, for one request or a coalesced group of one campaign, in one call: '
'gives each member of p_member_ids (1 to issuance_batch_max(); a member given twice is answered '
'once, later entries ALREADY_ISSUED) a coupon of campaign p_campaign_id with id p_coupon_ids[k] '
'(made by the service) and outbox trace p_trace_parents[k], or says why not. The issue time is '
'issue_now() as the call starts, R3''s cap the rule setting (monthly_cap_yen): neither is an '
'argument. issue_judge decides each refusal on the committed state; then, in the lock order of '
'docs/design.md "Lock order": the audience rows (first), the coupons (R2: one live coupon per '
'pair, a conflict answered ALREADY_ISSUED or COUPON_VOIDED), the member x month rows (R3: added '
'within the cap), the outbox rows (the transactional outbox), the budget stripes (R1, last; '
'each judged active, and a release''s coupons never before its instant, at the clock as the '
'stripe is held). Answers one row per entry: i from 1, result '
'(ISSUED, a refusal of issue_judge, or RETRY: send the member again), coupon, amount (ISSUED), '
'reason (CAMPAIGN_NOT_ACTIVE), expires_at, next_release_at (BUDGET_EXCEEDED, NOT_STARTED), '
'month and issued_at (ISSUED: the Asia/Tokyo month and the instant the database stamped). '
'Errors: 22023 for malformed arguments (as issuance_args_check_v3 checks them, which names '
'the fault); 55P03, 40P01, 57014 as the '
'session''s timeouts say (the service''s retry policy: shared/issuance/run.go, Service.run).';

SET lock_timeout = '3s';

ALTER TABLE issued_coupons DROP CONSTRAINT IF EXISTS month_format_plain, DROP CONSTRAINT IF EXISTS member_id_format_plain,
  ADD CONSTRAINT month_format_plain CHECK (month_format_ok(month)) NOT VALID,
  ADD CONSTRAINT member_id_format_plain CHECK (member_id_format_ok(member_id)) NOT VALID;

ALTER TABLE issued_coupons VALIDATE CONSTRAINT month_format_plain;

-- +goose StatementBegin
DO $$
BEGIN
  ALTER TABLE issued_coupons DROP CONSTRAINT IF EXISTS month_format, DROP CONSTRAINT IF EXISTS member_id_format;
  ALTER TABLE issued_coupons RENAME CONSTRAINT month_format_plain TO month_format;
  ALTER TABLE issued_coupons RENAME CONSTRAINT member_id_format_plain TO member_id_format;
END $$;
-- +goose StatementEnd

ALTER TABLE member_monthly_usage DROP CONSTRAINT IF EXISTS month_format_plain, DROP CONSTRAINT IF EXISTS member_id_format_plain,
  ADD CONSTRAINT month_format_plain CHECK (month_format_ok(month)) NOT VALID,
  ADD CONSTRAINT member_id_format_plain CHECK (member_id_format_ok(member_id)) NOT VALID;

ALTER TABLE member_monthly_usage VALIDATE CONSTRAINT month_format_plain;

-- +goose StatementBegin
DO $$
BEGIN
  ALTER TABLE member_monthly_usage DROP CONSTRAINT IF EXISTS month_format, DROP CONSTRAINT IF EXISTS member_id_format;
  ALTER TABLE member_monthly_usage RENAME CONSTRAINT month_format_plain TO month_format;
  ALTER TABLE member_monthly_usage RENAME CONSTRAINT member_id_format_plain TO member_id_format;
END $$;
-- +goose StatementEnd

RESET lock_timeout;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
