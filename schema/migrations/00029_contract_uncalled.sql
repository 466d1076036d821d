-- +goose Up
-- The contract step for three functions that no release calls (issue 39, item 4; docs/deploy.md,
-- "Releases", step 4): neither this tree's code nor the previous release's (deploy/previous-release,
-- 980de4a, whose schema ends at 00013 and which calls issue_coupon, issue_coupons_batch,
-- grant_coupon, coupon_void and the campaign_change_* functions), and no function of the schema:
--   issue_dry_run(text, text)       00025's dry run of one member, a wrapper of issue_dry_run_batch
--                                   since 00028; IssueCoupon asks issue_dry_run_batch, alone too
--   coupon_rules_set(integer, text) 00021's form, a wrapper of the three-argument form since
--                                   00026; `couponctl rules set` calls the three-argument form
--   campaign_inactive_reason with 4 timestamptz arguments
--                                   00010's rule, blind to the coupons' fixed expiry; every
--                                   caller has passed the expiry to the 5-argument form since 00015
-- DROP FUNCTION waits for no call in flight (a call holds no lock on its function), and one of
-- these in flight would fail with XX000: there is none, since nothing calls them.
SET LOCAL lock_timeout = '3s'; -- give up (55P03) rather than queue issuances behind a long transaction

DROP FUNCTION issue_dry_run(text, text);
DROP FUNCTION coupon_rules_set(integer, text);
DROP FUNCTION campaign_inactive_reason(timestamptz, timestamptz, timestamptz, timestamptz);

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
