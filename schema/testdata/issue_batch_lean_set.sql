  -- The member phase of the "lean-set" body (issue_batch_lean.sql): reads in one cursor over the
  -- members, in member order; R2's and R3's writes one statement each over unnest.
  v_try := '{}';
  FOR r IN SELECT u.o::integer AS o, u.m, array_position(p_member_ids, u.m) AS f, c.coupon_id::text AS id,
                  c.voided_at IS NOT NULL AS voided, c.expires_at AS exp, mu.used_yen AS used
             FROM unnest(p_member_ids) WITH ORDINALITY AS u(m, o)
             LEFT JOIN issued_coupons c ON c.campaign_id = p_campaign_id AND c.member_id = u.m
                                       AND NOT c.legacy_duplicate AND NOT c.reissue_allowed
             LEFT JOIN member_monthly_usage mu ON mu.member_id = u.m AND mu.month = v_month
            ORDER BY u.m, u.o LOOP
    CONTINUE WHEN r.f <> r.o;
    IF r.id IS NOT NULL THEN
      v_res[r.o] := CASE WHEN r.voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END;
      v_cpn[r.o] := r.id; v_exp[r.o] := r.exp;
    ELSIF v_audience AND r.m <> ALL (v_members) THEN
      v_res[r.o] := 'NOT_ELIGIBLE';
    ELSIF v_reason IS NOT NULL THEN
      v_res[r.o] := 'CAMPAIGN_NOT_ACTIVE'; v_rsn[r.o] := v_reason;
    ELSIF v_amount > p_cap_yen OR r.used + v_amount > p_cap_yen THEN
      v_res[r.o] := 'MONTHLY_CAP';
    ELSE
      v_try := v_try || r.o;
    END IF;
  END LOOP;
  IF cardinality(v_try) > 0 AND NOT EXISTS (SELECT 1 FROM campaign_budgets s
                  WHERE s.campaign_id = p_campaign_id AND s.issued_yen + v_amount <= s.budget_yen
                    AND (NOT v_releases OR s.issued_yen / v_amount < release_share(v_released, s.stripe,
                           (SELECT count(*) FROM campaign_budgets cb WHERE cb.campaign_id = p_campaign_id)))) THEN
    FOREACH k IN ARRAY v_try LOOP
      v_res[k] := 'BUDGET_EXCEEDED';
    END LOOP;
    v_try := '{}';
  END IF;

  -- 1. R2: the coupons, in member order; a conflict is a concurrent request of the member that
  --    committed its coupon while this insert waited.
  WITH w AS (
    INSERT INTO issued_coupons AS c (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, expires_at)
    SELECT p_coupon_ids[t.e], p_campaign_id, p_member_ids[t.e], v_month, v_amount, v_at, v_expiry
      FROM unnest(v_try) WITH ORDINALITY AS t(e, ord) ORDER BY t.ord
    ON CONFLICT DO NOTHING
    RETURNING c.member_id)
  SELECT coalesce(array_agg(array_position(p_member_ids, w.member_id) ORDER BY w.member_id), '{}') INTO v_written FROM w;
  IF cardinality(v_written) < cardinality(v_try) THEN
    -- Some insert met a coupon of its pair: read who holds it.
    FOR r IN SELECT t.e, c.coupon_id::text AS id, c.voided_at IS NOT NULL AS voided, c.expires_at AS exp
               FROM unnest(v_try) AS t(e)
               LEFT JOIN issued_coupons c ON c.campaign_id = p_campaign_id AND c.member_id = p_member_ids[t.e]
                                         AND NOT c.legacy_duplicate AND NOT c.reissue_allowed
              WHERE t.e <> ALL (v_written) LOOP
      v_res[r.e] := CASE WHEN r.id IS NULL THEN 'RETRY' WHEN r.voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END;
      v_cpn[r.e] := r.id; v_exp[r.e] := r.exp;
    END LOOP;
  END IF;

  -- 2. R3: the member x month rows, in member order, each created or added to within the cap.
  WITH w AS (
    INSERT INTO member_monthly_usage AS mu (member_id, month, used_yen)
    SELECT p_member_ids[t.e], v_month, v_amount FROM unnest(v_written) WITH ORDINALITY AS t(e, ord) ORDER BY t.ord
    ON CONFLICT (member_id, month) DO UPDATE SET used_yen = mu.used_yen + EXCLUDED.used_yen
     WHERE mu.used_yen + EXCLUDED.used_yen <= p_cap_yen
    RETURNING mu.member_id)
  SELECT coalesce(array_agg(array_position(p_member_ids, w.member_id) ORDER BY w.member_id), '{}') INTO v_kept FROM w;
  IF cardinality(v_kept) < cardinality(v_written) THEN
    -- A concurrent issuance used the member's room this month: its coupon goes.
    DELETE FROM issued_coupons c USING unnest(v_written) AS t(e)
     WHERE t.e <> ALL (v_kept) AND c.coupon_id = p_coupon_ids[t.e];
    FOREACH k IN ARRAY v_written LOOP
      CONTINUE WHEN k = ANY (v_kept);
      v_res[k] := 'MONTHLY_CAP';
    END LOOP;
  END IF;

