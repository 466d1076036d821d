-- +goose Up
-- R3's cap is read after its lock, in a statement of its own. 00021's monthly_cap_yen() was one
-- STABLE SQL statement: its snapshot was taken before it waited for coupon_rules' lock, so an
-- issuance queued behind a coupon_rules_set read the cap that change had just replaced, and was
-- issued at the old cap after the new one was in force (reconcile then found R3 broken; found
-- trying the release as a new user, schema's TestCapChangeDividesTheCoupons). Here the lock comes
-- first and the read takes a new snapshot after it (READ COMMITTED, a VOLATILE function: each
-- statement its own snapshot), so a call that waited reads the cap committed before it got the
-- lock. 00023 had rewritten it in PL/pgSQL for its speed, whose statement already reads in a
-- snapshot of its own; here the lock is its own statement, before the read, so that the order is
-- written down rather than left to the language. Same name, arguments and result:
-- issue_coupons_batch is unchanged.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION monthly_cap_yen() RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  LOCK TABLE public.coupon_rules IN ACCESS SHARE MODE;
  RETURN (SELECT r.monthly_cap_yen FROM public.coupon_rules r);
END
$$;
-- +goose StatementEnd

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
