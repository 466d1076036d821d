-- +goose NO TRANSACTION
-- +goose Up
-- A lone issuance's database CPU, cut (issue 42; docs/performance.md, "A lone issuance's
-- PostgreSQL CPU, cut (00038)"). Same signatures, answers and lock order: the previous release
-- calls every function unchanged.
--
-- The id and month formats of the two tables every issuance writes, checked without regular
-- expressions. PostgreSQL matched '^[!-~]{1,128}$' (its counted repetition) in 15 us a row for
-- an id of 4 characters and 44 us for one of 38. Each statement that writes a table also reads
-- and plans every CHECK of the table again (ExecRelCheck: stringToNode, ExecPrepareExpr), so a
-- format is a call of an IMMUTABLE PL/pgSQL function, a tree of two nodes, rather than the
-- expression itself (the same tests written inline cost an insert twice the regexes'). Each
-- accepts what 00002's regex accepted on a database of locale C, as the tests' is
-- (TestPlainChecksAcceptWhatTheRegexesAccepted, schema/check_formats_test.go, over every ASCII
-- character, non-ASCII digits, the lengths at the bounds and every month 0000-00 to 9999-13);
-- where a locale's \d takes other digits (an ICU one), the new month is stricter, and only the
-- database writes months (to_char of its clock).
--
-- How a CHECK is replaced on a big table without locking issuance out (PostgreSQL 15 docs, ALTER
-- TABLE, "ADD table_constraint ... NOT VALID", "VALIDATE CONSTRAINT"): goose runs this file
-- statement by statement outside a transaction (NO TRANSACTION above), on one connection, so that
-- each lock is held only by its own statement; the tables in the issuance's lock order
-- (docs/design.md, "Lock order"), one at a time, each under lock_timeout (55P03 rather than queue
-- issuances behind a long transaction; couponctl migrate tries again).
--   1. The new CHECK is added NOT VALID under a name of its own: an ACCESS EXCLUSIVE lock for a
--      moment, no scan; new rows are checked from then on.
--   2. A month's CHECK is validated: a scan under SHARE UPDATE EXCLUSIVE, beside issuance. The
--      member id's stays NOT VALID, as 00002's was: legacy rows were never held to it.
--   3. The old CHECK is dropped and the new one takes its name, in one transaction.
-- Every step can run again: run couponctl migrate again after any failure.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION month_format_ok(p_month text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
  RETURN length(p_month) = 7 AND substr(p_month, 5, 1) = '-'
     AND ltrim(substr(p_month, 1, 4) || substr(p_month, 6, 2), '0123456789') = ''
     AND substr(p_month, 6, 2) COLLATE "C" BETWEEN '01' AND '12';
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION month_format_ok(text) IS
'Whether p_month is a month as the schema stores one: YYYY-MM, four ASCII digits, a dash, 01 to 12 '
'(NULL for NULL). The CHECK month_format of issued_coupons and member_monthly_usage (00038, in place '
'of 00002''s regular expression). IMMUTABLE, raises nothing.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION member_id_format_ok(p_member_id text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
  RETURN length(p_member_id) BETWEEN 1 AND 128
     AND ltrim(p_member_id, '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!"#$%&''()*+,-./:;<=>?@[\]^_`{|}~') = '';
END
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION member_id_format_ok(text) IS
'Whether p_member_id is a member id as the schema stores one: 1-128 characters of visible ASCII '
'(0x21-0x7E; NULL for NULL). The CHECK member_id_format of issued_coupons and member_monthly_usage '
'(00038, in place of 00002''s regular expression; docs/api.md, member_id). IMMUTABLE, raises nothing.';

SET lock_timeout = '3s';

ALTER TABLE issued_coupons DROP CONSTRAINT IF EXISTS month_format_plain, DROP CONSTRAINT IF EXISTS member_id_format_plain,
  ADD CONSTRAINT month_format_plain CHECK (month_format_ok(month)) NOT VALID,
  ADD CONSTRAINT member_id_format_plain CHECK (member_id_format_ok(member_id)) NOT VALID;

ALTER TABLE issued_coupons VALIDATE CONSTRAINT month_format_plain;

-- +goose StatementBegin
DO $$
BEGIN
  ALTER TABLE issued_coupons DROP CONSTRAINT IF EXISTS month_format, DROP CONSTRAINT IF EXISTS member_id_format;
  ALTER TABLE issued_coupons RENAME CONSTRAINT month_format_plain TO month_format;
  ALTER TABLE issued_coupons RENAME CONSTRAINT member_id_format_plain TO member_id_format;
END $$;
-- +goose StatementEnd

ALTER TABLE member_monthly_usage DROP CONSTRAINT IF EXISTS month_format_plain, DROP CONSTRAINT IF EXISTS member_id_format_plain,
  ADD CONSTRAINT month_format_plain CHECK (month_format_ok(month)) NOT VALID,
  ADD CONSTRAINT member_id_format_plain CHECK (member_id_format_ok(member_id)) NOT VALID;

ALTER TABLE member_monthly_usage VALIDATE CONSTRAINT month_format_plain;

-- +goose StatementBegin
DO $$
BEGIN
  ALTER TABLE member_monthly_usage DROP CONSTRAINT IF EXISTS month_format, DROP CONSTRAINT IF EXISTS member_id_format;
  ALTER TABLE member_monthly_usage RENAME CONSTRAINT month_format_plain TO month_format;
  ALTER TABLE member_monthly_usage RENAME CONSTRAINT member_id_format_plain TO member_id_format;
END $$;
-- +goose StatementEnd

RESET lock_timeout;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
