#!/usr/bin/env bash
# Writes the Cloud Run environment files for one project: deploy/issue.env.yaml,
# deploy/relay.env.yaml, deploy/redeem.env.yaml and deploy/console.env.yaml (everything that is
# the same in every project) followed by the project's own values (the project for the logs'
# trace field, the Cloud SQL connection name, the IAM database user, and for the console the
# audience of IAP's assertions). cloudbuild.yaml runs it before the deploy steps, which read the
# generated files (--env-vars-file).
set -euo pipefail
usage="Usage: deploy/env.sh --project ID --project-number N [--region R] [--instance NAME] [--read-pool-nodes N] --out DIR [--dry-run]

Writes DIR/issue.env.yaml, DIR/relay.env.yaml, DIR/redeem.env.yaml and DIR/console.env.yaml.

  --project-number N  the project's number (gcloud projects describe ID
                      --format='value(projectNumber)'; cloudbuild.yaml passes Cloud Build's own),
                      part of the audience IAP signs the console's assertions for
  --out DIR           where the files are written"
OUT=""
PROJECT_NUM=""
extra_flag() {
  case "$1" in
    --out) OUT=$2 ;;
    --project-number) PROJECT_NUM=$2 ;;
  esac
}
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"
[ -n "$OUT" ] || die "--out is required (see --help)"
[ -n "$PROJECT_NUM" ] || die "--project-number is required (see --help)"
[[ "$PROJECT_NUM" =~ ^[1-9][0-9]{5,18}$ ]] || die "--project-number $PROJECT_NUM: not a project number"
here=$(dirname "$0")

# write_env NAME SERVICE_ACCOUNT [KEY VALUE]...: the template NAME.env.yaml, then the project's
# values, as YAML strings.
write_env() {
  local name=$1 sa=$2
  shift 2
  if [ "$DRY_RUN" = true ]; then
    echo "+ write $OUT/$name.env.yaml" >&2
    return
  fi
  {
    cat "$here/$name.env.yaml"
    echo "# Written by deploy/env.sh for project $PROJECT."
    echo "GOOGLE_CLOUD_PROJECT: \"$PROJECT\""
    echo "INSTANCE_CONNECTION_NAME: \"$(connection_name)\""
    echo "DB_USER: \"$(db_user "$sa")\""
    while [ $# -gt 0 ]; do
      echo "$1: \"$2\""
      shift 2
    done
  } >"$OUT/$name.env.yaml"
}
run mkdir -p "$OUT"
if [ "$READ_POOL_NODES" -gt 0 ]; then
  write_env issue "$SA_ISSUE" READ_INSTANCE_CONNECTION_NAME "$PROJECT:$REGION:$(read_pool)"
else
  write_env issue "$SA_ISSUE"
fi
write_env relay "$SA_RELAY"
write_env redeem "$SA_REDEEM"
# IAP on the Cloud Run service itself signs for /projects/NUMBER/locations/REGION/services/NAME
# (behind a load balancer it would be /projects/NUMBER/global/backendServices/ID instead).
write_env console "$SA_CONSOLE" IAP_AUDIENCE "/projects/$PROJECT_NUM/locations/$REGION/services/$CONSOLE_SERVICE"
