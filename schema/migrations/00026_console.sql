-- +goose Up
-- The promotion team's console (issue 32; docs/roles.md, "The console"): who may do what is kept
-- here, each change made through the console names the person, and a budget raise above the
-- rule setting approval_above_yen, or a period move, waits for a second person (four eyes).
--   console_roles, console_role_changes  viewer, operator or approver per email, and its history,
--                      set only by console_role_set (`couponctl console grant`, coupon_admin)
--   coupon_rules.approval_above_yen      the line above which a raise becomes a request, set by
--                      coupon_rules_set's new overload (`couponctl rules set --approval-above-yen`)
--   campaign_change_requests             the pending, approved, rejected and lapsed requests
--   campaign_changes.operator_email, .request_id, issued_coupons.voided_by_email  the person
--                      beside the database login (changed_by, voided_by), NULL for the CLI's
--   console_*          the console's change functions: each takes the person's email, checks
--                      the person's role here (42501 when it falls short) and calls the change
--                      functions the CLI calls (campaign_change_state, campaign_change_budget,
--                      coupon_void), so the rules, locks and history are theirs
--   coupon_console     the console's group role: EXECUTE on the console_* functions only, and
--                      SELECT on what its pages read
-- The database trusts the email it is given: only the console's login may execute console_*, and
-- the console takes the email from the IAP assertion it verified (docs/roles.md). The previous
-- release calls none of this; the columns added are NULL for its changes and voids, and no
-- function it calls changes its arguments or answers.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue issuances behind a long transaction

-- coupon_console, created only if missing (roles are cluster-wide), as 00008 creates the others.
-- +goose StatementBegin
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'coupon_console') THEN
    BEGIN
      CREATE ROLE coupon_console NOLOGIN;
    EXCEPTION WHEN unique_violation OR duplicate_object THEN
      NULL; -- created meanwhile by a concurrent migration
    END;
  END IF;
END $$;
-- +goose StatementEnd
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM coupon_console;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM coupon_console;

-- operator_email's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION operator_email(p_email text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  v text := lower(btrim(p_email));
BEGIN
  IF v IS NULL OR length(v) > 254
     OR v !~ '^[a-z0-9!#$%&''*+/=?^_`{|}~.-]{1,64}@[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('email %L: want an address such as name@example.com', p_email);
  END IF;
  RETURN v;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION operator_email(text) FROM PUBLIC;

-- console_roles: the console's role of each email that has one; an email not here is a viewer.
-- changed_at and changed_by (the database login) are the last change's.
CREATE TABLE console_roles (
  email      text PRIMARY KEY CONSTRAINT email_normal CHECK (email = operator_email(email)),
  role       text NOT NULL CONSTRAINT role_known CHECK (role IN ('viewer', 'operator', 'approver')),
  changed_at timestamptz NOT NULL,
  changed_by text NOT NULL
);

-- console_role_changes: every change of a role, oldest first by change_id; before is the role
-- the email had ('viewer' when it had none).
CREATE TABLE console_role_changes (
  change_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  email      text NOT NULL,
  before     text NOT NULL,
  after      text NOT NULL,
  reason     text NOT NULL CONSTRAINT reason_given CHECK (btrim(reason) <> ''),
  changed_by text NOT NULL,
  changed_at timestamptz NOT NULL
);
CREATE INDEX console_role_changes_email ON console_role_changes (email, change_id);

-- console_role_set's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION console_role_set(p_email text, p_role text, p_reason text)
RETURNS SETOF console_role_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
SET lock_timeout = '1s'
AS $$
DECLARE
  v_email  text := operator_email(p_email);
  v_before text;
  v_at     timestamptz;
