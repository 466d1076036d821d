#!/usr/bin/env bash
# Roll back (docs/deploy.md, "Roll forward and back"): send all traffic of both services to the
# revision before the newest one, or to the revisions named. The schema is not rolled back:
# migrations only add (expand first, contract in a later release), so the previous code runs
# on the newer schema.
set -euo pipefail
usage="Usage: deploy/rollback.sh --project ID [--region R] [--issue-revision REV] [--relay-revision REV] [--dry-run]

Sends all traffic of issue-coupon and relay-outbox to the revision named, or without one to the
revision created before the newest.

  --issue-revision REV  issue-coupon's revision (gcloud run revisions list --service=issue-coupon)
  --relay-revision REV  relay-outbox's revision"
ISSUE_REVISION=""
RELAY_REVISION=""
extra_flag() {
  case "$1" in
    --issue-revision) ISSUE_REVISION=$2 ;;
    --relay-revision) RELAY_REVISION=$2 ;;
  esac
}
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"

# previous SERVICE: the name of the revision created before the newest.
previous() {
  local revs
  revs=$(run gcloud run revisions list --service="$1" --project="$PROJECT" --region="$REGION" \
    --sort-by=~metadata.creationTimestamp --limit=2 --format='value(metadata.name)')
  if [ "$DRY_RUN" = true ]; then
    echo "$1-previous"
    return
  fi
  [ "$(wc -l <<<"$revs")" -eq 2 ] || die "$1 has no earlier revision to roll back to"
  tail -n 1 <<<"$revs"
}
[ -n "$ISSUE_REVISION" ] || ISSUE_REVISION=$(previous "$ISSUE_SERVICE")
[ -n "$RELAY_REVISION" ] || RELAY_REVISION=$(previous "$RELAY_SERVICE")
run gcloud run services update-traffic "$ISSUE_SERVICE" --project="$PROJECT" --region="$REGION" --to-revisions="$ISSUE_REVISION=100"
run gcloud run services update-traffic "$RELAY_SERVICE" --project="$PROJECT" --region="$REGION" --to-revisions="$RELAY_REVISION=100"
