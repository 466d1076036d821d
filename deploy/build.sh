#!/usr/bin/env bash
# Step 3 of docs/deploy.md: run cloudbuild.yaml (test, migrate, deploy both functions) from
# this checkout; the build runs as coupon-deploy (cloudbuild.yaml's serviceAccount), so the
# account running this script needs roles/iam.serviceAccountUser on it (an owner has it).
# Rolling back is deploy/rollback.sh.
set -euo pipefail
usage="Usage: deploy/build.sh --project ID [--region R] [--instance NAME] [--dry-run]

Submits this checkout to Cloud Build with cloudbuild.yaml, which runs as coupon-deploy (the
identity whose Cloud SQL IAM user applies the migrations)."
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"
cd "$(dirname "$0")/.."
# beta: the build logs to Cloud Logging only (cloudbuild.yaml, as a build with its own service
# account must), and GA gcloud builds submit streams only logs kept in Cloud Storage.

run gcloud beta builds submit . --project="$PROJECT" --region="$REGION" --config=cloudbuild.yaml \
  --substitutions="_REGION=$REGION,_INSTANCE=$INSTANCE"
