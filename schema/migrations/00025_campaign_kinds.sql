-- +goose Up
-- Campaigns as promotion teams run them (issue 33): coupons released on a schedule, audiences,
-- and the tables and admin functions they need. docs/design.md, "Releases, audiences and the dry
-- run", says how the issuance judges them.
--   campaign_releases        N more coupons released at an instant; coupons not taken roll over;
--                            budget_yen still caps everything
--   campaign_audience        the members an audience-only campaign issues to
--   campaign_budgets.audience_only, .releases
--                            read on stripe 0, as the other definition columns are; set once, by
--                            campaign_create, and never changed, so a read of them needs no lock
--   campaign_create (12 arguments), campaign_release_add, campaign_audience_change
--                            coupon_admin's, each with its history row
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue issuances behind a long transaction

CREATE TABLE campaign_releases (
  campaign_id text NOT NULL REFERENCES campaigns,
  at          timestamptz NOT NULL,
  coupons     integer NOT NULL CONSTRAINT coupons_positive CHECK (coupons > 0),
  PRIMARY KEY (campaign_id, at)
);

CREATE TABLE campaign_audience (
  campaign_id text NOT NULL REFERENCES campaigns,
  member_id   text NOT NULL,
  added_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (campaign_id, member_id)
);

-- A constant default: no table rewrite, ACCESS EXCLUSIVE for a catalog change only.
ALTER TABLE campaign_budgets
  ADD COLUMN audience_only boolean NOT NULL DEFAULT false,
  ADD COLUMN releases boolean NOT NULL DEFAULT false;

ALTER TABLE campaign_changes DROP CONSTRAINT what_known,
  ADD CONSTRAINT what_known CHECK (what IN ('budget', 'stripes', 'period', 'pause', 'resume', 'end', 'validity', 'create',
                                            'repair', 'release', 'audience')) NOT VALID;
ALTER TABLE campaign_changes VALIDATE CONSTRAINT what_known;

-- campaign_create, with releases and an audience: the 9-argument campaign_create (00017), which
-- stays for the previous release's couponctl, then p_release_coupons[i] coupons released at
-- p_release_at[i] (both NULL or empty: no schedule, the whole budget from the start) and
-- p_audience_only. It refuses (CI422) what campaign_create refuses, and arrays of unequal length,
-- with NULLs or not one dimension from index 1, a release at or after the campaign's end, a
-- count below 1, two releases at one instant, and releases summing above the budget's coupons
-- (budget_yen / discount_yen). Its 'create' history row names the releases and the audience.
-- +goose StatementBegin
CREATE FUNCTION campaign_create(p_campaign_id text, p_discount_yen integer, p_budget_yen integer, p_stripes integer,
  p_starts timestamptz, p_ends timestamptz, p_valid_days integer, p_expire_at timestamptz, p_reason text,
  p_release_at timestamptz[], p_release_coupons integer[], p_audience_only boolean)
RETURNS SETOF campaign_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  n        integer := coalesce(cardinality(p_release_at), 0);
  v_create campaign_changes;
  v_bad    record;
  v_sum    bigint;
BEGIN
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
$$;
-- +goose StatementEnd

-- campaign_release_add releases p_coupons more coupons of campaign p_campaign_id at p_at, with a
-- 'release' history row. It takes stripe 0 (FOR UPDATE), as every change of a campaign does, so
-- that two adds, or an add and a budget change, read each other's result (docs/design.md, "Lock
-- order"); issuances do not wait for it (an instant in the future binds no issuance in flight).
-- It refuses: an unknown campaign (CI404); a campaign created without releases, which issues its
-- whole budget from its start; an instant not after the database's clock, at or after the end,
-- or already used; a count below 1; releases summing above the budget's coupons (CI422).
-- +goose StatementBegin
CREATE FUNCTION campaign_release_add(p_campaign_id text, p_at timestamptz, p_coupons integer, p_reason text)
RETURNS SETOF campaign_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_first  campaign_budgets;
  v_now    timestamptz;
  v_budget bigint;
  v_sum    bigint;
BEGIN
  SELECT * INTO v_first FROM campaign_budgets WHERE campaign_id = p_campaign_id AND stripe = 0 FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI404', MESSAGE = format('campaign %s does not exist', p_campaign_id);
  END IF;
  v_now := clock_timestamp();
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
$$;
-- +goose StatementEnd

-- campaign_audience_change adds (p_add) or removes the members p_member_ids (1 to 1000 valid
-- member ids, docs/api.md) to or from the audience of audience-only campaign p_campaign_id and
-- returns how many it actually added or removed: a member already present, or already absent,
-- changes nothing, so a call run again is harmless. One 'audience' history row per call names
-- the counts. It locks the campaign's audience rows it changes, in member order, and nothing
-- else: an issuance holds its member's row (FOR KEY SHARE) from its reads to its COMMIT, so a
-- removal waits for the issuances of those members in flight, and once it returns none of them
-- commits a coupon (docs/design.md, "Lock order"). Refusals: an unknown campaign (CI404); a
-- campaign open to every member, bad ids, a missing direction or reason (CI422).
-- +goose StatementBegin
CREATE FUNCTION campaign_audience_change(p_campaign_id text, p_member_ids text[], p_add boolean, p_reason text)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
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
  PERFORM campaign_change_record(p_campaign_id, clock_timestamp(), 'audience', '{}'::jsonb,
    jsonb_build_object(CASE WHEN p_add THEN 'added' ELSE 'removed' END, v_count, 'given', n), p_reason);
  RETURN v_count;
END
$$;
-- +goose StatementEnd

-- Roles (docs/roles.md): coupon_admin changes releases and audiences through the functions above
-- alone, and reads them; coupon_issue reads neither table (its functions are SECURITY DEFINER).
REVOKE ALL ON FUNCTION campaign_create(text, integer, integer, integer, timestamptz, timestamptz, integer, timestamptz, text,
                                       timestamptz[], integer[], boolean),
  campaign_release_add(text, timestamptz, integer, text), campaign_audience_change(text, text[], boolean, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION campaign_create(text, integer, integer, integer, timestamptz, timestamptz, integer, timestamptz, text,
                                          timestamptz[], integer[], boolean),
  campaign_release_add(text, timestamptz, integer, text), campaign_audience_change(text, text[], boolean, text) TO coupon_admin;
GRANT SELECT ON campaign_releases, campaign_audience TO coupon_admin;

-- +goose Down
-- Not undone in place, as 00021: the schema serves the revision before it (issue_coupons_batch
-- keeps its arguments and answers); roll back the revision instead (docs/deploy.md).
-- +goose StatementBegin
DO $$ BEGIN
  RAISE EXCEPTION '00025_campaign_kinds is not undone in place: roll back the revision instead (docs/deploy.md); the schema serves it';
END $$;
-- +goose StatementEnd
