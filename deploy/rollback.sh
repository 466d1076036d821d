#!/usr/bin/env bash
# Roll back (docs/deploy.md, "Roll forward and back"): send all traffic of the four services to
# the revision before the newest one, or to the revisions named. The schema is not rolled back:
# migrations only add (expand first, contract in a later release), so the previous code runs
# on the newer schema.
set -euo pipefail
usage="Usage: deploy/rollback.sh --project ID [--region R] [--issue-revision REV] [--relay-revision REV] [--redeem-revision REV] [--console-revision REV] [--dry-run]

Sends all traffic of issue-coupon, relay-outbox, coupon-redeem and coupon-console to the
revision named, or without one to the revision created before the newest. A console or a
coupon-redeem with no earlier revision (the release that first deployed it) is left as it is,
and said so.

  --issue-revision REV    issue-coupon's revision (gcloud run revisions list --service=issue-coupon)
  --relay-revision REV    relay-outbox's revision
  --redeem-revision REV   coupon-redeem's revision
  --console-revision REV  coupon-console's revision"
ISSUE_REVISION=""
RELAY_REVISION=""
REDEEM_REVISION=""
CONSOLE_REVISION=""
extra_flag() {
  case "$1" in
    --issue-revision) ISSUE_REVISION=$2 ;;
    --relay-revision) RELAY_REVISION=$2 ;;
    --redeem-revision) REDEEM_REVISION=$2 ;;
    --console-revision) CONSOLE_REVISION=$2 ;;
  esac
}
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"

# previous SERVICE: the name of the revision created before the newest, or nothing when there
# is none.
previous() {
  local revs
  revs=$(run gcloud run revisions list --service="$1" --project="$PROJECT" --region="$REGION" \
    --sort-by=~metadata.creationTimestamp --limit=2 --format='value(metadata.name)')
  if [ "$DRY_RUN" = true ]; then
    echo "$1-previous"
  elif [ "$(grep -c . <<<"$revs")" -eq 2 ]; then
    tail -n 1 <<<"$revs"
  fi
}
[ -n "$ISSUE_REVISION" ] || ISSUE_REVISION=$(previous "$ISSUE_SERVICE")
[ -n "$ISSUE_REVISION" ] || die "$ISSUE_SERVICE has no earlier revision to roll back to"
[ -n "$RELAY_REVISION" ] || RELAY_REVISION=$(previous "$RELAY_SERVICE")
[ -n "$RELAY_REVISION" ] || die "$RELAY_SERVICE has no earlier revision to roll back to"
[ -n "$REDEEM_REVISION" ] || REDEEM_REVISION=$(previous "$REDEEM_SERVICE")
[ -n "$CONSOLE_REVISION" ] || CONSOLE_REVISION=$(previous "$CONSOLE_SERVICE")
run gcloud run services update-traffic "$ISSUE_SERVICE" --project="$PROJECT" --region="$REGION" --to-revisions="$ISSUE_REVISION=100"
run gcloud run services update-traffic "$RELAY_SERVICE" --project="$PROJECT" --region="$REGION" --to-revisions="$RELAY_REVISION=100"
# RedeemCoupon, like the console, has one revision only in the release that first deployed it:
# left serving, on the schema that has its functions (the schema is not rolled back).
if [ -n "$REDEEM_REVISION" ]; then
  run gcloud run services update-traffic "$REDEEM_SERVICE" --project="$PROJECT" --region="$REGION" --to-revisions="$REDEEM_REVISION=100"
else
  echo "rollback.sh: $REDEEM_SERVICE has no earlier revision: left on its newest revision" >&2
fi
if [ -n "$CONSOLE_REVISION" ]; then
  run gcloud run services update-traffic "$CONSOLE_SERVICE" --project="$PROJECT" --region="$REGION" --to-revisions="$CONSOLE_REVISION=100"
else
  echo "rollback.sh: $CONSOLE_SERVICE has no earlier revision: left on its newest revision" >&2
fi
