#!/usr/bin/env bash
# Step 9 of docs/deploy.md: the Cloud Monitoring dashboard and alert policies of
# deploy/monitoring/. Idempotent: each file is matched by its displayName, updated in place when
# one exists and created otherwise, so a second run adds nothing.
#
# - A dashboard is updated with the etag of the one in place (the Dashboards API refuses an
#   update without it).
# - A policy is updated field by field (--fields): what the file defines is replaced, what was
#   added in the project (notification channels, enabled state) is kept.
# - --notification-channel adds a channel to every policy; without one, alerts open incidents
#   that notify nobody.
set -euo pipefail
usage="Usage: deploy/monitoring.sh --project ID [--notification-channel CHANNEL] [--dry-run]

Creates or updates the dashboard (deploy/monitoring/dashboard.json) and each alert policy
(deploy/monitoring/alerts/*.json) in the project, matched by displayName. Needs the gcloud alpha
component (gcloud components install alpha).

  --notification-channel CHANNEL
                     a notification channel (projects/ID/notificationChannels/N, from
                     gcloud beta monitoring channels list) added to every alert policy"
CHANNEL=""
extra_flags="--notification-channel"
extra_flag() { CHANNEL=$2; }
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"
if [ -n "$CHANNEL" ] && ! [[ "$CHANNEL" =~ ^projects/[a-z][a-z0-9-]+/notificationChannels/[0-9]+$ ]]; then
  die "--notification-channel $CHANNEL: not a channel name (projects/PROJECT/notificationChannels/NUMBER)"
fi
here=$(dirname "$0")/monitoring
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The fields an alert policy file defines (deploy/monitoring_test.go checks the files have no others).
readonly POLICY_FIELDS=displayName,severity,combiner,conditions,alertStrategy,documentation

# display_name FILE: the file's top-level displayName (its first, by the files' layout, which
# deploy/monitoring_test.go checks).
display_name() {
  sed -n 's/^  "displayName": "\(.*\)",$/\1/p' "$1" | head -n 1
}

# existing LIST-COMMAND... NAME: the resource name of the one named NAME, "" if none; fails if
# there are several.
existing() {
  local name=${*: -1} found
  found=$(run "${@:1:$#-1}" list --project="$PROJECT" --filter="displayName=\"$name\"" --format='value(name)')
  if [ "$(printf '%s' "$found" | grep -c .)" -gt 1 ]; then
    die "more than one named \"$name\" ($found): delete all but one, then run again"
  fi
  echo "$found"
}

# dashboard FILE: create the dashboard, or update the one in place with its etag.
dashboard() {
  local file=$1 name etag with_etag
  name=$(existing gcloud monitoring dashboards "$(display_name "$file")")
  if [ -z "$name" ]; then
    run gcloud monitoring dashboards create --project="$PROJECT" --config-from-file="$file" --format=none
    return
  fi
  etag=$(run gcloud monitoring dashboards describe "$name" --project="$PROJECT" --format='value(etag)')
  with_etag=$scratch/$(basename "$file")
  { echo '{'; echo "  \"etag\": \"$etag\","; tail -n +2 "$file"; } >"$with_etag"
  run gcloud monitoring dashboards update "$name" --project="$PROJECT" --config-from-file="$with_etag" --format=none
}

# policy FILE: create the policy, or update the fields the file defines; then add CHANNEL.
policy() {
  local file=$1 name
  name=$(existing gcloud alpha monitoring policies "$(display_name "$file")")
  if [ -z "$name" ]; then
    name=$(run gcloud alpha monitoring policies create --project="$PROJECT" --policy-from-file="$file" --format='value(name)')
  else
    run gcloud alpha monitoring policies update "$name" --project="$PROJECT" --policy-from-file="$file" \
      --fields="$POLICY_FIELDS" --format=none
  fi
  if [ -n "$CHANNEL" ]; then
    if [ "$DRY_RUN" = true ]; then
      name="\$POLICY" # what the create above prints
    fi
    run gcloud alpha monitoring policies update "$name" --project="$PROJECT" \
      --add-notification-channels="$CHANNEL" --format=none
  fi
}

dashboard "$here/dashboard.json"
for f in "$here"/alerts/*.json; do
  policy "$f"
done
echo "monitoring done: the dashboard and $(find "$here/alerts" -name '*.json' | wc -l) alert policies in $PROJECT."
if [ -z "$CHANNEL" ]; then
  echo "No --notification-channel: the alerts notify nobody until a channel is added (docs/deploy.md, step 9)." >&2
fi
