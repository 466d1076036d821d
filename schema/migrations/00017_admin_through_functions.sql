-- +goose Up
-- Operators change a campaign's rows only through functions that write its history
-- (docs/roles.md): coupon_admin loses its own INSERT of campaigns and budget stripes and its own
-- writes of the R1 and R3 counters. One INSERT of a stripe row for a live campaign raised a
-- 3,000-yen budget to 1,003,000 yen with no campaign_changes row, and an UPDATE of issued_yen
-- could reset a counter under its coupons.
--   campaign_create    creates a campaign and its stripes, with a 'create' history row
--   counters_repair    `couponctl reconcile --repair`: rebuilds drifted counters from the live
--                      coupons, with a 'repair' history row per campaign it changes
--   campaign_change_budget (00010) now gives a stripe it adds the campaign's validity (it left
--                      coupon_valid_days and coupons_expire_at NULL on the new stripes); the
--                      stripes a re-stripe made before are given stripe 0's here.
-- The previous release's `couponctl campaign create` and `reconcile --repair` write the tables
-- themselves and are refused (42501) once this runs: operators run the verbs of the release they
-- deployed (docs/deploy.md). Its functions call none of it.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue issuances behind a long transaction

-- campaign_create's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION campaign_create(p_campaign_id text, p_discount_yen integer, p_budget_yen integer, p_stripes integer,
  p_starts timestamptz, p_ends timestamptz, p_valid_days integer, p_expire_at timestamptz, p_reason text)
RETURNS SETOF campaign_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_coupons bigint; -- bigint: stripe 0's share plus the leftover yen is summed before it is narrowed
  v_b       bigint;
BEGIN
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
  RETURN NEXT campaign_change_record(p_campaign_id, clock_timestamp(), 'create', '{}'::jsonb,
    jsonb_build_object('discount_yen', p_discount_yen, 'budget_yen', p_budget_yen, 'stripes', p_stripes,
      'starts_at', p_starts, 'ends_at', p_ends, 'coupon_valid_days', p_valid_days, 'coupons_expire_at', p_expire_at),
    p_reason);
END
$$;
-- +goose StatementEnd

-- counters_repair's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION counters_repair(p_reason text)
RETURNS TABLE (kind text, key text, before_yen bigint, after_yen bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
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
    PERFORM campaign_change_record(r.campaign_id, clock_timestamp(), 'repair',
      jsonb_build_object('issued_yen', v_total), jsonb_build_object('issued_yen', v_live), p_reason);
    kind := 'campaign'; key := r.campaign_id; before_yen := v_total; after_yen := v_live; RETURN NEXT;
  END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION campaign_change_budget(p_campaign_id text, p_budget_yen bigint, p_add_yen bigint,
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
$$;
-- +goose StatementEnd

-- The stripes a re-stripe added before this release: stripe 0's validity, by the change
-- protocol (stripe 0 first, then the rest), only for the campaigns that differ.
-- +goose StatementBegin
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT DISTINCT b.campaign_id FROM campaign_budgets b JOIN campaign_budgets z
             ON z.campaign_id = b.campaign_id AND z.stripe = 0
            WHERE b.stripe > 0 AND (b.coupon_valid_days IS DISTINCT FROM z.coupon_valid_days
                                    OR b.coupons_expire_at IS DISTINCT FROM z.coupons_expire_at)
            ORDER BY 1 LOOP
    PERFORM FROM campaign_lock(r.campaign_id);
    UPDATE campaign_budgets b SET coupon_valid_days = z.coupon_valid_days, coupons_expire_at = z.coupons_expire_at
      FROM campaign_budgets z
     WHERE b.campaign_id = r.campaign_id AND z.campaign_id = r.campaign_id AND z.stripe = 0 AND b.stripe > 0;
  END LOOP;
END
$$;
-- +goose StatementEnd

-- campaign_changes.what gains the two new kinds of history row. After the stripes above: a
-- change function holds its stripes, then inserts its history row; this takes them in that order.
ALTER TABLE campaign_changes DROP CONSTRAINT what_known,
  ADD CONSTRAINT what_known CHECK (what IN ('budget', 'stripes', 'period', 'pause', 'resume', 'end', 'validity', 'create', 'repair')) NOT VALID;
ALTER TABLE campaign_changes VALIDATE CONSTRAINT what_known;

REVOKE ALL ON FUNCTION campaign_create(text, integer, integer, integer, timestamptz, timestamptz, integer, timestamptz, text),
  counters_repair(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION campaign_create(text, integer, integer, integer, timestamptz, timestamptz, integer, timestamptz, text),
  counters_repair(text) TO coupon_admin;
REVOKE INSERT ON campaigns, campaign_budgets FROM coupon_admin;
REVOKE UPDATE ON campaign_budgets FROM coupon_admin;
REVOKE INSERT, UPDATE ON member_monthly_usage FROM coupon_admin;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
