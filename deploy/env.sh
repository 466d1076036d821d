#!/usr/bin/env bash
# Writes the functions' Cloud Run environment files for one project: deploy/issue.env.yaml and
# deploy/relay.env.yaml (everything that is the same in every project) followed by the
# project's own values (the project for the logs' trace field, the Cloud SQL connection name,
# the IAM database user). cloudbuild.yaml
# runs it before the deploy steps, which read the generated files (--env-vars-file).
set -euo pipefail
usage="Usage: deploy/env.sh --project ID [--region R] [--instance NAME] --out DIR [--dry-run]

Writes DIR/issue.env.yaml and DIR/relay.env.yaml."
OUT=""
extra_flag() { OUT=$2; }
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"
[ -n "$OUT" ] || die "--out is required (see --help)"
here=$(dirname "$0")

# write_env FUNCTION SERVICE_ACCOUNT: the template, then the project's values, as YAML strings.
write_env() {
  local fn=$1 sa=$2
  if [ "$DRY_RUN" = true ]; then
    echo "+ write $OUT/$fn.env.yaml" >&2
    return
  fi
  {
    cat "$here/$fn.env.yaml"
    echo "# Written by deploy/env.sh for project $PROJECT."
    echo "GOOGLE_CLOUD_PROJECT: \"$PROJECT\""
    echo "INSTANCE_CONNECTION_NAME: \"$(connection_name)\""
    echo "DB_USER: \"$(db_user "$sa")\""
  } >"$OUT/$fn.env.yaml"
}
run mkdir -p "$OUT"
write_env issue "$SA_ISSUE"
write_env relay "$SA_RELAY"
