-- +goose Up
-- From the Before code's tables to one lock row per invariant (docs/design.md; docs/migration.md
-- is the runbook). Every rule a constraint can state is stated here: the constraints are the last
-- line of defence behind the issuance transaction in shared/issuance. The legacy data is kept,
-- repaired where it can be and recorded where it cannot:
--   * duplicate coupons per (campaign, member) are marked legacy_duplicate (a redeemed one stays
--     live; an unredeemed one is voided); R2's unique index then covers the others (00003);
--   * counters are rebuilt from the live coupons, never copied from the drifted campaigns.issued_yen;
--   * campaigns already over budget keep their overshoot (legacy_overshoot records it for
--     finance), and the budget CHECK is added NOT VALID so that no new write adds to it;
--   * month is recomputed from issued_at in Asia/Tokyo; the month the client chose is kept in
--     client_month;
--   * every legacy coupon was pushed by the Before code inside its transaction, so its outbox
--     row is written as already sent and the relay never pushes it again.
-- A short lock_timeout: if a long transaction holds a table, this step gives up (55P03) instead
-- of queueing every reader behind its ACCESS EXCLUSIVE lock; run it again when the table is free.
SET LOCAL lock_timeout = '3s';

-- campaigns is the static definition that coupons reference (discount and budget as approved).
-- Nothing updates it after creation, so the KEY SHARE lock that each coupon insert's foreign-key
-- check takes never waits on the hot budget counter (docs/hot-row.md: a foreign key onto the
-- counter row cost up to 5x at 32 clients). issued_yen is the Before code's counter: the new code
-- does not maintain it; `couponctl legacy rollback` writes it back from campaign_budgets.
ALTER TABLE campaigns
  ADD COLUMN created_at timestamptz NOT NULL DEFAULT now(),
  ADD CONSTRAINT campaign_id_format CHECK (campaign_id ~ '^[A-Za-z0-9_-]{1,64}$') NOT VALID;
COMMENT ON COLUMN campaigns.issued_yen IS
  'Before code''s drifted counter, not maintained; R1 counts in campaign_budgets (couponctl legacy rollback writes it back)';

-- issued_coupons: one row per coupon. R2 is the partial unique index one_coupon_per_member
-- (00003) over the coupons that are not legacy duplicates.
ALTER TABLE issued_coupons
  ALTER COLUMN coupon_id SET DEFAULT gen_random_uuid(),
  ADD COLUMN client_month     text,
  ADD COLUMN voided_at        timestamptz,
  ADD COLUMN legacy_duplicate boolean NOT NULL DEFAULT false;
