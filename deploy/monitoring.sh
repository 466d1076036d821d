#!/usr/bin/env bash
# Step 9 of docs/deploy.md: the Cloud Monitoring dashboard and alert policies of
# deploy/monitoring/. Idempotent: each file is matched by its displayName, updated when one
# exists and created otherwise, so a second run adds nothing.
set -euo pipefail
usage="Usage: deploy/monitoring.sh --project ID [--dry-run]

Creates or updates the dashboard (deploy/monitoring/dashboard.json) and each alert policy
(deploy/monitoring/alerts/*.json) in the project, matched by displayName."
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"
here=$(dirname "$0")/monitoring

# display_name FILE: the file's top-level displayName (its first, by the files' layout, which
# deploy/monitoring_test.go checks).
display_name() {
  sed -n 's/^  "displayName": "\(.*\)",$/\1/p' "$1" | head -n 1
}

# apply KIND FILE: update the KIND ("dashboards" or "policies") named as FILE's displayName, or
# create it.
apply() {
  local kind=$1 file=$2 name existing
  local -a cmd=(gcloud monitoring dashboards) flag=--config-from-file
  if [ "$kind" = policies ]; then
    cmd=(gcloud alpha monitoring policies) flag=--policy-from-file
  fi
  name=$(display_name "$file")
  [ -n "$name" ] || die "$file: no top-level displayName"
  existing=$(run "${cmd[@]}" list --project="$PROJECT" --filter="displayName=\"$name\"" --format='value(name)')
  case "$(printf '%s' "$existing" | grep -c .)" in
    0) run "${cmd[@]}" create --project="$PROJECT" "$flag=$file" --format=none ;;
    1) run "${cmd[@]}" update "$existing" --project="$PROJECT" "$flag=$file" --format=none ;;
    *) die "$kind named \"$name\": more than one exists ($existing); delete all but one, then run again" ;;
  esac
}

apply dashboards "$here/dashboard.json"
for f in "$here"/alerts/*.json; do
  apply policies "$f"
done
echo "monitoring done: the dashboard and $(find "$here/alerts" -name '*.json' | wc -l) alert policies in $PROJECT."
