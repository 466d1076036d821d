-- +goose Up
-- One lock row per invariant (docs/design.md, "One lock row per invariant").
-- Every rule a constraint can state is stated here: the constraints are the last line of defence
-- behind the issuance transaction in shared/issuance.

-- campaigns is the static definition that coupons reference. Nothing updates it after creation, so
-- the KEY SHARE lock that each coupon insert's foreign-key check takes never waits on the hot budget
-- counter (docs/hot-row.md: a foreign key onto the counter row cost up to 5x at 32 clients).
CREATE TABLE campaigns (
  campaign_id text PRIMARY KEY
    CONSTRAINT campaign_id_format CHECK (campaign_id ~ '^[A-Za-z0-9_-]{1,64}$'),
  created_at  timestamptz NOT NULL DEFAULT now()
);

-- campaign_budgets holds the R1 counter: the row every issuance of the campaign serializes on.
-- budget_yen is the campaign budget approval; discount_yen the face value of one coupon.
CREATE TABLE campaign_budgets (
  campaign_id  text PRIMARY KEY REFERENCES campaigns,
  discount_yen integer NOT NULL CONSTRAINT discount_positive CHECK (discount_yen > 0),
  budget_yen   integer NOT NULL CONSTRAINT budget_positive CHECK (budget_yen > 0),
  issued_yen   integer NOT NULL DEFAULT 0,
  starts_at    timestamptz,
  ends_at      timestamptz,
  CONSTRAINT issued_within_budget CHECK (issued_yen BETWEEN 0 AND budget_yen),
  CONSTRAINT period_ordered CHECK (starts_at IS NULL OR ends_at IS NULL OR starts_at < ends_at)
);

-- member_monthly_usage holds the R3 counter: the member x month row that two requests for
-- different campaigns collide on (it turns the write skew into a conflict on one row). month is
-- the Asia/Tokyo calendar month, YYYY-MM.
CREATE TABLE member_monthly_usage (
  member_id text NOT NULL
    CONSTRAINT member_id_format CHECK (member_id ~ '^[!-~]{1,128}$'),
  month     text NOT NULL CONSTRAINT month_format CHECK (month ~ '^\d{4}-(0[1-9]|1[0-2])$'),
  used_yen  integer NOT NULL DEFAULT 0 CONSTRAINT used_not_negative CHECK (used_yen >= 0),
  PRIMARY KEY (member_id, month)
);

-- issued_coupons: one row per coupon. R2 is the unique constraint one_coupon_per_member.
-- The foreign key points at the static campaigns row, not at the hot campaign_budgets row.
CREATE TABLE issued_coupons (
  coupon_id   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  campaign_id text NOT NULL REFERENCES campaigns,
  member_id   text NOT NULL
    CONSTRAINT member_id_format CHECK (member_id ~ '^[!-~]{1,128}$'),
  month       text NOT NULL CONSTRAINT month_format CHECK (month ~ '^\d{4}-(0[1-9]|1[0-2])$'),
  amount_yen  integer NOT NULL CONSTRAINT amount_positive CHECK (amount_yen > 0),
  issued_at   timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT one_coupon_per_member UNIQUE (campaign_id, member_id)
);
CREATE INDEX issued_coupons_member_month ON issued_coupons (member_id, month);

-- notification_outbox: the transactional outbox, exactly one row per coupon, written in the
-- issuing transaction and relayed to LINE by functions/relay with coupon_id as the idempotency key.
CREATE TABLE notification_outbox (
  coupon_id  uuid PRIMARY KEY REFERENCES issued_coupons,
  member_id  text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  sent_at    timestamptz
);
CREATE INDEX notification_outbox_unsent ON notification_outbox (created_at) WHERE sent_at IS NULL;

-- +goose Down
DROP TABLE notification_outbox;
DROP TABLE issued_coupons;
DROP TABLE member_monthly_usage;
DROP TABLE campaign_budgets;
DROP TABLE campaigns;