UPDATE issued_coupons
   SET client_month = month,
       month = to_char(issued_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM');
ALTER TABLE issued_coupons
  ADD CONSTRAINT month_format CHECK (month ~ '^\d{4}-(0[1-9]|1[0-2])$'),
  ADD CONSTRAINT member_id_format CHECK (member_id ~ '^[!-~]{1,128}$') NOT VALID,
  ADD CONSTRAINT amount_positive CHECK (amount_yen > 0) NOT VALID,
  ADD CONSTRAINT voided_unredeemed CHECK (voided_at IS NULL OR redeemed_at IS NULL);
COMMENT ON COLUMN issued_coupons.client_month IS 'legacy: the month the client sent to the Before code';

-- Duplicates per (campaign, member): keep one live coupon, a redeemed one if any, else the
-- earliest. The others are marked legacy_duplicate; those never redeemed are voided (they no
-- longer count against a budget or a cap). Redeemed duplicates stay live: they are tied to orders,
-- and the members did nothing wrong.
WITH ranked AS (
  SELECT coupon_id, redeemed_at,
         row_number() OVER (PARTITION BY campaign_id, member_id
                            ORDER BY redeemed_at IS NULL, issued_at, coupon_id) AS rn
    FROM issued_coupons)
UPDATE issued_coupons i
   SET voided_at = CASE WHEN r.redeemed_at IS NULL THEN now() END,
       legacy_duplicate = true
  FROM ranked r
 WHERE i.coupon_id = r.coupon_id AND r.rn > 1 AND NOT i.legacy_duplicate;
CREATE INDEX issued_coupons_member_month ON issued_coupons (member_id, month);

-- campaign_budgets holds the R1 counter: the row every issuance of the campaign serializes on
-- (budget stripes, 00006, split it). budget_yen is the campaign budget approval; discount_yen the
-- face value of one coupon. The counter is rebuilt from the live coupons.
CREATE TABLE campaign_budgets (
  campaign_id  text PRIMARY KEY REFERENCES campaigns,
  discount_yen integer NOT NULL CONSTRAINT discount_positive CHECK (discount_yen > 0),
  budget_yen   integer NOT NULL CONSTRAINT budget_positive CHECK (budget_yen > 0),
  issued_yen   integer NOT NULL DEFAULT 0,
  starts_at    timestamptz,
  ends_at      timestamptz,
  CONSTRAINT period_ordered CHECK (starts_at IS NULL OR ends_at IS NULL OR starts_at < ends_at)
);
INSERT INTO campaign_budgets (campaign_id, discount_yen, budget_yen, issued_yen)
SELECT c.campaign_id, c.discount_yen, c.budget_yen,
       COALESCE(SUM(i.amount_yen) FILTER (WHERE i.voided_at IS NULL), 0)
  FROM campaigns c LEFT JOIN issued_coupons i USING (campaign_id)
 GROUP BY c.campaign_id, c.discount_yen, c.budget_yen;
-- NOT VALID (PostgreSQL 15 docs, ALTER TABLE "ADD table_constraint ... NOT VALID"): rows already
-- over budget stay as they are; every new or updated row is checked, so no write adds to an
-- overshoot and the conditional add of the issuance answers BUDGET_EXCEEDED there.
ALTER TABLE campaign_budgets
  ADD CONSTRAINT issued_within_budget CHECK (issued_yen BETWEEN 0 AND budget_yen) NOT VALID;

-- legacy_overshoot records the campaigns that were over budget when the Before code stopped: a
-- fact for finance and promotion, not a fault. Reconcile reports them apart from drift.
CREATE TABLE legacy_overshoot (
  campaign_id text PRIMARY KEY REFERENCES campaigns,
  budget_yen  integer NOT NULL,
  issued_yen  integer NOT NULL,
  recorded_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO legacy_overshoot (campaign_id, budget_yen, issued_yen)
SELECT campaign_id, budget_yen, issued_yen FROM campaign_budgets WHERE issued_yen > budget_yen;

-- member_monthly_usage holds the R3 counter: the member x month row that two requests for
-- different campaigns collide on (it turns the write skew into a conflict on one row), rebuilt
-- from the live coupons by their Tokyo month. Members already over the cap stay over it, and
-- every new coupon of theirs that month is MONTHLY_CAP.
CREATE TABLE member_monthly_usage (
  member_id text NOT NULL,
  month     text NOT NULL CONSTRAINT month_format CHECK (month ~ '^\d{4}-(0[1-9]|1[0-2])$'),
  used_yen  integer NOT NULL DEFAULT 0 CONSTRAINT used_not_negative CHECK (used_yen >= 0),
  PRIMARY KEY (member_id, month)
);
INSERT INTO member_monthly_usage (member_id, month, used_yen)
SELECT member_id, month, SUM(amount_yen)
  FROM issued_coupons WHERE voided_at IS NULL
 GROUP BY member_id, month;
ALTER TABLE member_monthly_usage
  ADD CONSTRAINT member_id_format CHECK (member_id ~ '^[!-~]{1,128}$') NOT VALID;

-- notification_outbox: the transactional outbox, exactly one row per coupon, written in the
-- issuing transaction and relayed to LINE by functions/relay with coupon_id as the idempotency
-- key. The legacy coupons were pushed by the Before code: their rows are written sent.
CREATE TABLE notification_outbox (
  coupon_id  uuid PRIMARY KEY REFERENCES issued_coupons,
  member_id  text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  sent_at    timestamptz
);
INSERT INTO notification_outbox (coupon_id, member_id, created_at, sent_at)
SELECT coupon_id, member_id, issued_at, issued_at FROM issued_coupons;
CREATE INDEX notification_outbox_unsent ON notification_outbox (created_at) WHERE sent_at IS NULL;

-- +goose Down
-- Back to the Before code's tables: the legacy columns keep their data (write the counters back
-- first with `couponctl legacy rollback`, docs/migration.md); the new tables go.
DROP TABLE notification_outbox;
DROP TABLE member_monthly_usage;
DROP TABLE legacy_overshoot;
DROP TABLE campaign_budgets;
DROP INDEX issued_coupons_member_month;
UPDATE issued_coupons SET month = client_month WHERE client_month IS NOT NULL;
ALTER TABLE issued_coupons
  DROP CONSTRAINT voided_unredeemed,
  DROP CONSTRAINT amount_positive,
  DROP CONSTRAINT member_id_format,
  DROP CONSTRAINT month_format,
  DROP COLUMN legacy_duplicate,
  DROP COLUMN voided_at,
  DROP COLUMN client_month,
  ALTER COLUMN coupon_id DROP DEFAULT;
ALTER TABLE campaigns DROP CONSTRAINT campaign_id_format, DROP COLUMN created_at;
COMMENT ON COLUMN campaigns.issued_yen IS NULL;
