-- +goose Up
-- outbox_pruned: what a pruned outbox row's push came to, one narrow row per pruned coupon,
-- written by the prune (shared/outbox/outboxdb, Prune) in the statement that deletes the row
-- (issue 42; docs/operations.md, "Outbox retention"). Until now the prune updated the coupon row
-- (issued_coupons.outbox_pruned_at and outbox_outcome, 00011 and 00035): a coupon's page is full,
-- so the new version went to another page with a new entry in each of its three indexes, random
-- leaves of indexes far larger than the cache, and at a checkpoint every 31-47 s nearly every one
-- of them wrote its full page into the WAL: 13.6 KB per pruned row. This table is keyed by the
-- coupon's issue time first, the order the prune reaches coupons in, so its inserts fill the
-- right edge of its one index, page after page; the coupon row is not touched.
-- A reader finds a coupon's outcome by (issued_at, coupon_id) in either place: here, or in the
-- coupon's columns (written by the prunes before this one, and by the previous release's prune,
-- which keeps running beside it: the two take disjoint outbox rows, SKIP LOCKED).
-- A new table: no table the issuance reads or writes is altered or locked, and the prune no
-- longer takes coupon rows (docs/design.md, "Lock order"). No foreign key to issued_coupons: its
-- check would lock each coupon row (FOR KEY SHARE), the write this table saves.
SET LOCAL lock_timeout = '5s';

CREATE TABLE outbox_pruned (
  issued_at timestamptz NOT NULL,
  coupon_id uuid NOT NULL,
  outcome   text NOT NULL CONSTRAINT outcome_known CHECK (outcome IN ('sent', 'skipped', 'skipped:voided', 'skipped:redeemed',
                                                                      'skipped:expired', 'skipped:no_line_account')),
  pruned_at timestamptz NOT NULL DEFAULT issue_now(),
  PRIMARY KEY (issued_at, coupon_id)
);
GRANT SELECT, INSERT ON outbox_pruned TO coupon_admin;
GRANT SELECT ON outbox_pruned TO coupon_console;
COMMENT ON TABLE outbox_pruned IS
'What a coupon''s LINE push came to once the prune deleted its outbox row (since 00039): sent, skipped:REASON (the row''s skip_reason), skipped (no reason recorded). A coupon pruned before 00039, or by the previous release''s prune, has it in issued_coupons.outbox_pruned_at and outbox_outcome instead.';

-- coupon_void says 'pruned' of a coupon whose row this prune deleted, as of one the earlier
-- prunes marked, rather than 'no outbox row' (a legacy coupon's): the same function otherwise,
-- the same answers to either release.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.coupon_void(p_coupon_id uuid, p_reason text, p_allow_reissue boolean, OUT result text, OUT campaign_id text, OUT member_id text, OUT month text, OUT amount_yen integer, OUT voided_at timestamp with time zone, OUT voided_by text, OUT push text, OUT pushed_at timestamp with time zone)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
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
    push := outbox_push_state(coalesce(v_c.outbox_pruned_at, (SELECT p.pruned_at FROM outbox_pruned p WHERE p.issued_at = v_c.issued_at AND p.coupon_id = v_c.coupon_id)), v_o);
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
  push := outbox_push_state(coalesce(v_c.outbox_pruned_at, (SELECT p.pruned_at FROM outbox_pruned p WHERE p.issued_at = v_c.issued_at AND p.coupon_id = v_c.coupon_id)), v_o);
  pushed_at := v_o.sent_at;
  IF push = 'not sent' THEN
    UPDATE notification_outbox o SET skipped_at = issue_now(), skip_reason = 'voided',
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

  UPDATE issued_coupons c SET voided_at = issue_now(), voided_by = session_user, void_reason = p_reason,
         reissue_allowed = coalesce(p_allow_reissue, false)
   WHERE c.coupon_id = p_coupon_id
  RETURNING c.voided_at, c.voided_by INTO voided_at, voided_by;
  result := 'VOIDED';
END
$function$;
-- +goose StatementEnd

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
