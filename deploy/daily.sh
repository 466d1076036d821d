#!/usr/bin/env bash
# Step 6 of docs/deploy.md: the daily operator jobs, as Cloud Run jobs of cmd/couponops (the
# operator verbs and nothing else), run as coupon-admin (database role coupon_admin,
# docs/roles.md) and started by Cloud Scheduler. The image is built first from this checkout
# (deploy/couponops.cloudbuild.yaml, as coupon-build), so run it again after a deploy that
# changes the verbs or the schema. Idempotent.
#
#   coupon-reconcile  couponops reconcile: counters against rows, the outbox against the coupons
#                     (docs/migration.md, step 7). Drift exits 1 (the execution fails), is logged
#                     at ERROR and exported as the drift metrics (docs/operations.md).
#   coupon-prune      couponops outbox prune: deletes sent and skipped outbox rows older than
#                     RELAY_RETENTION (the relay itself deletes nothing: coupon_relay has no DELETE).
set -euo pipefail
usage="Usage: deploy/daily.sh --project ID [--region R] [--instance NAME] [--dry-run]

Builds the couponops image from this checkout (Cloud Build, as coupon-build), deploys the Cloud
Run jobs coupon-reconcile and coupon-prune from it (as coupon-admin), lets only
coupon-scheduler run them, and schedules them daily in Asia/Tokyo."
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"

# After the night's traffic and before the day's campaigns (Asia/Tokyo): reconcile first, prune
# an hour later. Each job holds at most JOB_POOL connections (docs/deploy.md, "Connections").
readonly RECONCILE_SCHEDULE="30 4 * * *"
readonly PRUNE_SCHEDULE="30 5 * * *"
readonly JOB_POOL=2
readonly RETENTION=720h # RELAY_RETENTION: 30 days, outbox prune's default

env_vars="INSTANCE_CONNECTION_NAME=$(connection_name),DB_USER=$(db_user "$SA_ADMIN"),DB_NAME=$DATABASE"
env_vars+=",DB_IAM_AUTH=true,DB_POOL_MAX_CONNS=$JOB_POOL,RELAY_RETENTION=$RETENTION,GOOGLE_CLOUD_PROJECT=$PROJECT"
# Metrics only (reconcile's drift, which an alert reads), through the Telemetry API as the
# functions do (docs/operations.md, "Export path"); flushed when couponops exits.
env_vars+=",OTEL_METRICS_EXPORTER=otlp_google,OTEL_TRACES_EXPORTER=none"

# The image, in the repository setup.sh made for Cloud Run's images; the jobs run the digest
# that the tag names when they are deployed, right after the build.
image="$REGION-docker.pkg.dev/$PROJECT/cloud-run-source-deploy/couponops:latest"
cd "$(dirname "$0")/.."
# beta streams the build's Cloud Logging logs (build.sh says why).
run gcloud beta builds submit . --project="$PROJECT" --region="$REGION" --config=deploy/couponops.cloudbuild.yaml \
  --substitutions="_IMAGE=$image"

# deploy_job NAME ARGS: a Cloud Run job that runs couponops ARGS (comma-separated) once, no
# retry (a failed reconcile is a finding, not a flake).
deploy_job() {
  run gcloud run jobs deploy "$1" --project="$PROJECT" --region="$REGION" --image="$image" --args="$2" \
    --service-account="$(sa_email "$SA_ADMIN")" --set-env-vars="$env_vars,OTEL_SERVICE_NAME=$1" \
    --tasks=1 --max-retries=0 --task-timeout=600s --cpu=1 --memory=512Mi
}
deploy_job "$RECONCILE_JOB" reconcile
deploy_job "$PRUNE_JOB" outbox,prune

# schedule NAME CRON: Cloud Scheduler starts job NAME through the Cloud Run Admin API, as
# coupon-scheduler (OAuth, the API's own audience), the only member allowed to run it.
schedule() {
  local job=$1 cron=$2 uri
  bind "run jobs" "$job" "serviceAccount:$(sa_email "$SA_SCHEDULER")" roles/run.invoker --region="$REGION"
  uri="https://run.googleapis.com/v2/projects/$PROJECT/locations/$REGION/jobs/$job:run"
  local flags=(--project="$PROJECT" --location="$REGION" --schedule="$cron" --time-zone=Asia/Tokyo
    --uri="$uri" --http-method=POST --oauth-service-account-email="$(sa_email "$SA_SCHEDULER")")
  if exists gcloud scheduler jobs describe "$job-daily" --project="$PROJECT" --location="$REGION"; then
    run gcloud scheduler jobs update http "$job-daily" "${flags[@]}"
  else
    run gcloud scheduler jobs create http "$job-daily" "${flags[@]}"
  fi
}
schedule "$RECONCILE_JOB" "$RECONCILE_SCHEDULE"
schedule "$PRUNE_JOB" "$PRUNE_SCHEDULE"
echo "daily jobs done: $RECONCILE_JOB at $RECONCILE_SCHEDULE, $PRUNE_JOB at $PRUNE_SCHEDULE (Asia/Tokyo), as $SA_ADMIN."
