-- +goose Up
-- Budget stripes (docs/hot-campaigns.md; docs/design.md, "What to watch, and when to change the design"): a hot
-- campaign's budget is split over K rows of campaign_budgets, one per stripe, so that K issuances
-- can hold a budget row at once instead of queueing on one. Each stripe is its own R1 counter with
-- its own CHECK (issued_within_budget), so no stripe, and therefore no campaign, can overshoot.
-- A campaign's figures are the sums over its stripes; a campaign without stripes is stripe 0 alone.
-- discount_yen, starts_at and ends_at are the campaign's and are written alike on every stripe.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue readers behind a long transaction
ALTER TABLE campaign_budgets
  ADD COLUMN stripe smallint NOT NULL DEFAULT 0
    CONSTRAINT stripe_in_range CHECK (stripe BETWEEN 0 AND 63);
ALTER TABLE campaign_budgets DROP CONSTRAINT campaign_budgets_pkey;
ALTER TABLE campaign_budgets ADD CONSTRAINT campaign_budgets_pkey PRIMARY KEY (campaign_id, stripe);

-- +goose Down
-- Fold every campaign's stripes back into stripe 0 before the stripe column goes.
UPDATE campaign_budgets b SET budget_yen = s.budget_yen, issued_yen = s.issued_yen
  FROM (SELECT campaign_id, sum(budget_yen)::integer AS budget_yen, sum(issued_yen)::integer AS issued_yen
          FROM campaign_budgets GROUP BY campaign_id) s
 WHERE b.campaign_id = s.campaign_id AND b.stripe = 0;
DELETE FROM campaign_budgets WHERE stripe <> 0;
ALTER TABLE campaign_budgets DROP CONSTRAINT campaign_budgets_pkey;
ALTER TABLE campaign_budgets ADD CONSTRAINT campaign_budgets_pkey PRIMARY KEY (campaign_id);
ALTER TABLE campaign_budgets DROP COLUMN stripe;
