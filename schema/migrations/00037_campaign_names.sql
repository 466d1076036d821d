-- +goose Up
-- A campaign's display name, beside its id, for the promotion team (issue 40; docs/console.md,
-- "The team's view"): 「年末感謝祭 500円クーポン」 beside NENMATSU-500.
--   campaign_names     one name per campaign, set and changed through campaign_name_set
--   campaign_name_set  names a campaign, with a 'name' history row (before, after, reason)
-- A table of its own: no table the issuance reads or writes is altered or locked. The previous
-- release reads none of it. couponctl reads the names as coupon_admin, the console as
-- coupon_console.
SET LOCAL lock_timeout = '5s';

CREATE TABLE campaign_names (
  campaign_id text PRIMARY KEY REFERENCES campaigns,
  name        text NOT NULL CONSTRAINT name_shown CHECK (char_length(name) BETWEEN 1 AND 100 AND btrim(name) = name
                                                         AND name !~ '[[:cntrl:]]')
);
GRANT SELECT ON campaign_names TO coupon_admin, coupon_console;

-- The history takes 'name' changes, its check replaced as 00025 replaced it (the history is small:
-- a change function's insert waits for this migration at most, and no issuance writes it).
ALTER TABLE campaign_changes DROP CONSTRAINT what_known,
  ADD CONSTRAINT what_known CHECK (what IN ('budget', 'stripes', 'period', 'pause', 'resume', 'end', 'validity', 'create',
                                            'repair', 'release', 'audience', 'name')) NOT VALID;
ALTER TABLE campaign_changes VALIDATE CONSTRAINT what_known;

-- +goose StatementBegin
CREATE FUNCTION campaign_name_set(p_campaign_id text, p_name text, p_reason text)
RETURNS SETOF campaign_changes
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
AS $$
DECLARE
  v_before text;
BEGIN
  IF p_name IS NULL OR char_length(btrim(p_name)) NOT BETWEEN 1 AND 100 OR p_name ~ '[[:cntrl:]]' THEN
    RAISE EXCEPTION USING ERRCODE = 'CI422',
      MESSAGE = format('campaign %s: a name of 1-100 characters, not blank, without control characters; nothing changed', p_campaign_id);
  END IF;
  PERFORM 1 FROM campaigns c WHERE c.campaign_id = p_campaign_id FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CI404', MESSAGE = format('campaign %s does not exist', p_campaign_id);
  END IF;
  SELECT n.name INTO v_before FROM campaign_names n WHERE n.campaign_id = p_campaign_id FOR UPDATE;
  IF v_before IS NOT DISTINCT FROM btrim(p_name) THEN
    RETURN;
  END IF;
  INSERT INTO campaign_names (campaign_id, name) VALUES (p_campaign_id, btrim(p_name))
  ON CONFLICT (campaign_id) DO UPDATE SET name = EXCLUDED.name;
  RETURN NEXT campaign_change_record(p_campaign_id, issue_now(), 'name',
    jsonb_build_object('name', v_before), jsonb_build_object('name', btrim(p_name)), p_reason);
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION campaign_name_set(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION campaign_name_set(text, text, text) TO coupon_admin;
COMMENT ON FUNCTION campaign_name_set(text, text, text) IS
$$Names campaign p_campaign_id p_name (trimmed), shown beside its id by couponctl and the console,
for reason p_reason, and answers the 'name' campaign_changes row (before and after), or none when
it had that name already. Lock: the campaign's campaign_names row alone (and its campaigns row FOR
KEY SHARE): a name changes nothing the issuance reads. Errors: CI422 for a name not of 1-100
characters, blank or with control characters, or a blank reason (campaign_change_record), CI404
for no such campaign. SECURITY DEFINER, executable by coupon_admin (couponctl campaign create and
campaign update, their name flag).$$;

-- +goose Down
DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;