BEGIN
  IF p_role IS NULL OR p_role NOT IN ('viewer', 'operator', 'approver') THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('role %L: want viewer, operator or approver', p_role);
  ELSIF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every change needs a reason (--reason TEXT)';
  END IF;
  LOCK TABLE console_roles IN SHARE ROW EXCLUSIVE MODE;
  v_at := clock_timestamp();
  SELECT coalesce((SELECT r.role FROM console_roles r WHERE r.email = v_email), 'viewer') INTO v_before;
  IF v_before = p_role THEN
    RETURN;
  END IF;
  INSERT INTO console_roles AS r (email, role, changed_at, changed_by) VALUES (v_email, p_role, v_at, session_user)
  ON CONFLICT (email) DO UPDATE SET role = EXCLUDED.role, changed_at = EXCLUDED.changed_at, changed_by = EXCLUDED.changed_by;
  RETURN QUERY INSERT INTO console_role_changes (email, before, after, reason, changed_by, changed_at)
    VALUES (v_email, v_before, p_role, p_reason, session_user, v_at)
    RETURNING *;
END
$$;
-- +goose StatementEnd

-- console_role_of's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION console_role_of(p_email text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
BEGIN
  RETURN coalesce((SELECT r.role FROM console_roles r WHERE r.email = operator_email(p_email)), 'viewer');
END
$$;
-- +goose StatementEnd

-- operator_require's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION operator_require(p_email text, p_need text, p_act text) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = public, pg_temp
AS $$
DECLARE
  v_email text := operator_email(p_email);
  v_role  text := console_role_of(v_email);
BEGIN
  IF array_position(ARRAY['viewer', 'operator', 'approver'], v_role) < array_position(ARRAY['viewer', 'operator', 'approver'], p_need) THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
      MESSAGE = format('%s is %s %s in the console: %s needs the %s role (couponctl console grant); nothing changed',
                       v_email, CASE v_role WHEN 'operator' THEN 'an' ELSE 'a' END, v_role, p_act, p_need);
  END IF;
  RETURN v_email;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION operator_require(text, text, text) FROM PUBLIC;

-- coupon_rules.approval_above_yen: a budget raise through the console of more than this many
-- yen over the budget in force becomes a request that a second approver decides
-- (console_budget). 100,000 yen until changed: the Silver Week campaigns' smallest budget, so
-- that doubling one needs four eyes; 0 sends every raise for approval.
ALTER TABLE coupon_rules
  ADD COLUMN approval_above_yen bigint NOT NULL DEFAULT 100000
    CONSTRAINT approval_above_range CHECK (approval_above_yen BETWEEN 0 AND 2147483647);
INSERT INTO coupon_rules_changes (before, after, reason)
VALUES ('{}', '{"approval_above_yen": 100000}', 'migration 00026: the console''s four eyes, at the default line');

-- coupon_rules_set's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION coupon_rules_set(p_monthly_cap_yen integer, p_approval_above_yen bigint, p_reason text)
RETURNS SETOF coupon_rules_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
SET lock_timeout = '1s'
AS $$
DECLARE
  v_rules  coupon_rules;
  v_at     timestamptz;
  v_before jsonb := '{}';
  v_after  jsonb := '{}';
