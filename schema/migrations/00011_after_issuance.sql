-- +goose Up
-- After issuance (docs/design.md, "Voids, expiry and grants"): an operator voids a coupon and its
-- yen go back to its campaign's budget and its member's month, exactly once; a campaign gives its
-- coupons a validity, stamped on each as it is issued; a campaign is granted to a list of members
-- through the same issuance; and `couponctl outbox prune` marks what it deleted, so that
-- reconcile tells a pruned outbox row from a lost one.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue readers behind a long transaction

-- issued_coupons:
--   voided_at (00002), voided_by, void_reason  when, by which database login and why a coupon was
--                    voided (coupon_void); the legacy migration's voids have no login or reason
--   reissue_allowed  the void let the member be issued the campaign again: the coupon no longer
--                    holds its (campaign, member) pair (one_coupon_per_member, 00012)
--   expires_at       the first instant the coupon is no longer valid, NULL when its campaign
--                    gives no validity; stamped by issue_coupon
--   granted_by       the database login of the `couponctl grant` that issued it, NULL otherwise
--   outbox_pruned_at when `couponctl outbox prune` deleted its delivered outbox row
ALTER TABLE issued_coupons
  ADD COLUMN voided_by        text,
  ADD COLUMN void_reason      text,
  ADD COLUMN reissue_allowed  boolean NOT NULL DEFAULT false,
  ADD COLUMN expires_at       timestamptz,
  ADD COLUMN granted_by       text,
  ADD COLUMN outbox_pruned_at timestamptz,
  ADD CONSTRAINT reissue_after_void CHECK (NOT reissue_allowed OR voided_at IS NOT NULL);

-- campaign_budgets: the validity a campaign gives its coupons, written alike on every stripe:
-- until the end of the coupon_valid_days-th Asia/Tokyo day from issue (the issue day is the
-- first), or until the fixed instant coupons_expire_at; at most one of the two, neither for
-- coupons without validity.
ALTER TABLE campaign_budgets
  ADD COLUMN coupon_valid_days integer CONSTRAINT valid_days_in_range CHECK (coupon_valid_days BETWEEN 1 AND 3650),
  ADD COLUMN coupons_expire_at timestamptz,
  ADD CONSTRAINT one_validity CHECK (coupon_valid_days IS NULL OR coupons_expire_at IS NULL);

ALTER TABLE campaign_changes DROP CONSTRAINT what_known,
  ADD CONSTRAINT what_known CHECK (what IN ('budget', 'stripes', 'period', 'pause', 'resume', 'end', 'validity'));

-- coupon_expiry's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
CREATE FUNCTION coupon_expiry(p_at timestamptz, p_days integer, p_until timestamptz)
RETURNS timestamptz LANGUAGE sql IMMUTABLE
RETURN coalesce(p_until, ((p_at AT TIME ZONE 'Asia/Tokyo')::date + p_days)::timestamp AT TIME ZONE 'Asia/Tokyo');

