-- +goose Up
-- One round trip per issuance attempt (docs/design.md, "One call per attempt"): the issuance
-- transaction of shared/issuance moves into the server as issue_coupon(), which IssueCoupon calls
-- in autocommit, pipelined behind the attempt's timeouts. The transaction commits as the call
-- ends, inside the server, so the hottest lock (a budget stripe) is held for the COMMIT's WAL
-- flush, never for a network round trip; and a request that the committed state already refuses
-- is answered from reads, before any insert, so it writes nothing and rolls nothing back.
--
-- issue_coupon is a wrapper since 00014, and issue_coupons_batch_v2 (00025) holds the rules and the
-- lock order this migration wrote here: each function's contract is its COMMENT ON FUNCTION,
-- printed above it in schema/current/.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue readers behind a long transaction

-- +goose StatementBegin
CREATE FUNCTION issue_coupon(
  p_coupon_id uuid, p_campaign_id text, p_member_id text, p_issued_at timestamptz,
  p_cap_yen integer, p_trace_parent text,
  OUT result text, OUT coupon text, OUT amount integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_month   text := to_char(p_issued_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM');
  v_active  boolean;
  v_stripes integer;
  v_stripe  smallint;
  v_coupon  uuid;
BEGIN
  IF p_coupon_id IS NULL OR p_campaign_id IS NULL OR p_member_id IS NULL OR p_issued_at IS NULL
     OR p_cap_yen IS NULL OR p_cap_yen <= 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'issue_coupon: the ids and the issue time are required, and the cap must be positive yen';
  END IF;

  -- Reads: what the committed state already refuses.
  SELECT b.discount_yen,
         (b.starts_at IS NULL OR b.starts_at <= p_issued_at) AND (b.ends_at IS NULL OR p_issued_at < b.ends_at),
         (SELECT count(*) FROM campaign_budgets s WHERE s.campaign_id = b.campaign_id)
    INTO amount, v_active, v_stripes
    FROM campaign_budgets b
   WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  IF NOT FOUND THEN
    result := 'UNKNOWN_CAMPAIGN'; amount := NULL; RETURN;
  END IF;
  SELECT c.coupon_id::text INTO coupon
    FROM issued_coupons c
   WHERE c.campaign_id = p_campaign_id AND c.member_id = p_member_id AND NOT c.legacy_duplicate;
  IF FOUND THEN
    result := 'ALREADY_ISSUED'; amount := NULL; RETURN;
  ELSIF NOT v_active THEN
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

  -- R1: one budget stripe, last; the COMMIT follows as the call returns.
  IF v_stripes <= 1 THEN
    UPDATE campaign_budgets SET issued_yen = issued_yen + amount
     WHERE campaign_id = p_campaign_id AND stripe = 0 AND issued_yen + amount <= budget_yen;
    IF NOT FOUND THEN
      RAISE EXCEPTION USING ERRCODE = 'CI409', MESSAGE = 'BUDGET_EXCEEDED',
        DETAIL = 'a concurrent issuance took the campaign''s last room';
    END IF;
  ELSE
    LOOP
      WITH free AS (
        SELECT s.campaign_id, s.stripe FROM campaign_budgets s
         WHERE s.campaign_id = p_campaign_id AND s.issued_yen + amount <= s.budget_yen
         ORDER BY random() LIMIT 1
           FOR UPDATE SKIP LOCKED)
      UPDATE campaign_budgets b SET issued_yen = b.issued_yen + amount
        FROM free
       WHERE b.campaign_id = free.campaign_id AND b.stripe = free.stripe;
      EXIT WHEN FOUND;
      -- Every stripe with room is held: wait for one that the committed state shows with room.
      SELECT s.stripe INTO v_stripe FROM campaign_budgets s
       WHERE s.campaign_id = p_campaign_id AND s.issued_yen + amount <= s.budget_yen
       ORDER BY random() LIMIT 1;
      IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'CI409', MESSAGE = 'BUDGET_EXCEEDED',
          DETAIL = 'concurrent issuances took the campaign''s last room';
      END IF;
      UPDATE campaign_budgets SET issued_yen = issued_yen + amount
       WHERE campaign_id = p_campaign_id AND stripe = v_stripe AND issued_yen + amount <= budget_yen;
      EXIT WHEN FOUND;
    END LOOP;
  END IF;
  result := 'ISSUED';
  coupon := v_coupon::text;
END
$$;
-- +goose StatementEnd

-- coupon_issue: the function (executable by PUBLIC unless revoked). Expand now, contract later:
-- 00008's table grants stay for this release, since the revision before this one issues with its
-- own statements; the release after it revokes them (the statements are written out in
-- schema/roles_test.go, TestIssueRoleNeedsOnlyTheFunction, which proves issuance works without them).
REVOKE ALL ON FUNCTION issue_coupon(uuid, text, text, timestamptz, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION issue_coupon(uuid, text, text, timestamptz, integer, text) TO coupon_issue;

-- +goose Down
DROP FUNCTION issue_coupon(uuid, text, text, timestamptz, integer, text);
