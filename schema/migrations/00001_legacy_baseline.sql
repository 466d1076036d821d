-- +goose Up
-- The baseline: the tables of the Before code as production holds them (docs/migration.md,
-- "Legacy tables"). On the production database they already exist and this step changes
-- nothing; on an empty database it creates them empty. Either way the migrations after it
-- transform the same shape, so both worlds end with the same schema.
SET LOCAL lock_timeout = '3s';

CREATE TABLE IF NOT EXISTS campaigns (
  campaign_id  text PRIMARY KEY,
  discount_yen integer NOT NULL,
  budget_yen   integer NOT NULL,
  issued_yen   integer NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS issued_coupons (
  coupon_id   uuid PRIMARY KEY,
  campaign_id text NOT NULL REFERENCES campaigns,
  member_id   text NOT NULL,
  month       text NOT NULL,
  amount_yen  integer NOT NULL,
  issued_at   timestamptz NOT NULL DEFAULT now(),
  redeemed_at timestamptz
);

-- +goose Down
-- The baseline is production's own data: it is never dropped by a migration.
SELECT 1;
