-- +goose Up
-- campaign_create refuses a release at or before the database's clock, as campaign_release_add
-- (campaign update --release) does: a year typo in --release opened a "10:00 drop" at once, exit 0.
-- Same signature and answers; the refusal is CI422, a code the previous release's couponctl
-- knows. It creates a campaign's rows only: no lock the issuance takes.
SET LOCAL lock_timeout = '5s';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION campaign_create(p_campaign_id text, p_discount_yen integer, p_budget_yen integer, p_stripes integer, p_starts timestamp with time zone, p_ends timestamp with time zone, p_valid_days integer, p_expire_at timestamp with time zone, p_reason text, p_release_at timestamp with time zone[], p_release_coupons integer[], p_audience_only boolean)
 RETURNS SETOF campaign_changes
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
  n        integer := coalesce(cardinality(p_release_at), 0);
  v_now    timestamptz := issue_now();
  v_past   timestamptz;
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
  -- After the 9-argument form's checks of the other arguments: a release opens coupons at an
  -- instant to come, as campaign_release_add judges it; one at or before the clock would open
  -- them at once.
  SELECT min(r.at) INTO v_past FROM unnest(p_release_at) AS r(at) WHERE r.at <= v_now;
  IF v_past IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: a release at %s is not after the database''s clock (%s)', p_campaign_id, v_past, v_now);
  END IF;
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
$function$;
-- +goose StatementEnd
COMMENT ON FUNCTION campaign_create(text, integer, integer, integer, timestamptz, timestamptz, integer, timestamptz, text, timestamptz[], integer[], boolean) IS
$$Creates a campaign as the 9-argument campaign_create does, then gives it releases and an
audience: p_release_coupons[k] coupons released at p_release_at[k] (both NULL or empty: no
schedule, the whole budget from the start; coupons not taken roll over, and budget_yen still caps
everything), and p_audience_only (true: only the members of campaign_audience may be issued it).
Both are set once, here, and never changed, so a read of them (on stripe 0) needs no lock. Its
'create' history row names the releases and the audience. Errors: the 9-argument form's, 22023 for
a release instant out of range (instant_check), and CI422 for release arrays of unequal length,
with NULLs or not one dimension from index 1, a NULL p_audience_only, a release at or before the
database's clock (issue_now()), of fewer than 1 coupon, at or after the campaign's end, two
releases at one instant, or releases summing above the budget's coupons (budget_yen /
discount_yen). docs/design.md, "Releases, audiences and the dry run". SECURITY DEFINER,
executable by coupon_admin (couponctl campaign create with its release and audience flags).$$;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
