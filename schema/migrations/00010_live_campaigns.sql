-- +goose Up
-- Live campaigns (docs/design.md, "Changing a live campaign"): an operator raises or cuts a
-- budget, re-stripes it, pauses, resumes, ends it now or moves its period while IssueCoupon runs
-- at full rate. Each change is one call of a function below, run as coupon_admin, and writes its
-- row of campaign_changes in the same transaction.
--
-- The lock protocol of every change: stripe 0 of the campaign FOR UPDATE first (it serializes the
-- changes of one campaign), then, in a new statement that sees every stripe committed meanwhile,
-- all its stripes FOR UPDATE in stripe order; two changes of one campaign queue on stripe 0. Why
-- it never deadlocks with an issuance, one member's or (from 00013) a batch's, which holds
-- stripes while it waits for a higher one: docs/design.md, "Lock order", which has every
-- writer's protocol. The functions' current definitions are in schema/current.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue readers behind a long transaction

-- paused_at: when an operator paused the campaign (NULL when not paused), written alike on every
-- stripe, as discount_yen, starts_at and ends_at are.
ALTER TABLE campaign_budgets ADD COLUMN paused_at timestamptz;

-- campaign_changes: the campaign's history, oldest first by change_id. changed_at is taken once
-- the change holds the campaign's stripes, so change_id and changed_at follow commit order;
-- changed_by is the database login (on Cloud SQL, the operator's IAM user), whatever role the
-- function runs as.
CREATE TABLE campaign_changes (
  change_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  campaign_id text NOT NULL REFERENCES campaigns,
  changed_at  timestamptz NOT NULL,
  changed_by  text NOT NULL,
  what        text NOT NULL CONSTRAINT what_known CHECK (what IN ('budget', 'stripes', 'period', 'pause', 'resume', 'end')),
  before      jsonb NOT NULL,
  after       jsonb NOT NULL,
  reason      text NOT NULL CONSTRAINT reason_given CHECK (btrim(reason) <> '')
);
CREATE INDEX campaign_changes_campaign ON campaign_changes (campaign_id, change_id);

-- campaign_inactive_reason is why a campaign whose stripe holds p_starts, p_ends and p_paused
-- issues no coupon at p_at: ENDED, PAUSED or NOT_STARTED (docs/api.md, CAMPAIGN_NOT_ACTIVE's
-- reason), or NULL when it is active.
CREATE FUNCTION campaign_inactive_reason(p_starts timestamptz, p_ends timestamptz, p_paused timestamptz, p_at timestamptz)
RETURNS text LANGUAGE sql IMMUTABLE
RETURN CASE WHEN p_ends IS NOT NULL AND p_at >= p_ends THEN 'ENDED'
            WHEN p_paused IS NOT NULL THEN 'PAUSED'
            WHEN p_starts IS NOT NULL AND p_at < p_starts THEN 'NOT_STARTED' END;

-- issue_coupon, as 00009 made it, with CAMPAIGN_NOT_ACTIVE judged twice: by the reads, at the
-- request's time, and on the budget stripe the call writes, as R1 is. The stripe's add commits
-- only while the stripe shows the campaign active, both at the request's time and at the moment
-- of the write (clock_timestamp(), the database's clock): a change that paused or ended the
-- campaign holds every stripe until it commits, so an issuance that writes a stripe after it
-- re-reads the stripe (EvalPlanQual) and is refused. The new OUT column reason names why.
-- 00011 replaces it again (schema/current/issue_coupon.sql is what a migrated database runs).
DROP FUNCTION issue_coupon(uuid, text, text, timestamptz, integer, text);
-- +goose StatementBegin
CREATE FUNCTION issue_coupon(
  p_coupon_id uuid, p_campaign_id text, p_member_id text, p_issued_at timestamptz,
  p_cap_yen integer, p_trace_parent text,
  OUT result text, OUT coupon text, OUT amount integer, OUT reason text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_month   text := to_char(p_issued_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM');
  v_stripes integer;
  v_stripe  smallint;
  v_coupon  uuid;
  v_done    boolean := false;
BEGIN
  IF p_coupon_id IS NULL OR p_campaign_id IS NULL OR p_member_id IS NULL OR p_issued_at IS NULL
     OR p_cap_yen IS NULL OR p_cap_yen <= 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'issue_coupon: the ids and the issue time are required, and the cap must be positive yen';
  END IF;

  -- Reads: what the committed state already refuses.
  SELECT b.discount_yen, campaign_inactive_reason(b.starts_at, b.ends_at, b.paused_at, p_issued_at),
         (SELECT count(*) FROM campaign_budgets s WHERE s.campaign_id = b.campaign_id)
    INTO amount, reason, v_stripes
    FROM campaign_budgets b
   WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  IF NOT FOUND THEN
    result := 'UNKNOWN_CAMPAIGN'; amount := NULL; RETURN;
  END IF;
  SELECT c.coupon_id::text INTO coupon
    FROM issued_coupons c
   WHERE c.campaign_id = p_campaign_id AND c.member_id = p_member_id AND NOT c.legacy_duplicate;
  IF FOUND THEN
    result := 'ALREADY_ISSUED'; amount := NULL; reason := NULL; RETURN;
  ELSIF reason IS NOT NULL THEN
    result := 'CAMPAIGN_NOT_ACTIVE'; amount := NULL; RETURN;
  END IF;
  IF amount > p_cap_yen OR EXISTS (
       SELECT 1 FROM member_monthly_usage u
        WHERE u.member_id = p_member_id AND u.month = v_month AND u.used_yen + amount > p_cap_yen) THEN
    result := 'MONTHLY_CAP'; amount := NULL; RETURN;
  END IF;
  IF NOT EXISTS (
       SELECT 1 FROM campaign_budgets s
        WHERE s.campaign_id = p_campaign_id AND s.issued_yen + amount <= s.budget_yen) THEN
    result := 'BUDGET_EXCEEDED'; amount := NULL; RETURN;
  END IF;

  -- R2: the coupon; the unique index judges.
  INSERT INTO issued_coupons AS c (coupon_id, campaign_id, member_id, month, amount_yen, issued_at)
  VALUES (p_coupon_id, p_campaign_id, p_member_id, v_month, amount, p_issued_at)
  ON CONFLICT (campaign_id, member_id) WHERE NOT legacy_duplicate DO NOTHING
  RETURNING c.coupon_id INTO v_coupon;
  IF NOT FOUND THEN
    -- A concurrent request of the same member committed its coupon while this insert waited.
    SELECT c.coupon_id::text INTO coupon
      FROM issued_coupons c
     WHERE c.campaign_id = p_campaign_id AND c.member_id = p_member_id AND NOT c.legacy_duplicate;
    result := 'ALREADY_ISSUED'; amount := NULL; RETURN;
  END IF;

  -- R3: the member x month row, created with this coupon or added to within the cap.
  INSERT INTO member_monthly_usage AS u (member_id, month, used_yen)
  VALUES (p_member_id, v_month, amount)
  ON CONFLICT (member_id, month) DO UPDATE SET used_yen = u.used_yen + EXCLUDED.used_yen
   WHERE u.used_yen + EXCLUDED.used_yen <= p_cap_yen;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI409', MESSAGE = 'MONTHLY_CAP',
      DETAIL = 'a concurrent issuance used the member''s room this month';
  END IF;

  -- The transactional outbox row: the push is RelayOutbox's, after COMMIT.
  INSERT INTO notification_outbox (coupon_id, member_id, created_at, trace_parent)
  VALUES (v_coupon, p_member_id, p_issued_at, p_trace_parent);

  -- R1 and the campaign's state: one budget stripe, last, written only while it has room and
  -- shows the campaign active; the COMMIT follows as the call returns. A campaign of one stripe
  -- tries stripe 0 first; otherwise, or when that fails (a re-stripe may have moved its room), a
  -- stripe with room that nobody holds (FOR UPDATE SKIP LOCKED), else a wait for one that the
  -- committed state shows with room, starting over if its holder took that room.
  IF v_stripes <= 1 THEN
    UPDATE campaign_budgets SET issued_yen = issued_yen + amount
     WHERE campaign_id = p_campaign_id AND stripe = 0 AND issued_yen + amount <= budget_yen
       AND campaign_inactive_reason(starts_at, ends_at, paused_at, greatest(p_issued_at, clock_timestamp())) IS NULL;
    v_done := FOUND;
  END IF;
  WHILE NOT v_done LOOP
    WITH free AS (
      SELECT s.campaign_id, s.stripe FROM campaign_budgets s
       WHERE s.campaign_id = p_campaign_id AND s.issued_yen + amount <= s.budget_yen
         AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, greatest(p_issued_at, clock_timestamp())) IS NULL
       ORDER BY random() LIMIT 1
         FOR UPDATE SKIP LOCKED)
    UPDATE campaign_budgets b SET issued_yen = b.issued_yen + amount
      FROM free
     WHERE b.campaign_id = free.campaign_id AND b.stripe = free.stripe;
    EXIT WHEN FOUND;
    -- Every stripe with room is held: wait for one that the committed state shows with room.
    SELECT s.stripe INTO v_stripe FROM campaign_budgets s
     WHERE s.campaign_id = p_campaign_id AND s.issued_yen + amount <= s.budget_yen
       AND campaign_inactive_reason(s.starts_at, s.ends_at, s.paused_at, greatest(p_issued_at, clock_timestamp())) IS NULL
     ORDER BY random() LIMIT 1;
    IF NOT FOUND THEN
      SELECT campaign_inactive_reason(b.starts_at, b.ends_at, b.paused_at, greatest(p_issued_at, clock_timestamp()))
        INTO reason FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
      IF reason IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'CI409', MESSAGE = 'CAMPAIGN_NOT_ACTIVE', DETAIL = reason;
      END IF;
      RAISE EXCEPTION USING ERRCODE = 'CI409', MESSAGE = 'BUDGET_EXCEEDED',
        DETAIL = 'concurrent issuances took the campaign''s last room';
    END IF;
    UPDATE campaign_budgets SET issued_yen = issued_yen + amount
     WHERE campaign_id = p_campaign_id AND stripe = v_stripe AND issued_yen + amount <= budget_yen
       AND campaign_inactive_reason(starts_at, ends_at, paused_at, greatest(p_issued_at, clock_timestamp())) IS NULL;
    v_done := FOUND;
  END LOOP;
  result := 'ISSUED';
  coupon := v_coupon::text;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION issue_coupon(uuid, text, text, timestamptz, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION issue_coupon(uuid, text, text, timestamptz, integer, text) TO coupon_issue;

-- campaign_lock's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION campaign_lock(p_campaign_id text) RETURNS SETOF campaign_budgets
LANGUAGE plpgsql VOLATILE
SET search_path = public, pg_temp
AS $$
BEGIN
  PERFORM 1 FROM campaign_budgets WHERE campaign_id = p_campaign_id AND stripe = 0 FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI404', MESSAGE = format('campaign %s does not exist', p_campaign_id);
  END IF;
  RETURN QUERY SELECT * FROM campaign_budgets WHERE campaign_id = p_campaign_id ORDER BY stripe FOR UPDATE;
END
$$;
-- +goose StatementEnd

-- campaign_change_record's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION campaign_change_record(p_campaign_id text, p_at timestamptz, p_what text,
  p_before jsonb, p_after jsonb, p_reason text) RETURNS campaign_changes
LANGUAGE plpgsql VOLATILE
SET search_path = public, pg_temp
AS $$
DECLARE
  v_row campaign_changes;
BEGIN
  IF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every change needs a reason (--reason TEXT)';
  END IF;
  INSERT INTO campaign_changes (campaign_id, changed_at, changed_by, what, before, after, reason)
  VALUES (p_campaign_id, p_at, session_user, p_what, p_before, p_after, p_reason)
  RETURNING * INTO v_row;
  RETURN v_row;
END
$$;
-- +goose StatementEnd

-- campaign_change_budget's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION campaign_change_budget(p_campaign_id text, p_budget_yen bigint, p_add_yen bigint,
  p_stripes integer, p_reason text) RETURNS SETOF campaign_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
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
  v_at := clock_timestamp();
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
    INSERT INTO campaign_budgets (campaign_id, stripe, discount_yen, budget_yen, issued_yen, starts_at, ends_at, paused_at)
    VALUES (p_campaign_id, i, v_first.discount_yen, v_b, v_n, v_first.starts_at, v_first.ends_at, v_first.paused_at)
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
$$;
-- +goose StatementEnd

-- campaign_change_state's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION campaign_change_state(p_campaign_id text, p_what text, p_starts timestamptz,
  p_ends timestamptz, p_set_starts boolean, p_set_ends boolean, p_reason text) RETURNS SETOF campaign_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_first  campaign_budgets;
  v_at     timestamptz;
  v_starts timestamptz;
  v_ends   timestamptz;
  v_paused timestamptz;
BEGIN
  PERFORM FROM campaign_lock(p_campaign_id);
  SELECT * INTO v_first FROM campaign_budgets WHERE campaign_id = p_campaign_id AND stripe = 0;
  v_at := clock_timestamp();
  v_starts := v_first.starts_at;
  v_ends := v_first.ends_at;
  v_paused := v_first.paused_at;
  CASE p_what
  WHEN 'pause' THEN
    v_paused := coalesce(v_paused, v_at);
  WHEN 'resume' THEN
    v_paused := NULL;
  WHEN 'end' THEN
    IF v_starts > v_at THEN
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
$$;
-- +goose StatementEnd

-- Roles (docs/roles.md): only coupon_admin changes a campaign, and only through the two
-- functions above, so that no change escapes the history; it reads the history. coupon_issue
-- reads paused_at with the rest of campaign_budgets (00008's SELECT) and nothing else here.
REVOKE ALL ON FUNCTION campaign_lock(text), campaign_change_record(text, timestamptz, text, jsonb, jsonb, text),
  campaign_change_budget(text, bigint, bigint, integer, text),
  campaign_change_state(text, text, timestamptz, timestamptz, boolean, boolean, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION campaign_change_budget(text, bigint, bigint, integer, text),
  campaign_change_state(text, text, timestamptz, timestamptz, boolean, boolean, text) TO coupon_admin;
GRANT SELECT ON campaign_changes TO coupon_admin;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
