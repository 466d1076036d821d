-- +goose Up
-- Redemption (issue 41; the long form: docs/design.md, "Redemption"): the cart or the POS redeems
-- a coupon exactly once through RedeemCoupon (functions/redeem), logged in as a user of the new
-- group role coupon_redeem.
--   coupon_redemptions   the append-only history: one row per redeem and per rollback, with the
--                        order, the reason, the login and the instant; a coupon's redemption is
--                        held by the order of its last row when that row is a redeem
--   redemption_judge     the one statement of what a coupon answers a member's order now
--   coupon_validate, coupon_redeem, coupon_redemption_rollback   RedeemCoupon's three operations
--   outbox_claim, outbox_lease_refused   a redeemed coupon's push is skipped (reason redeemed)
-- issued_coupons.redeemed_at (the legacy column) is the coupon's state; the legacy coupons that
-- the migration found redeemed get a history row of their own, their order unknown (NULL).
-- The lock of a redemption is the coupon's row (FOR NO KEY UPDATE, which coupon_void's FOR
-- UPDATE queues behind, and which no issuance, stripe or outbox lock meets); it moves no budget
-- and no month: R1-R3 count issued yen. This migration changes no table the issuance writes:
-- it takes no lock the issuance waits for. The previous release calls none of the new functions;
-- outbox_claim keeps its arguments and answer columns, and the previous relay counts a reason it
-- does not know in skipped alone (shared/outbox, SkippedReasons).
SET LOCAL lock_timeout = '5s';

-- coupon_redeem, created only if missing (roles are cluster-wide), as 00008 creates the others.
-- +goose StatementBegin
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'coupon_redeem') THEN
    BEGIN
      CREATE ROLE coupon_redeem NOLOGIN;
    EXCEPTION WHEN unique_violation OR duplicate_object THEN
      NULL; -- created meanwhile by a concurrent migration
    END;
  END IF;
END $$;
-- +goose StatementEnd
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM coupon_redeem;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM coupon_redeem;
GRANT USAGE ON SCHEMA public TO coupon_redeem;
GRANT SELECT ON goose_db_version TO coupon_redeem; -- the start-up check (schema.Check)

-- coupon_redemptions: order_id is NULL only on a legacy coupon's row (redeemed before the
-- migration, its order unknown); reason is a rollback's, and only a rollback's.
CREATE TABLE coupon_redemptions (
  redemption_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  coupon_id     uuid NOT NULL,
  action        text NOT NULL CONSTRAINT action_known CHECK (action IN ('redeem', 'rollback')),
  order_id      text CONSTRAINT order_id_format CHECK (length(order_id) BETWEEN 1 AND 128 AND order_id !~ '[^!-~]'),
  reason        text CONSTRAINT reason_of_rollback CHECK ((action = 'rollback') = (reason IS NOT NULL)
                                                          AND char_length(reason) <= 1000),
  at            timestamptz NOT NULL DEFAULT issue_now(),
  by_login      text NOT NULL DEFAULT session_user,
  CONSTRAINT order_named CHECK (order_id IS NOT NULL OR action = 'redeem')
);
CREATE INDEX coupon_redemptions_coupon ON coupon_redemptions (coupon_id, redemption_id);
GRANT SELECT ON coupon_redemptions TO coupon_admin, coupon_console; -- coupon show, reconcile; the console's pages

INSERT INTO coupon_redemptions (coupon_id, action, order_id, at, by_login)
SELECT c.coupon_id, 'redeem', NULL, c.redeemed_at, current_user
  FROM issued_coupons c WHERE c.redeemed_at IS NOT NULL
 ORDER BY c.redeemed_at, c.coupon_id;

-- +goose StatementBegin
CREATE FUNCTION redemption_history_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'restrict_violation',
    MESSAGE = format('coupon_redemptions is append-only: %s refused (a rollback is a row of its own)', TG_OP);
END
$$;
-- +goose StatementEnd
CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON coupon_redemptions
  FOR EACH ROW EXECUTE FUNCTION redemption_history_append_only();
CREATE TRIGGER append_only_truncate BEFORE TRUNCATE ON coupon_redemptions
  FOR EACH STATEMENT EXECUTE FUNCTION redemption_history_append_only();
