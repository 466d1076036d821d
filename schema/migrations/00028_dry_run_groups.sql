-- +goose Up
-- A dry run's group (issue 33, item 4): IssueCoupon coalesces the dry runs of a campaign as it
-- does its issuances (shared/issuance/coalesce.go), and a group is one call of
-- issue_dry_run_batch: the campaign's reads (stripe 0, the releases, the stripes' remaining sum,
-- R3's cap) made once per call, and per member only its index lookups. A dry run alone was one
-- call of issue_dry_run per request, six statements, each request holding a pooled connection:
-- a herd of them cost the database more than the coalesced issuance beside it and held the pool
-- it waited for (docs/performance.md). issue_dry_run, which no release calls any more (it came
-- after the previous release, 980de4a), answers through the batch: one body of the rules.
-- +goose StatementBegin
-- issue_dry_run_batch's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
CREATE FUNCTION issue_dry_run_batch(p_campaign_id text, p_member_ids text[])
RETURNS TABLE (i integer, result text, coupon text, amount integer, reason text, expires_at timestamptz,
               remaining_coupons integer, next_release_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  n           integer := coalesce(cardinality(p_member_ids), 0);
  v_now       timestamptz := clock_timestamp();
  v_first     campaign_budgets;
  v_released  bigint;        -- coupons released by now (a campaign with releases)
  v_next      timestamptz;   -- when more coupons open
  v_reason    text;          -- why the campaign is not active, if it is not
  v_cap       integer;       -- R3's cap
  v_remaining integer;       -- the coupons the stripes can still issue now
  v_bad       text;
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

  -- The campaign's reads, once.
  SELECT * INTO v_first FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  IF NOT FOUND THEN
    RETURN QUERY SELECT k, 'UNKNOWN_CAMPAIGN', NULL::text, NULL::integer, NULL::text, NULL::timestamptz, NULL::integer, NULL::timestamptz
                   FROM generate_series(1, n) k;
    RETURN;
  END IF;
  IF v_first.releases THEN
    SELECT coalesce(sum(r.coupons) FILTER (WHERE r.at <= v_now), 0)
      INTO v_released FROM campaign_releases r WHERE r.campaign_id = p_campaign_id;
    v_next := release_next(p_campaign_id, v_now, v_first.starts_at, v_first.ends_at, v_first.coupons_expire_at);
  END IF;
  v_reason := coalesce(campaign_inactive_reason(v_first.starts_at, v_first.ends_at, v_first.paused_at, v_first.coupons_expire_at, v_now),
                       CASE WHEN v_released = 0 THEN 'NOT_STARTED' END);
  IF v_reason IS NULL THEN
    SELECT r.monthly_cap_yen INTO v_cap FROM coupon_rules r;
    SELECT coalesce(sum(greatest(0, least((s.budget_yen - s.issued_yen) / s.discount_yen,
                                          CASE WHEN v_first.releases THEN release_share(v_released, s.stripe, s.stripes) - s.issued_yen / s.discount_yen END))), 0)
      INTO v_remaining
      FROM (SELECT b.*, count(*) OVER () AS stripes FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id) s;
  END IF;

  -- Each member's: its coupon, its audience row (audience-only), its month's usage.
  RETURN QUERY
  SELECT m.k::integer, a.result,
         c.coupon_id::text,
         CASE WHEN a.result = 'AVAILABLE' THEN v_first.discount_yen END,
         CASE WHEN a.result = 'CAMPAIGN_NOT_ACTIVE' THEN v_reason END,
         CASE WHEN c.coupon_id IS NOT NULL THEN c.expires_at
              WHEN a.result = 'AVAILABLE' THEN coupon_expiry(v_now, v_first.coupon_valid_days, v_first.coupons_expire_at) END,
         CASE WHEN a.result IN ('AVAILABLE', 'BUDGET_EXCEEDED') THEN v_remaining END,
         CASE WHEN a.result IN ('AVAILABLE', 'BUDGET_EXCEEDED') OR v_reason = 'NOT_STARTED' AND a.result = 'CAMPAIGN_NOT_ACTIVE' THEN v_next END
    FROM unnest(p_member_ids) WITH ORDINALITY m(member_id, k)
    LEFT JOIN issued_coupons c
      ON c.campaign_id = p_campaign_id AND c.member_id = m.member_id AND NOT c.legacy_duplicate AND NOT c.reissue_allowed
    LEFT JOIN campaign_audience au
      ON v_first.audience_only AND au.campaign_id = p_campaign_id AND au.member_id = m.member_id
    LEFT JOIN member_monthly_usage mu
      ON v_reason IS NULL AND mu.member_id = m.member_id AND mu.month = to_char(v_now AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM')
   CROSS JOIN LATERAL (SELECT CASE
           WHEN c.coupon_id IS NOT NULL THEN CASE WHEN c.voided_at IS NOT NULL THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END
           WHEN v_first.audience_only AND au.member_id IS NULL THEN 'NOT_ELIGIBLE'
           WHEN v_reason IS NOT NULL THEN 'CAMPAIGN_NOT_ACTIVE'
           WHEN coalesce(mu.used_yen, 0) + v_first.discount_yen > v_cap THEN 'MONTHLY_CAP'
           WHEN v_remaining = 0 THEN 'BUDGET_EXCEEDED'
           ELSE 'AVAILABLE' END AS result) a
   ORDER BY m.k;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION issue_dry_run_batch(text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION issue_dry_run_batch(text, text[]) TO coupon_issue;
-- +goose StatementBegin
-- issue_dry_run is issue_dry_run_batch for one member (which answers it, and refuses what it
-- refuses), in 00025's columns.
CREATE OR REPLACE FUNCTION issue_dry_run(p_campaign_id text, p_member_id text)
RETURNS TABLE (result text, coupon text, amount integer, reason text, expires_at timestamptz,
               remaining_coupons integer, next_release_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
  SELECT b.result, b.coupon, b.amount, b.reason, b.expires_at, b.remaining_coupons, b.next_release_at
    FROM issue_dry_run_batch(p_campaign_id, ARRAY[p_member_id]) b
$$;
-- +goose StatementEnd

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
