-- +goose Up
-- A void closes its coupon's outbox row in its own transaction (docs/design.md, "Voids, expiry and
-- grants"). coupon_void (00011) locked the coupon row but only read the outbox row, and the relay's
-- claim reads voided_at without a lock: a claim while a void was still open read the coupon live,
-- leased its row, and the coupon was pushed although the void answered "not sent". Now the void
-- locks the outbox row after the usage row (the issuance's order: coupon, usage, outbox, stripes),
-- so a claim of any release skips it while the void is open, and closes it as skipped (reason
-- 'voided') before it commits, so no claim takes it after: the previous release's inline claim
-- reads skipped_at too.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue readers behind a long transaction

-- outbox_push_state's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION outbox_push_state(p_pruned timestamptz, o notification_outbox) RETURNS text
LANGUAGE sql STABLE
SET search_path = public, pg_temp
AS $$
  SELECT CASE WHEN p_pruned IS NOT NULL THEN 'pruned'
              WHEN o.coupon_id IS NULL THEN 'no outbox row'
              WHEN o.sent_at IS NOT NULL THEN 'sent'
              WHEN o.skipped_at IS NOT NULL THEN 'skipped'
              WHEN o.parked_at IS NOT NULL THEN 'parked'
              WHEN o.claimed_by IS NOT NULL AND o.next_attempt_at > now() THEN 'in flight'
              ELSE 'not sent' END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION outbox_push_state(timestamptz, notification_outbox) FROM PUBLIC;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.coupon_void(p_coupon_id uuid, p_reason text, p_allow_reissue boolean, OUT result text, OUT campaign_id text, OUT member_id text, OUT month text, OUT amount_yen integer, OUT voided_at timestamp with time zone, OUT voided_by text, OUT push text, OUT pushed_at timestamp with time zone)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
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
  IF v_c.voided_at IS NOT NULL OR v_c.redeemed_at IS NOT NULL THEN
    SELECT * INTO v_o FROM notification_outbox o WHERE o.coupon_id = p_coupon_id;
    push := outbox_push_state(v_c.outbox_pruned_at, v_o);
    pushed_at := v_o.sent_at;
    result := CASE WHEN v_c.voided_at IS NOT NULL THEN 'ALREADY_VOIDED' ELSE 'REDEEMED' END;
    RETURN;
  END IF;

  -- R3: the member's month gets the coupon's yen back.
  UPDATE member_monthly_usage u SET used_yen = u.used_yen - v_c.amount_yen
   WHERE u.member_id = v_c.member_id AND u.month = v_c.month AND u.used_yen >= v_c.amount_yen;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'internal_error', MESSAGE = format(
      'coupon_void: the %s counter of member %s holds less than the coupon''s %s yen: run couponctl reconcile',
      v_c.month, v_c.member_id, v_c.amount_yen);
  END IF;

  -- The outbox row, after the usage row as the issuance writes them: locked while it is open, so
  -- that no claim of any release takes it while this void is open (FOR UPDATE SKIP LOCKED skips
  -- it), and closed as skipped when it was not pushed, so that no claim takes it after. One a
  -- relay run holds (claimed, its lease running) may be pushed now: said so. A closed row (sent,
  -- skipped, parked) is read, not locked: `outbox prune` holds closed rows while it waits for
  -- their coupon rows, which this void holds.
  SELECT * INTO v_o FROM notification_outbox o
   WHERE o.coupon_id = p_coupon_id AND o.sent_at IS NULL AND o.skipped_at IS NULL AND o.parked_at IS NULL
     FOR UPDATE;
  IF NOT FOUND THEN
    SELECT * INTO v_o FROM notification_outbox o WHERE o.coupon_id = p_coupon_id;
  END IF;
  push := outbox_push_state(v_c.outbox_pruned_at, v_o);
  pushed_at := v_o.sent_at;
  IF push = 'not sent' THEN
    UPDATE notification_outbox o SET skipped_at = now(), skip_reason = 'voided',
           last_error = 'skipped: the coupon was voided (couponctl coupon show)'
     WHERE o.coupon_id = p_coupon_id;
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

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