COMMENT ON FUNCTION redemption_history_append_only() IS
$$The BEFORE UPDATE OR DELETE (per row) and BEFORE TRUNCATE trigger function of
coupon_redemptions: it refuses the change with 23001 restrict_violation, so that the history stays
append-only whoever holds the table, its owner included. Rule: docs/design.md, "Redemption".$$;

-- +goose StatementBegin
CREATE FUNCTION redemption_args_check(p_fn text, p_coupon_id uuid, p_member_id text, p_order_id text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF p_coupon_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = format('%s: no coupon id', p_fn);
  ELSIF p_member_id IS NULL OR length(p_member_id) NOT BETWEEN 1 AND 128 OR p_member_id ~ '[^!-~]' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: member id %L: want 1-128 bytes of visible ASCII (0x21-0x7E)', p_fn, p_member_id);
  ELSIF p_order_id IS NULL OR length(p_order_id) NOT BETWEEN 1 AND 128 OR p_order_id ~ '[^!-~]' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = format('%s: order id %L: want 1-128 bytes of visible ASCII (0x21-0x7E)', p_fn, p_order_id);
  END IF;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION redemption_args_check(text, uuid, text, text) FROM PUBLIC;
COMMENT ON FUNCTION redemption_args_check(text, uuid, text, text) IS
$$Checks the arguments of the redemption function named p_fn: a coupon id p_coupon_id, a member
id p_member_id and an order id p_order_id of 1-128 bytes of visible ASCII each (the contract's
formats, docs/api.md "RedeemCoupon"). Errors: 22023 invalid_parameter_value naming the argument.
Nothing read or written.$$;

-- +goose StatementBegin
CREATE FUNCTION redemption_judge(p_c issued_coupons, p_member_id text, p_order_id text) RETURNS text
LANGUAGE sql STABLE
SET search_path = public, pg_temp
AS $$
  SELECT CASE
    WHEN p_c.coupon_id IS NULL OR p_c.member_id IS DISTINCT FROM p_member_id THEN 'UNKNOWN_COUPON'
    WHEN p_c.redeemed_at IS NOT NULL AND (SELECT r.order_id FROM coupon_redemptions r WHERE r.coupon_id = p_c.coupon_id
                                            ORDER BY r.redemption_id DESC LIMIT 1) = p_order_id THEN 'REDEEMED'
    WHEN EXISTS (SELECT FROM coupon_redemptions r
                  WHERE r.coupon_id = p_c.coupon_id AND r.order_id = p_order_id AND r.action = 'rollback') THEN 'ROLLED_BACK'
    WHEN p_c.redeemed_at IS NOT NULL THEN 'ALREADY_REDEEMED'
    WHEN p_c.voided_at IS NOT NULL THEN 'COUPON_VOIDED'
    WHEN p_c.expires_at <= issue_now() THEN 'COUPON_EXPIRED'
    ELSE 'VALID' END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION redemption_judge(issued_coupons, text, text) FROM PUBLIC;
COMMENT ON FUNCTION redemption_judge(issued_coupons, text, text) IS
$$The one judge of a redemption: what coupon row p_c (all NULL when not found) answers member
p_member_id's order p_order_id now, by the database's clock (issue_now()), in this order:
UNKNOWN_COUPON (no such coupon, or another member's: nothing tells them apart), REDEEMED (its
redemption is held by this order: the last history row is this order's redeem), ROLLED_BACK (this
order's redemption of it was rolled back: an order redeems a coupon at most once, and its re-sent
redeem after a cancellation takes nothing), ALREADY_REDEEMED (held by another order, or a legacy
coupon redeemed before the migration), COUPON_VOIDED, COUPON_EXPIRED (expires_at at or before
now), else VALID. A p_order_id of NULL asks for any new order: VALID says the coupon is usable.
An order's own state is judged before the void and the expiry, so the same order sent again
answers the same. coupon_validate, coupon_redeem and coupon_redemption_rollback call it; it locks
nothing and raises nothing. docs/design.md, "Redemption".$$;

-- +goose StatementBegin
CREATE FUNCTION coupon_validate(p_coupon_id uuid, p_member_id text, p_order_id text,
  OUT result text, OUT amount_yen integer, OUT expires_at timestamptz, OUT redeemed_at timestamptz, OUT usable boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_c issued_coupons;
BEGIN
  PERFORM redemption_args_check('coupon_validate', p_coupon_id, p_member_id, p_order_id);
  SELECT * INTO v_c FROM issued_coupons c WHERE c.coupon_id = p_coupon_id AND c.member_id = p_member_id;
  result := redemption_judge(v_c, p_member_id, p_order_id);
  IF result <> 'UNKNOWN_COUPON' THEN
    amount_yen := v_c.amount_yen; expires_at := v_c.expires_at; redeemed_at := v_c.redeemed_at;
    usable := redemption_judge(v_c, p_member_id, NULL) = 'VALID';
  END IF;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION coupon_validate(uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coupon_validate(uuid, text, text) TO coupon_redeem;
COMMENT ON FUNCTION coupon_validate(uuid, text, text) IS
$$RedeemCoupon's validate (shared/redemption): whether coupon p_coupon_id of member p_member_id
could be redeemed by order p_order_id now. It takes no lock and writes nothing. It answers
redemption_judge's result (VALID, REDEEMED, ROLLED_BACK, ALREADY_REDEEMED, COUPON_VOIDED,
COUPON_EXPIRED, UNKNOWN_COUPON) with the coupon's amount in yen, expiry and redemption instant,
and usable (a new order could redeem it now), all NULL for UNKNOWN_COUPON. Errors: 22023 for arguments out of format (redemption_args_check). docs/api.md,
"RedeemCoupon". SECURITY DEFINER, executable by coupon_redeem.$$;

-- +goose StatementBegin
CREATE FUNCTION coupon_redeem(p_coupon_id uuid, p_member_id text, p_order_id text,
  OUT result text, OUT amount_yen integer, OUT expires_at timestamptz, OUT redeemed_at timestamptz, OUT usable boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_c issued_coupons;
BEGIN
  PERFORM redemption_args_check('coupon_redeem', p_coupon_id, p_member_id, p_order_id);
  SELECT * INTO v_c FROM issued_coupons c
   WHERE c.coupon_id = p_coupon_id AND c.member_id = p_member_id
     FOR NO KEY UPDATE;
  result := redemption_judge(v_c, p_member_id, p_order_id);
  IF result = 'VALID' THEN
    UPDATE issued_coupons c SET redeemed_at = issue_now() WHERE c.coupon_id = p_coupon_id RETURNING * INTO v_c;
    INSERT INTO coupon_redemptions (coupon_id, action, order_id, at) VALUES (p_coupon_id, 'redeem', p_order_id, v_c.redeemed_at);
    result := 'REDEEMED';
  END IF;
  IF result <> 'UNKNOWN_COUPON' THEN
    amount_yen := v_c.amount_yen; expires_at := v_c.expires_at; redeemed_at := v_c.redeemed_at;
    usable := redemption_judge(v_c, p_member_id, NULL) = 'VALID';
  END IF;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION coupon_redeem(uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coupon_redeem(uuid, text, text) TO coupon_redeem;
COMMENT ON FUNCTION coupon_redeem(uuid, text, text) IS
$$RedeemCoupon's redeem (shared/redemption): redeems coupon p_coupon_id of member p_member_id for
order p_order_id exactly once. Lock: the coupon's row alone (FOR NO KEY UPDATE: two redemptions,
or a redemption and coupon_void, queue there, and the second judges what the first left), never a
budget stripe; it moves no budget and no month. Then redemption_judge: a VALID coupon is redeemed
now (redeemed_at, and a redeem row in coupon_redemptions by the login) and answered REDEEMED; the
same order again answers REDEEMED with the first instant; otherwise the judge's answer,
nothing written: ROLLED_BACK (this order's redemption was rolled back: it redeems the coupon no
more), ALREADY_REDEEMED, COUPON_VOIDED, COUPON_EXPIRED by the database's clock at the write,
UNKNOWN_COUPON for another member's coupon. Answers the amount in yen, expiry, redemption instant
and usable (a new order could redeem it now), NULL for UNKNOWN_COUPON. Errors: 22023 (redemption_args_check), 55P03 past
the session's lock_timeout. docs/design.md, "Redemption". SECURITY DEFINER, executable by
coupon_redeem.$$;

-- +goose StatementBegin
CREATE FUNCTION coupon_redemption_rollback(p_coupon_id uuid, p_member_id text, p_order_id text, p_reason text,
  OUT result text, OUT usable boolean, OUT expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_c issued_coupons;
BEGIN
  PERFORM redemption_args_check('coupon_redemption_rollback', p_coupon_id, p_member_id, p_order_id);
  IF p_reason IS NULL OR btrim(p_reason) = '' OR char_length(p_reason) > 1000 OR p_reason ~ '[[:cntrl:]]' THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'coupon_redemption_rollback: reason: want 1-1000 characters, not blank, no control characters';
  END IF;
  SELECT * INTO v_c FROM issued_coupons c
   WHERE c.coupon_id = p_coupon_id AND c.member_id = p_member_id
     FOR NO KEY UPDATE;
  result := redemption_judge(v_c, p_member_id, p_order_id);
  IF result = 'UNKNOWN_COUPON' THEN
    RETURN;
  ELSIF result = 'REDEEMED' THEN
    UPDATE issued_coupons c SET redeemed_at = NULL WHERE c.coupon_id = p_coupon_id RETURNING * INTO v_c;
    INSERT INTO coupon_redemptions (coupon_id, action, order_id, reason) VALUES (p_coupon_id, 'rollback', p_order_id, p_reason);
    result := 'ROLLED_BACK';
  ELSIF result <> 'ROLLED_BACK' THEN
    result := 'NOT_REDEEMED';
  END IF;
  IF result = 'ROLLED_BACK' THEN
    usable := redemption_judge(v_c, p_member_id, NULL) = 'VALID';
  END IF;
  expires_at := v_c.expires_at;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION coupon_redemption_rollback(uuid, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coupon_redemption_rollback(uuid, text, text, text) TO coupon_redeem;
COMMENT ON FUNCTION coupon_redemption_rollback(uuid, text, text, text) IS
$$RedeemCoupon's rollback (shared/redemption): undoes order p_order_id's redemption of coupon
p_coupon_id of member p_member_id, for reason p_reason (1-1000 characters, no control
characters). Lock: the coupon's row
alone (FOR NO KEY UPDATE), as coupon_redeem takes it, so a rollback never undoes another order's
redemption that committed meanwhile. A coupon this order holds is given back (redeemed_at
cleared, a rollback row in coupon_redemptions with the reason and the login) and answered
ROLLED_BACK; this order's rollback sent again answers ROLLED_BACK, nothing written; a coupon this
order does not hold and never rolled back answers NOT_REDEEMED; UNKNOWN_COUPON as
redemption_judge. usable says whether the coupon may be redeemed now (false once expired, or
redeemed by another order since); expires_at is the coupon's expiry. Errors: 22023 for arguments
out of format or a blank reason or one with a control character, 55P03 past the session's
lock_timeout. docs/design.md,
"Redemption". SECURITY DEFINER, executable by coupon_redeem.$$;

-- The relay: a redeemed coupon's push is skipped, reason redeemed (after voided, before expired).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_claim(p_limit integer, p_run uuid, p_lease interval, p_due_at timestamptz, p_key_window interval)
 RETURNS TABLE(coupon_id text, member_id text, attempts integer, campaign_id text, amount_yen integer, line_user_id text, key_expired boolean, prev_next_attempt_at timestamptz, prev_first_pushed_at timestamptz, trace_parent text, expires_at timestamptz, skip_reason text)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $$
  WITH due AS MATERIALIZED (
    SELECT o.coupon_id, o.member_id, o.next_attempt_at, o.first_pushed_at FROM notification_outbox o
     WHERE o.sent_at IS NULL AND o.parked_at IS NULL AND o.skipped_at IS NULL AND o.next_attempt_at <= p_due_at
     ORDER BY o.next_attempt_at
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  ), judged AS (
    SELECT due.coupon_id, due.next_attempt_at, due.first_pushed_at, i.campaign_id, i.amount_yen, i.expires_at,
           l.line_user_id,
           CASE WHEN i.voided_at IS NOT NULL THEN 'voided'
                WHEN i.redeemed_at IS NOT NULL THEN 'redeemed'
                WHEN i.expires_at <= issue_now() + p_lease THEN 'expired'
                WHEN l.line_user_id IS NULL THEN 'no_line_account' END AS skip_reason
      FROM due JOIN issued_coupons i ON i.coupon_id = due.coupon_id
           LEFT JOIN member_line_accounts l ON l.member_id = due.member_id
  )
  UPDATE notification_outbox o
     SET next_attempt_at = CASE WHEN j.skip_reason IS NULL THEN issue_now() + p_lease ELSE o.next_attempt_at END,
         claimed_by = CASE WHEN j.skip_reason IS NULL THEN p_run END,
         first_pushed_at = CASE WHEN j.skip_reason IS NULL THEN COALESCE(o.first_pushed_at, issue_now()) ELSE o.first_pushed_at END,
         skipped_at = CASE WHEN j.skip_reason IS NOT NULL THEN issue_now() END,
         skip_reason = j.skip_reason,
         last_error = CASE j.skip_reason
           WHEN 'voided' THEN 'skipped: the coupon was voided (couponctl coupon show)'
           WHEN 'redeemed' THEN 'skipped: the coupon was redeemed before its push (couponctl coupon show)'
           WHEN 'expired' THEN 'skipped: the coupon expired before its push (couponctl coupon show)'
           WHEN 'no_line_account' THEN 'skipped: the member has no LINE account linked (couponctl line link, then outbox requeue)'
           ELSE o.last_error END
    FROM judged j
   WHERE outbox_claim_args_check(p_limit, p_run, p_lease, p_due_at, p_key_window) AND o.coupon_id = j.coupon_id
  RETURNING o.coupon_id::text, o.member_id, o.attempts, j.campaign_id, j.amount_yen, COALESCE(j.line_user_id, ''),
            j.skip_reason IS NULL AND COALESCE(o.first_pushed_at < issue_now() - p_key_window, false),
            j.next_attempt_at, j.first_pushed_at, o.trace_parent, j.expires_at, j.skip_reason
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION outbox_claim(integer, uuid, interval, timestamptz, interval) IS
$$RelayOutbox's claim (shared/outbox/outboxdb.Claim): takes up to p_limit open outbox rows due at
p_due_at for run p_run, oldest due first, skipping rows another transaction holds (FOR UPDATE SKIP
LOCKED, in a CTE evaluated once, so a claim never takes more than p_limit rows and never waits).
Each row taken is either closed as skipped, never to be pushed, with its skip_reason: voided (its
coupon was voided), redeemed (its coupon was redeemed before its push, 00032), expired (its coupon
expires before the lease ends, so a push under the lease could reach the member after the
expiry) or no_line_account (its member has no LINE account linked), or leased to the run for
p_lease (next_attempt_at moved past it, claimed_by set), with first_pushed_at set if unset before
its push goes out, so that a crash between push and mark cannot lose the start of LINE's
retry-key window. It answers every row it took: the coupon, its member, attempts, campaign, amount
in yen, LINE user id, key_expired (a leased row first pushed more than p_key_window ago), the
row's previous next_attempt_at and first_pushed_at, its trace, the coupon's expiry, and
skip_reason (NULL for a leased row). The database decides what may be pushed: a reason added by a
migration binds every relay that calls it, and outbox_lease_refused binds an inline claim. Errors:
22023 for arguments shared/outbox never sends (outbox_claim_args_check, judged before any row is
read). docs/design.md, "The transactional outbox". SECURITY DEFINER, executable by
coupon_relay.$$;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_lease_refused() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM public.issued_coupons c
              WHERE c.coupon_id = NEW.coupon_id
                AND (c.voided_at IS NOT NULL OR c.redeemed_at IS NOT NULL OR c.expires_at <= NEW.next_attempt_at)) THEN
    RETURN NULL;
  END IF;
  RETURN NEW;
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION outbox_lease_refused() IS
$$The BEFORE UPDATE OF claimed_by trigger function of notification_outbox (trigger
outbox_lease_refused, fired when an update sets claimed_by to a run): it answers NULL, so that
PostgreSQL neither changes the row nor returns it from the statement's RETURNING, when the row's
coupon is voided, redeemed (00032) or expires by the lease's end (NEW.next_attempt_at),
outbox_claim's own rule, and NEW otherwise. No relay of any release takes a lease on a coupon that
may not be pushed. The refused row stays open and unleased, and outbox_claim closes it as skipped
on its next run. It takes no lock: it reads the coupon row by its key in a snapshot of its own,
taken after the claim locked the outbox row, so it sees a void or a redemption that committed
meanwhile. SECURITY DEFINER since 00032: an inline claim as coupon_relay, which may not read a
coupon's redemption, is judged on it all the same. Raises nothing. docs/design.md, "The database decides what is pushed".$$;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
