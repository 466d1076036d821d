#!/usr/bin/env bash
# Step 9 of docs/deploy.md: the Cloud Monitoring dashboard and alert policies of
# deploy/monitoring/. Idempotent: each file is matched by its displayName, updated in place when
# one exists and created otherwise, so a second run adds nothing.
#
# - A dashboard is updated with the etag of the one in place (the Dashboards API refuses an
#   update without it).
# - A policy in place is replaced by its file, except for what belongs to the project: its
#   notification channels and its enabled state are read first and given back with the update
#   (gcloud's --fields takes only disabled and notificationChannels, the fields it would keep,
#   not those the file defines).
# - --notification-channel adds a channel to every policy; without one, alerts open incidents
#   that notify nobody.
set -euo pipefail
usage="Usage: deploy/monitoring.sh --project ID [--notification-channel CHANNEL] [--dry-run]

Creates or updates the dashboard (deploy/monitoring/dashboard.json) and each alert policy
(deploy/monitoring/alerts/*.json) in the project, matched by displayName; a policy in place
keeps its notification channels and enabled state. Alert policies are gcloud alpha commands in
Cloud SDK 528 (the google-cloud-cli Debian and RPM packages include them; an SDK from the
installer archive needs gcloud components install alpha).

  --notification-channel CHANNEL
                     a notification channel (projects/ID/notificationChannels/N, from
                     gcloud beta monitoring channels list) added to every alert policy"
CHANNEL=""
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

# policy FILE: create the policy (with CHANNEL), or replace the one in place by FILE, giving
# it back its notification channels (plus CHANNEL) and its enabled state.
policy() {
  local file=$1 name state enabled channels keep=()
  name=$(existing gcloud alpha monitoring policies "$(display_name "$file")")
  if [ -z "$name" ]; then
    if [ -n "$CHANNEL" ]; then
      keep=(--notification-channels="$CHANNEL")
    fi
    run gcloud alpha monitoring policies create --project="$PROJECT" --policy-from-file="$file" "${keep[@]}" --format=none
    return
  fi
  # "True<TAB>channel,channel"; under --dry-run nothing, read as enabled with no channel.
  state=$(run gcloud alpha monitoring policies describe "$name" --project="$PROJECT" \
    --format='value(enabled,notificationChannels.join(","))')
  IFS=$'\t' read -r enabled channels <<<"$state" || true
  if [ -n "$CHANNEL" ] && [[ ",$channels," != *",$CHANNEL,"* ]]; then
    channels=${channels:+$channels,}$CHANNEL
  fi
  if [ "$enabled" = False ]; then keep=(--no-enabled); else keep=(--enabled); fi
  if [ -n "$channels" ]; then
    keep+=(--set-notification-channels="$channels")
  else
    keep+=(--clear-notification-channels)
  fi
  run gcloud alpha monitoring policies update "$name" --project="$PROJECT" --policy-from-file="$file" \
    "${keep[@]}" --format=none
}

dashboard "$here/dashboard.json"
for f in "$here"/alerts/*.json; do
  policy "$f"
done
echo "monitoring done: the dashboard and $(find "$here/alerts" -name '*.json' | wc -l) alert policies in $PROJECT."
if [ -z "$CHANNEL" ]; then
  echo "No --notification-channel: the alerts notify nobody until a channel is added (docs/deploy.md, step 9)." >&2
fi
