#!/usr/bin/env bash
# Step 3 of docs/deploy.md: run cloudbuild.yaml (test, migrate, deploy the three functions and
# the console) from this checkout; the build runs as coupon-deploy (cloudbuild.yaml's
# serviceAccount), so the account running this script needs roles/iam.serviceAccountUser on it
# (an owner has it).
# Rolling back is deploy/rollback.sh. After a build that succeeded it writes the released commit
# to deploy/previous-release (PREVIOUS_RELEASE_FILE in the deploy tests), the release the next
# one runs beside (docs/deploy.md, "Releases"): commit that file.
set -euo pipefail
usage="Usage: deploy/build.sh --project ID [--region R] [--instance NAME] [--read-pool-nodes N] [--dry-run]

Submits this checkout to Cloud Build with cloudbuild.yaml, which runs as coupon-deploy (the
identity whose Cloud SQL IAM user applies the migrations). When the build succeeds, writes the
released commit to deploy/previous-release, to be committed: the next release's tests run it
beside that release (docs/deploy.md, \"Releases\")."
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"
cd "$(dirname "$0")/.."
# beta: the build logs to Cloud Logging only (cloudbuild.yaml, as a build with its own service
# account must), and GA gcloud builds submit streams only logs kept in Cloud Storage.

run gcloud beta builds submit . --project="$PROJECT" --region="$REGION" --config=cloudbuild.yaml \
  --substitutions="_REGION=$REGION,_INSTANCE=$INSTANCE,_READ_POOL_NODES=$READ_POOL_NODES"

# The released commit, for the next release's mixed-fleet test (internal/testkit/mixedfleet).
release_file=${PREVIOUS_RELEASE_FILE:-deploy/previous-release}
if ! commit=$(git rev-parse --short HEAD 2>/dev/null); then
  echo "build.sh: not a git checkout: $release_file not updated; write the released commit in it by hand" >&2
elif [ "$DRY_RUN" = false ]; then
  if [ -n "$(git status --porcelain)" ]; then
    echo "build.sh: the checkout had uncommitted changes: the release is $commit plus them" >&2
  fi
  { grep '^#' "$release_file" 2>/dev/null || true; echo "$commit"; } >"$release_file.tmp"
  mv "$release_file.tmp" "$release_file"
  echo "build.sh: released $commit; $release_file now names it: commit it (git commit $release_file -m 'release $commit')" >&2
fi