-- issue_coupon, as 00010 made it, with voids and expiry:
--   * the member's pair is held by the coupon that is not a legacy duplicate and was not voided
--     with reissue allowed (at most one: one_coupon_per_member); a live one answers
--     ALREADY_ISSUED with its id and expiry, a voided one COUPON_VOIDED with its id;
--   * the coupon is stamped with its expiry (coupon_expiry), answered in the new OUT column;
--   * R2's insert is ON CONFLICT DO NOTHING on whichever unique index it meets: R2's, whose
--     predicate 00012 changes while this function runs, or the coupon id's primary key, which
--     the service's fresh UUID never meets. After a conflict the pair's holder is read again; if a
--     void released it meanwhile, the call fails with 40001 and the service tries again.
-- Its current definition, and every other function's, is in schema/current.
DROP FUNCTION issue_coupon(uuid, text, text, timestamptz, integer, text);
-- +goose StatementBegin
CREATE FUNCTION issue_coupon(
  p_coupon_id uuid, p_campaign_id text, p_member_id text, p_issued_at timestamptz,
  p_cap_yen integer, p_trace_parent text,
  OUT result text, OUT coupon text, OUT amount integer, OUT reason text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_month   text := to_char(p_issued_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM');
  v_stripes integer;
  v_stripe  smallint;
  v_coupon  uuid;
  v_voided  boolean;
  v_expires timestamptz;
  v_done    boolean := false;
BEGIN
  IF p_coupon_id IS NULL OR p_campaign_id IS NULL OR p_member_id IS NULL OR p_issued_at IS NULL
     OR p_cap_yen IS NULL OR p_cap_yen <= 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'issue_coupon: the ids and the issue time are required, and the cap must be positive yen';
  END IF;

  -- Reads: what the committed state already refuses.
  SELECT b.discount_yen, campaign_inactive_reason(b.starts_at, b.ends_at, b.paused_at, p_issued_at),
         coupon_expiry(p_issued_at, b.coupon_valid_days, b.coupons_expire_at),
         (SELECT count(*) FROM campaign_budgets s WHERE s.campaign_id = b.campaign_id)
    INTO amount, reason, expires_at, v_stripes
    FROM campaign_budgets b
   WHERE b.campaign_id = p_campaign_id AND b.stripe = 0;
  IF NOT FOUND THEN
    result := 'UNKNOWN_CAMPAIGN'; amount := NULL; expires_at := NULL; RETURN;
  END IF;
  -- (A SELECT INTO that finds no row sets its targets to NULL: the holder's expiry goes to a
  -- variable of its own, so that the new coupon's stays.)
  SELECT c.coupon_id::text, c.voided_at IS NOT NULL, c.expires_at INTO coupon, v_voided, v_expires
    FROM issued_coupons c
   WHERE c.campaign_id = p_campaign_id AND c.member_id = p_member_id AND NOT c.legacy_duplicate AND NOT c.reissue_allowed;
  IF FOUND THEN
    result := CASE WHEN v_voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END;
    amount := NULL; reason := NULL; expires_at := v_expires; RETURN;
  ELSIF reason IS NOT NULL THEN
    result := 'CAMPAIGN_NOT_ACTIVE'; amount := NULL; expires_at := NULL; RETURN;
  END IF;
  IF amount > p_cap_yen OR EXISTS (
       SELECT 1 FROM member_monthly_usage u
        WHERE u.member_id = p_member_id AND u.month = v_month AND u.used_yen + amount > p_cap_yen) THEN
    result := 'MONTHLY_CAP'; amount := NULL; expires_at := NULL; RETURN;
  END IF;
  IF NOT EXISTS (
       SELECT 1 FROM campaign_budgets s
        WHERE s.campaign_id = p_campaign_id AND s.issued_yen + amount <= s.budget_yen) THEN
    result := 'BUDGET_EXCEEDED'; amount := NULL; expires_at := NULL; RETURN;
  END IF;

  -- R2: the coupon; the unique index judges.
  INSERT INTO issued_coupons AS c (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, expires_at)
  VALUES (p_coupon_id, p_campaign_id, p_member_id, v_month, amount, p_issued_at, expires_at)
  ON CONFLICT DO NOTHING
  RETURNING c.coupon_id INTO v_coupon;
  IF NOT FOUND THEN
    -- A concurrent request of the same member committed its coupon while this insert waited.
    SELECT c.coupon_id::text, c.voided_at IS NOT NULL, c.expires_at INTO coupon, v_voided, expires_at
      FROM issued_coupons c
     WHERE c.campaign_id = p_campaign_id AND c.member_id = p_member_id AND NOT c.legacy_duplicate AND NOT c.reissue_allowed;
    IF NOT FOUND THEN
      RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
        MESSAGE = 'issue_coupon: the member''s coupon of the campaign was voided while this call inserted; try again';
    END IF;
    result := CASE WHEN v_voided THEN 'COUPON_VOIDED' ELSE 'ALREADY_ISSUED' END;
    amount := NULL; RETURN;
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

-- grant_coupon's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION grant_coupon(
  p_coupon_id uuid, p_campaign_id text, p_member_id text, p_issued_at timestamptz,
  p_cap_yen integer, p_trace_parent text,
  OUT result text, OUT coupon text, OUT amount integer, OUT reason text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
BEGIN
  SELECT i.result, i.coupon, i.amount, i.reason, i.expires_at INTO result, coupon, amount, reason, expires_at
    FROM issue_coupon(p_coupon_id, p_campaign_id, p_member_id, p_issued_at, p_cap_yen, p_trace_parent) i;
  IF result = 'ISSUED' THEN
    UPDATE issued_coupons SET granted_by = session_user WHERE coupon_id = p_coupon_id;
  END IF;
END
$$;
-- +goose StatementEnd

-- coupon_void's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION coupon_void(p_coupon_id uuid, p_reason text, p_allow_reissue boolean,
  OUT result text, OUT campaign_id text, OUT member_id text, OUT month text, OUT amount_yen integer,
  OUT voided_at timestamptz, OUT voided_by text, OUT push text, OUT pushed_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
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
  SELECT * INTO v_o FROM notification_outbox o WHERE o.coupon_id = p_coupon_id;
  push := CASE WHEN v_c.outbox_pruned_at IS NOT NULL THEN 'pruned'
               WHEN v_o.coupon_id IS NULL THEN 'no outbox row'
               WHEN v_o.sent_at IS NOT NULL THEN 'sent'
               WHEN v_o.skipped_at IS NOT NULL THEN 'skipped'
               WHEN v_o.parked_at IS NOT NULL THEN 'parked'
               WHEN v_o.claimed_by IS NOT NULL AND v_o.next_attempt_at > now() THEN 'in flight'
               ELSE 'not sent' END;
  pushed_at := v_o.sent_at;
  IF v_c.voided_at IS NOT NULL THEN
    result := 'ALREADY_VOIDED'; RETURN;
  ELSIF v_c.redeemed_at IS NOT NULL THEN
    result := 'REDEEMED'; RETURN;
  END IF;

  -- R3: the member's month gets the coupon's yen back.
  UPDATE member_monthly_usage u SET used_yen = u.used_yen - v_c.amount_yen
   WHERE u.member_id = v_c.member_id AND u.month = v_c.month AND u.used_yen >= v_c.amount_yen;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'internal_error', MESSAGE = format(
      'coupon_void: the %s counter of member %s holds less than the coupon''s %s yen: run couponctl reconcile',
      v_c.month, v_c.member_id, v_c.amount_yen);
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

  UPDATE issued_coupons c SET voided_at = now(), voided_by = session_user, void_reason = p_reason,
         reissue_allowed = coalesce(p_allow_reissue, false)
   WHERE c.coupon_id = p_coupon_id
  RETURNING c.voided_at, c.voided_by INTO voided_at, voided_by;
  result := 'VOIDED';
END
$$;
-- +goose StatementEnd

-- campaign_change_validity's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION campaign_change_validity(p_campaign_id text, p_valid_days integer, p_expire_at timestamptz,
  p_reason text) RETURNS SETOF campaign_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_first campaign_budgets;
  v_at    timestamptz;
BEGIN
  PERFORM FROM campaign_lock(p_campaign_id);
  SELECT * INTO v_first FROM campaign_budgets WHERE campaign_id = p_campaign_id AND stripe = 0;
  v_at := clock_timestamp();
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
$$;
-- +goose StatementEnd

-- Roles (docs/roles.md). Voids, grants and validity changes are coupon_admin's, through the
-- functions above alone. coupon_issue reads the pair's holder and its expiry to settle a lost
-- answer; coupon_relay reads whether a coupon was voided (it skips its push) and its expiry (the
-- push says until when); coupon_admin creates campaigns with a validity and marks the coupons
-- whose outbox rows the prune deletes.
REVOKE ALL ON FUNCTION grant_coupon(uuid, text, text, timestamptz, integer, text), coupon_void(uuid, text, boolean),
  campaign_change_validity(text, integer, timestamptz, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION grant_coupon(uuid, text, text, timestamptz, integer, text), coupon_void(uuid, text, boolean),
  campaign_change_validity(text, integer, timestamptz, text) TO coupon_admin;
GRANT SELECT (voided_at, reissue_allowed, expires_at) ON issued_coupons TO coupon_issue;
GRANT SELECT (voided_at, expires_at) ON issued_coupons TO coupon_relay;
GRANT INSERT (coupon_valid_days, coupons_expire_at) ON campaign_budgets TO coupon_admin;
GRANT UPDATE (outbox_pruned_at) ON issued_coupons TO coupon_admin;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
