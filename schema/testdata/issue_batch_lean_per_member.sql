  -- The member phase of the "lean-per-member" body (issue_batch_lean.sql): each member's reads,
  -- then each member's coupon, then each member's usage, one statement a member, in member order.
  IF cardinality(p_member_ids) = 1 THEN
    v_left := '{1}';
  ELSE -- each member's first entry, in member order
    SELECT array_agg(u.o::integer ORDER BY u.m) INTO v_left FROM unnest(p_member_ids) WITH ORDINALITY AS u(m, o)
     WHERE array_position(p_member_ids, u.m) = u.o;
  END IF;
  v_try := '{}';
  FOREACH k IN ARRAY v_left LOOP
    SELECT c.coupon_id::text AS id, c.voided_at IS NOT NULL AS voided, c.expires_at AS exp INTO r
      FROM issued_coupons c WHERE c.campaign_id = p_campaign_id AND c.member_id = p_member_ids[k]
                              AND NOT c.legacy_duplicate AND NOT c.reissue_allowed;
    IF FOUND THEN
      v_res[k] := CASE WHEN r.voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END;
      v_cpn[k] := r.id; v_exp[k] := r.exp;
    ELSIF v_audience AND p_member_ids[k] <> ALL (v_members) THEN
      v_res[k] := 'NOT_ELIGIBLE';
    ELSIF v_reason IS NOT NULL THEN
      v_res[k] := 'CAMPAIGN_NOT_ACTIVE'; v_rsn[k] := v_reason;
    ELSIF v_amount > p_cap_yen OR (SELECT mu.used_yen FROM member_monthly_usage mu
                                    WHERE mu.member_id = p_member_ids[k] AND mu.month = v_month) + v_amount > p_cap_yen THEN
      v_res[k] := 'MONTHLY_CAP';
    ELSE
      v_try := v_try || k;
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
  --    committed its coupon while this insert waited: read who holds it.
  v_written := '{}';
  FOREACH k IN ARRAY v_try LOOP
    INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, expires_at)
    VALUES (p_coupon_ids[k], p_campaign_id, p_member_ids[k], v_month, v_amount, v_at, v_expiry)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
      v_written := v_written || k;
      CONTINUE;
    END IF;
    SELECT c.coupon_id::text AS id, c.voided_at IS NOT NULL AS voided, c.expires_at AS exp INTO r
      FROM issued_coupons c WHERE c.campaign_id = p_campaign_id AND c.member_id = p_member_ids[k]
                              AND NOT c.legacy_duplicate AND NOT c.reissue_allowed;
    v_res[k] := CASE WHEN r.id IS NULL THEN 'RETRY' WHEN r.voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END;
    v_cpn[k] := r.id; v_exp[k] := r.exp;
  END LOOP;

  -- 2. R3: the member x month rows, in member order, each created or added to within the cap; a
  --    concurrent issuance that used the member's room this month takes the coupon back.
  v_kept := '{}';
  FOREACH k IN ARRAY v_written LOOP
    INSERT INTO member_monthly_usage AS mu (member_id, month, used_yen) VALUES (p_member_ids[k], v_month, v_amount)
    ON CONFLICT (member_id, month) DO UPDATE SET used_yen = mu.used_yen + EXCLUDED.used_yen
     WHERE mu.used_yen + EXCLUDED.used_yen <= p_cap_yen;
    IF FOUND THEN
      v_kept := v_kept || k;
      CONTINUE;
    END IF;
    DELETE FROM issued_coupons c WHERE c.coupon_id = p_coupon_ids[k];
    v_res[k] := 'MONTHLY_CAP';
  END LOOP;