BEGIN
  IF p_monthly_cap_yen IS NULL AND p_approval_above_yen IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'nothing to set: give a monthly cap, an approval line or both';
  ELSIF p_monthly_cap_yen NOT BETWEEN 1 AND 1000000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('a monthly cap of %s yen: want 1 to 1000000000', p_monthly_cap_yen);
  ELSIF p_approval_above_yen NOT BETWEEN 0 AND 2147483647 THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('an approval line of %s yen: want 0 to 2147483647', p_approval_above_yen);
  ELSIF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every change needs a reason (--reason TEXT)';
  END IF;
  IF p_monthly_cap_yen IS NOT NULL THEN
    LOCK TABLE coupon_rules IN ACCESS EXCLUSIVE MODE;
  END IF;
  SELECT * INTO STRICT v_rules FROM coupon_rules r FOR UPDATE;
  v_at := clock_timestamp();
  IF p_monthly_cap_yen <> v_rules.monthly_cap_yen THEN
    v_before := v_before || jsonb_build_object('monthly_cap_yen', v_rules.monthly_cap_yen);
    v_after := v_after || jsonb_build_object('monthly_cap_yen', p_monthly_cap_yen);
  END IF;
  IF p_approval_above_yen <> v_rules.approval_above_yen THEN
    v_before := v_before || jsonb_build_object('approval_above_yen', v_rules.approval_above_yen);
    v_after := v_after || jsonb_build_object('approval_above_yen', p_approval_above_yen);
  END IF;
  IF v_after = '{}' THEN
    RETURN;
  END IF;
  UPDATE coupon_rules SET monthly_cap_yen = coalesce(p_monthly_cap_yen, monthly_cap_yen),
         approval_above_yen = coalesce(p_approval_above_yen, approval_above_yen), changed_at = v_at, changed_by = session_user;
  RETURN QUERY INSERT INTO coupon_rules_changes (changed_at, before, after, reason)
    VALUES (v_at, v_before, v_after, p_reason)
    RETURNING *;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION coupon_rules_set(integer, bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coupon_rules_set(integer, bigint, text) TO coupon_admin;

-- coupon_rules_set(integer, text), 00021's, now the three-argument form with the line kept: the
-- same arguments, answers and locks.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION coupon_rules_set(p_monthly_cap_yen integer, p_reason text)
RETURNS SETOF coupon_rules_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
SET lock_timeout = '1s'
AS $$
BEGIN
  IF p_monthly_cap_yen IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'a monthly cap of NULL yen: want 1 to 1000000000';
  END IF;
  RETURN QUERY SELECT * FROM coupon_rules_set(p_monthly_cap_yen, NULL::bigint, p_reason);
END
$$;
-- +goose StatementEnd

-- change_request_lifetime's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
CREATE FUNCTION change_request_lifetime() RETURNS interval LANGUAGE sql IMMUTABLE RETURN interval '24 hours';

-- campaign_change_request_rows: the requests as made and decided. decision is NULL while
-- undecided; the view campaign_change_requests says which are pending or lapsed.
--   kind 'budget': args holds budget_yen or add_yen (yen), and stripes when given, as
--     campaign_change_budget takes them; an add is added to the budget in force at approval
--   kind 'period': args holds starts_at, ends_at or both (RFC 3339), the bounds moved
--   requested_by, decided_by: the people's emails (operator_email)
CREATE TABLE campaign_change_request_rows (
  request_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  campaign_id     text NOT NULL REFERENCES campaigns,
  kind            text NOT NULL CONSTRAINT kind_known CHECK (kind IN ('budget', 'period')),
  args            jsonb NOT NULL CONSTRAINT args_object CHECK (jsonb_typeof(args) = 'object'),
  requested_by    text NOT NULL,
  request_reason  text NOT NULL CONSTRAINT request_reason_given CHECK (btrim(request_reason) <> ''),
  requested_at    timestamptz NOT NULL,
  decision        text CONSTRAINT decision_known CHECK (decision IN ('approved', 'rejected')),
  decided_by      text,
  decision_reason text CONSTRAINT decision_reason_given CHECK (btrim(decision_reason) <> ''),
  decided_at      timestamptz,
  CONSTRAINT decided_whole CHECK ((decision IS NULL) = (decided_by IS NULL)
                                  AND (decision IS NULL) = (decision_reason IS NULL)
                                  AND (decision IS NULL) = (decided_at IS NULL)),
  CONSTRAINT four_eyes CHECK (decided_by <> requested_by)
);
CREATE INDEX campaign_change_requests_campaign ON campaign_change_request_rows (campaign_id, request_id);

-- campaign_change_requests: every request with its state judged by the database's clock as it
-- is read (now(), the reader's transaction start): approved or rejected once decided, otherwise
-- pending until lapses_at and lapsed from then on. No scheduler marks a request lapsed.
CREATE VIEW campaign_change_requests AS
SELECT r.request_id, r.campaign_id, r.kind, r.args, r.requested_by, r.request_reason, r.requested_at,
       CASE WHEN r.decision IS NOT NULL THEN r.decision
            WHEN now() >= r.requested_at + change_request_lifetime() THEN 'lapsed'
            ELSE 'pending' END AS state,
       r.decided_by, r.decision_reason, r.decided_at,
       r.requested_at + change_request_lifetime() AS lapses_at
  FROM campaign_change_request_rows r;

-- campaign_changes.operator_email: the person (console_roles' email) who made the change through
-- the console, beside changed_by, the database login; NULL for a change made with couponctl.
-- For an approved request it is the approver, and request_id names the request (its requester
-- and both reasons).
ALTER TABLE campaign_changes
  ADD COLUMN operator_email text,
  ADD COLUMN request_id bigint REFERENCES campaign_change_request_rows;

-- issued_coupons.voided_by_email: the person who voided the coupon through the console, beside
-- voided_by, the database login; NULL for a void made with couponctl.
ALTER TABLE issued_coupons ADD COLUMN voided_by_email text;

-- operator_lock_timeout's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION operator_lock_timeout() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  PERFORM set_config('lock_timeout', CASE current_setting('lock_timeout') WHEN '0' THEN '1s' ELSE current_setting('lock_timeout') END, true);
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION operator_lock_timeout() FROM PUBLIC;

-- operator_changes_mark's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION operator_changes_mark(p_change_ids bigint[], p_email text, p_request_id bigint)
RETURNS SETOF campaign_changes
LANGUAGE plpgsql VOLATILE
SET search_path = public, pg_temp
AS $$
BEGIN
  RETURN QUERY UPDATE campaign_changes c SET operator_email = p_email, request_id = p_request_id
   WHERE c.change_id = ANY (p_change_ids)
  RETURNING c.*;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION operator_changes_mark(bigint[], text, bigint) FROM PUBLIC;

-- console_pause's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION console_pause(p_campaign_id text, p_pause boolean, p_operator text, p_reason text)
RETURNS SETOF campaign_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_what  text := CASE WHEN p_pause THEN 'pause' ELSE 'resume' END;
  v_email text := operator_require(p_operator, 'operator', format('%s campaign %s', CASE WHEN p_pause THEN 'pausing' ELSE 'resuming' END, p_campaign_id));
  v_ids   bigint[];
BEGIN
  PERFORM operator_lock_timeout();
  IF p_pause IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'console_pause: say pause (true) or resume (false)';
  END IF;
  v_ids := ARRAY(SELECT c.change_id FROM campaign_change_state(p_campaign_id, v_what, NULL, NULL, false, false, p_reason) c);
  RETURN QUERY SELECT * FROM operator_changes_mark(v_ids, v_email, NULL);
END
$$;
-- +goose StatementEnd

-- console_end's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION console_end(p_campaign_id text, p_operator text, p_reason text)
RETURNS SETOF campaign_changes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_email text := operator_require(p_operator, 'operator', format('ending campaign %s', p_campaign_id));
  v_ids   bigint[];
BEGIN
  PERFORM operator_lock_timeout();
  v_ids := ARRAY(SELECT c.change_id FROM campaign_change_state(p_campaign_id, 'end', NULL, NULL, false, false, p_reason) c);
  RETURN QUERY SELECT * FROM operator_changes_mark(v_ids, v_email, NULL);
END
$$;
-- +goose StatementEnd

-- console_budget's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION console_budget(p_campaign_id text, p_budget_yen bigint, p_add_yen bigint, p_stripes integer,
  p_operator text, p_reason text)
RETURNS TABLE (applied boolean, request_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_email  text := operator_require(p_operator, 'operator', format('a budget change of campaign %s', p_campaign_id));
  v_line   bigint;
  v_budget bigint;
  v_ids    bigint[];
BEGIN
  PERFORM operator_lock_timeout();
  IF p_budget_yen IS NULL AND p_add_yen IS NULL AND p_stripes IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: nothing to change: give a budget, an amount to add or stripes', p_campaign_id);
  ELSIF p_budget_yen IS NOT NULL AND p_add_yen IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'give a budget or an amount to add, not both';
  ELSIF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every change needs a reason (--reason TEXT)';
  END IF;
  SELECT r.approval_above_yen INTO STRICT v_line FROM coupon_rules r;
  SELECT sum(l.budget_yen) INTO v_budget FROM campaign_lock(p_campaign_id) l;
  IF coalesce(p_budget_yen - v_budget, p_add_yen, 0) > v_line THEN
    INSERT INTO campaign_change_request_rows AS q (campaign_id, kind, args, requested_by, request_reason, requested_at)
    VALUES (p_campaign_id, 'budget',
            jsonb_strip_nulls(jsonb_build_object('budget_yen', p_budget_yen, 'add_yen', p_add_yen, 'stripes', p_stripes)),
            v_email, p_reason, clock_timestamp())
    RETURNING false, q.request_id INTO applied, request_id;
    RETURN NEXT;
    RETURN;
  END IF;
  v_ids := ARRAY(SELECT c.change_id FROM campaign_change_budget(p_campaign_id, p_budget_yen, p_add_yen, p_stripes, p_reason) c);
  PERFORM FROM operator_changes_mark(v_ids, v_email, NULL);
  applied := true; request_id := NULL;
  RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- console_period's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION console_period(p_campaign_id text, p_starts timestamptz, p_ends timestamptz, p_operator text, p_reason text)
RETURNS TABLE (applied boolean, request_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_email text := operator_require(p_operator, 'operator', format('a period change of campaign %s', p_campaign_id));
BEGIN
  PERFORM operator_lock_timeout();
  IF p_starts IS NULL AND p_ends IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: nothing to change: give a start, an end or both', p_campaign_id);
  ELSIF p_starts >= p_ends THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = format('campaign %s: starts %s is not before ends %s; nothing changed', p_campaign_id, p_starts, p_ends);
  ELSIF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every change needs a reason (--reason TEXT)';
  ELSIF NOT EXISTS (SELECT 1 FROM campaigns c WHERE c.campaign_id = p_campaign_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'CI404', MESSAGE = format('campaign %s does not exist', p_campaign_id);
  END IF;
  INSERT INTO campaign_change_request_rows AS q (campaign_id, kind, args, requested_by, request_reason, requested_at)
  VALUES (p_campaign_id, 'period', jsonb_strip_nulls(jsonb_build_object('starts_at', p_starts, 'ends_at', p_ends)),
          v_email, p_reason, clock_timestamp())
  RETURNING false, q.request_id INTO applied, request_id;
  RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- console_decide's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION console_decide(p_request_id bigint, p_approve boolean, p_operator text, p_reason text)
RETURNS SETOF campaign_change_requests
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_email text := operator_require(p_operator, 'approver', format('deciding request %s', p_request_id));
  v_r     campaign_change_request_rows;
  v_at    timestamptz;
  v_ids   bigint[];
BEGIN
  PERFORM operator_lock_timeout();
  IF p_approve IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'console_decide: say approve (true) or reject (false)';
  ELSIF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422', MESSAGE = 'every decision needs a reason';
  END IF;
  SELECT * INTO v_r FROM campaign_change_request_rows q WHERE q.request_id = p_request_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI404', MESSAGE = format('request %s does not exist', p_request_id);
  END IF;
  v_at := clock_timestamp();
  IF v_r.decision IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'CI409',
      MESSAGE = format('request %s was %s by %s at %s; nothing changed', p_request_id, v_r.decision, v_r.decided_by, v_r.decided_at);
  ELSIF v_at >= v_r.requested_at + change_request_lifetime() THEN
    RAISE EXCEPTION USING ERRCODE = 'CI409',
      MESSAGE = format('request %s lapsed at %s, %s h after it was made; nothing changed: ask for it again',
                       p_request_id, v_r.requested_at + change_request_lifetime(),
                       (extract(epoch FROM change_request_lifetime()) / 3600)::integer);
  ELSIF v_r.requested_by = v_email THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
      MESSAGE = format('request %s was made by %s: a different approver decides it (four eyes); nothing changed', p_request_id, v_email);
  END IF;
  IF p_approve THEN
    IF v_r.kind = 'budget' THEN
      v_ids := ARRAY(SELECT c.change_id FROM campaign_change_budget(v_r.campaign_id, (v_r.args ->> 'budget_yen')::bigint,
                       (v_r.args ->> 'add_yen')::bigint, (v_r.args ->> 'stripes')::integer, v_r.request_reason) c);
    ELSE
      v_ids := ARRAY(SELECT c.change_id FROM campaign_change_state(v_r.campaign_id, 'period',
                       (v_r.args ->> 'starts_at')::timestamptz, (v_r.args ->> 'ends_at')::timestamptz,
                       v_r.args ? 'starts_at', v_r.args ? 'ends_at', v_r.request_reason) c);
    END IF;
    PERFORM FROM operator_changes_mark(v_ids, v_email, p_request_id);
  END IF;
  UPDATE campaign_change_request_rows q
     SET decision = CASE WHEN p_approve THEN 'approved' ELSE 'rejected' END,
         decided_by = v_email, decision_reason = p_reason, decided_at = v_at
   WHERE q.request_id = p_request_id;
  RETURN QUERY SELECT * FROM campaign_change_requests q WHERE q.request_id = p_request_id;
END
$$;
-- +goose StatementEnd

-- console_void's contract: its COMMENT ON FUNCTION, printed above it in schema/current/.
-- +goose StatementBegin
CREATE FUNCTION console_void(p_coupon_id uuid, p_allow_reissue boolean, p_operator text, p_reason text,
  OUT result text, OUT campaign_id text, OUT member_id text, OUT month text, OUT amount_yen integer,
  OUT voided_at timestamptz, OUT voided_by text, OUT push text, OUT pushed_at timestamptz, OUT voided_by_email text)
RETURNS record
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_email text := operator_require(p_operator, 'operator', format('voiding coupon %s', p_coupon_id));
BEGIN
  PERFORM operator_lock_timeout();
  SELECT v.result, v.campaign_id, v.member_id, v.month, v.amount_yen, v.voided_at, v.voided_by, v.push, v.pushed_at
    INTO result, campaign_id, member_id, month, amount_yen, voided_at, voided_by, push, pushed_at
    FROM coupon_void(p_coupon_id, p_reason, p_allow_reissue) v;
  -- coupon_void holds the coupon's row: this write waits for nobody.
  IF result = 'VOIDED' THEN
    UPDATE issued_coupons c SET voided_by_email = v_email WHERE c.coupon_id = p_coupon_id;
    voided_by_email := v_email;
  ELSE
    SELECT c.voided_by_email INTO voided_by_email FROM issued_coupons c WHERE c.coupon_id = p_coupon_id;
  END IF;
END
$$;
-- +goose StatementEnd

-- Who may call what. The console_* functions are the console login's alone (coupon_admin grants
-- roles, and changes campaigns with its own verbs); the helpers are nobody's.
REVOKE ALL ON FUNCTION console_role_set(text, text, text), console_role_of(text),
  console_pause(text, boolean, text, text), console_end(text, text, text),
  console_budget(text, bigint, bigint, integer, text, text), console_period(text, timestamptz, timestamptz, text, text),
  console_decide(bigint, boolean, text, text), console_void(uuid, boolean, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION console_role_set(text, text, text) TO coupon_admin;
GRANT EXECUTE ON FUNCTION console_role_of(text),
  console_pause(text, boolean, text, text), console_end(text, text, text),
  console_budget(text, bigint, bigint, integer, text, text), console_period(text, timestamptz, timestamptz, text, text),
  console_decide(bigint, boolean, text, text), console_void(uuid, boolean, text, text) TO coupon_console;
GRANT SELECT ON console_roles, console_role_changes, campaign_change_request_rows, campaign_change_requests TO coupon_admin;
-- The console's pages: the campaigns' stripes (state, budget, issued), their history and
-- requests, the coupons and their outbox rows (push state), the rule settings; plain reads, no
-- row lock. USAGE and goose_db_version for the start-up check (schema.Check), as every role.
GRANT USAGE ON SCHEMA public TO coupon_console;
GRANT SELECT ON goose_db_version, campaign_budgets, campaign_changes, campaign_change_requests, issued_coupons,
  notification_outbox, coupon_rules TO coupon_console;
-- 00025's campaign_releases, when that migration ran before this one (issue 33's branch).
-- +goose StatementBegin
DO $$
BEGIN
  IF to_regclass('public.campaign_releases') IS NOT NULL THEN
    GRANT SELECT ON campaign_releases TO coupon_console;
  END IF;
END $$;
-- +goose StatementEnd

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
