#!/usr/bin/env bash
# Step 1 of docs/deploy.md: everything the build and the functions need, in an empty project.
# Idempotent (each resource is described first and created only when missing; IAM bindings are
# added, which changes nothing when they exist), so it is safe to run again after a change.
set -euo pipefail
usage="Usage: deploy/setup.sh --project ID [--region R] [--instance NAME] [--gateway-sa EMAIL] [--read-pool-nodes N] [--dry-run]

Enables the APIs; creates the service accounts (one per function and the console's, the
gateway's and the scheduler's callers, the deploy build's, the source builds'), the Cloud SQL
instance with IAM database authentication, the database, one IAM database user per runtime
identity, the secrets (the LINE token's, the member-hash key's, the console's CSRF key's), the
build bucket, and the IAM bindings (docs/deploy.md lists them and why); with --read-pool-nodes,
the read pool that answers IssueCoupon's dry runs."
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"

# The Cloud SQL instance (docs/deploy.md, "Connections"): 2 vCPUs as on the machine the
# figures in docs/hot-row.md and docs/performance.md were measured on, and max_connections set
# explicitly so that the connection budget does not depend on the tier's default.
readonly DB_TIER=db-custom-2-7680
readonly DB_MAX_CONNECTIONS=100
# A read pool needs its primary in Enterprise Plus (Cloud SQL, "About read pools"): with
# --read-pool-nodes the instance is created there, on the smallest Enterprise Plus machine (2
# vCPUs, 16 GB), and each read pool node on the same; an instance made before in Enterprise
# is moved with `gcloud sql instances patch` first (docs/deploy.md, "The read pool").
DB_EDITION=ENTERPRISE
db_tier=$DB_TIER
if [ "$READ_POOL_NODES" -gt 0 ]; then
  DB_EDITION=ENTERPRISE_PLUS
  db_tier=db-perf-optimized-N-2
fi
readonly DB_EDITION db_tier

run gcloud services enable --project="$PROJECT" \
  run.googleapis.com cloudbuild.googleapis.com artifactregistry.googleapis.com \
  sqladmin.googleapis.com secretmanager.googleapis.com cloudscheduler.googleapis.com \
  iam.googleapis.com iamcredentials.googleapis.com iap.googleapis.com \
  telemetry.googleapis.com cloudtrace.googleapis.com monitoring.googleapis.com

accounts=("$SA_ISSUE" "$SA_RELAY" "$SA_REDEEM" "$SA_SCHEDULER" "$SA_DEPLOY" "$SA_BUILD" "$SA_ADMIN" "$SA_CONSOLE")
if [ "$GATEWAY_SA" = "$(sa_email "$SA_GATEWAY")" ]; then
  accounts+=("$SA_GATEWAY")
fi
for sa in "${accounts[@]}"; do
  exists gcloud iam service-accounts describe "$(sa_email "$sa")" --project="$PROJECT" ||
    run gcloud iam service-accounts create "$sa" --project="$PROJECT" --display-name="coupon-api $sa"
done

# Cloud Run source deploys push their images here; created ahead so that no deployer needs
# the right to create repositories.
exists gcloud artifacts repositories describe cloud-run-source-deploy --project="$PROJECT" --location="$REGION" ||
  run gcloud artifacts repositories create cloud-run-source-deploy --project="$PROJECT" \
    --location="$REGION" --repository-format=docker

# The bucket gcloud builds submit uploads the source to (gs://PROJECT_cloudbuild/source; gcloud
# would create it on the first submit): made here so that coupon-deploy can be granted reading
# this bucket only.
build_bucket="gs://${PROJECT}_cloudbuild"
exists gcloud storage buckets describe "$build_bucket" --project="$PROJECT" ||
  run gcloud storage buckets create "$build_bucket" --project="$PROJECT" --location="$REGION" \
    --uniform-bucket-level-access

# Public IP, but only the Cloud SQL connectors may connect (TRUSTED_CLIENT_CERTIFICATE_REQUIRED,
# no authorized networks): the connector authorizes with IAM and encrypts, and the Cloud Build
# migration step, which runs outside any VPC, can reach it too.
exists gcloud sql instances describe "$INSTANCE" --project="$PROJECT" ||
  run gcloud sql instances create "$INSTANCE" --project="$PROJECT" --region="$REGION" \
    --database-version=POSTGRES_15 --edition="$DB_EDITION" --tier="$db_tier" \
    --availability-type=REGIONAL --enable-point-in-time-recovery --backup-start-time=18:00 \
    --ssl-mode=TRUSTED_CLIENT_CERTIFICATE_REQUIRED \
    --database-flags="cloudsql.iam_authentication=on,max_connections=$DB_MAX_CONNECTIONS"
# The dry runs' read pool: streaming replicas of the instance behind one read endpoint, which
# IssueCoupon reaches as READ_INSTANCE_CONNECTION_NAME (deploy/env.sh); the database, its
# users and their grants are the primary's, replicated. gcloud 528 has the read pool's flags in
# beta only.
if [ "$READ_POOL_NODES" -gt 0 ]; then
  exists gcloud sql instances describe "$(read_pool)" --project="$PROJECT" ||
    run gcloud beta sql instances create "$(read_pool)" --project="$PROJECT" --region="$REGION" \
      --master-instance-name="$INSTANCE" --instance-type=READ_POOL_INSTANCE --node-count="$READ_POOL_NODES" \
      --edition=ENTERPRISE_PLUS --tier="$db_tier" --ssl-mode=TRUSTED_CLIENT_CERTIFICATE_REQUIRED \
      --database-flags="cloudsql.iam_authentication=on,max_connections=$DB_MAX_CONNECTIONS"
fi
exists gcloud sql databases describe "$DATABASE" --instance="$INSTANCE" --project="$PROJECT" ||
  run gcloud sql databases create "$DATABASE" --instance="$INSTANCE" --project="$PROJECT"

# One IAM database user per identity that connects: each function's, the console's, the
# operators', and the deploy build's, which runs the migrations (so the migration logs in as the
# identity it runs with).
for sa in "$SA_ISSUE" "$SA_RELAY" "$SA_REDEEM" "$SA_CONSOLE" "$SA_ADMIN" "$SA_DEPLOY"; do
  exists gcloud sql users describe "$(db_user "$sa")" --instance="$INSTANCE" --project="$PROJECT" ||
    run gcloud sql users create "$(db_user "$sa")" --instance="$INSTANCE" --project="$PROJECT" \
      --type=cloud_iam_service_account
done

# The LINE channel access token: the secret is created here, its value added by hand
# (docs/deploy.md, step 2), so that it never passes through a file or a build log.
exists gcloud secrets describe "$LINE_SECRET" --project="$PROJECT" ||
  run gcloud secrets create "$LINE_SECRET" --project="$PROJECT" --replication-policy=automatic

# random_secret SECRET MAKE: when SECRET is missing, create it with one version, what the
# pipeline MAKE prints (a random key); made here once, never printed.
random_secret() {
  local secret=$1 make=$2
  exists gcloud secrets describe "$secret" --project="$PROJECT" && return
  run gcloud secrets create "$secret" --project="$PROJECT" --replication-policy=automatic
  echo "+ $make | gcloud secrets versions add $secret --project=$PROJECT --data-file=-" >&2
  if [ "$DRY_RUN" = false ]; then
    bash -c "$make" | gcloud secrets versions add "$secret" --project="$PROJECT" --data-file=- --format=none
  fi
}
# The key that hashes member ids in logs and spans (TELEMETRY_MEMBER_KEY, docs/operations.md):
# one value for every instance of the three functions, so that a member's lines join.
random_secret "$MEMBER_KEY_SECRET" "head -c 32 /dev/urandom | base64"
# The key of the console's CSRF tokens (CONSOLE_CSRF_KEY, 64 hex digits): one value for every
# instance and revision, so that a form loaded from one is taken by the next.
random_secret "$CSRF_KEY_SECRET" "od -An -v -tx1 -N32 /dev/urandom | tr -d ' \\n'"

# Runtime identities: connect to Cloud SQL (client) and log in as their IAM user
# (instanceUser); nothing else in the project. The console's account gets only these two and
# its CSRF key below: what it may do in the database is coupon_console's (docs/roles.md), as
# RedeemCoupon's is coupon_redeem's.
for sa in "$SA_ISSUE" "$SA_RELAY" "$SA_REDEEM" "$SA_CONSOLE" "$SA_ADMIN" "$SA_DEPLOY"; do
  bind projects "$PROJECT" "serviceAccount:$(sa_email "$sa")" roles/cloudsql.client
  bind projects "$PROJECT" "serviceAccount:$(sa_email "$sa")" roles/cloudsql.instanceUser
done
# Only the relay reads the LINE token; the three functions read the member key (RedeemCoupon
# logs the member's hash as IssueCoupon does); the console its CSRF key.
bind secrets "$LINE_SECRET" "serviceAccount:$(sa_email "$SA_RELAY")" roles/secretmanager.secretAccessor
for sa in "$SA_ISSUE" "$SA_RELAY" "$SA_REDEEM"; do
  bind secrets "$MEMBER_KEY_SECRET" "serviceAccount:$(sa_email "$sa")" roles/secretmanager.secretAccessor
done
bind secrets "$CSRF_KEY_SECRET" "serviceAccount:$(sa_email "$SA_CONSOLE")" roles/secretmanager.secretAccessor

# Telemetry (shared/telemetry.GoogleExporter, docs/operations.md): the three functions write
# spans and metrics to the Telemetry API; the operators' jobs only metrics (reconcile's drift).
for sa in "$SA_ISSUE" "$SA_RELAY" "$SA_REDEEM"; do
  bind projects "$PROJECT" "serviceAccount:$(sa_email "$sa")" roles/telemetry.tracesWriter
done
for sa in "$SA_ISSUE" "$SA_RELAY" "$SA_REDEEM" "$SA_ADMIN"; do
  bind projects "$PROJECT" "serviceAccount:$(sa_email "$sa")" roles/telemetry.metricsWriter
done

# The deploy build (cloudbuild.yaml runs as coupon-deploy): deploy Cloud Run services from
# source, write its logs, read the uploaded source (in the build bucket only), and deploy the
# services as their own identities (serviceAccountUser on those accounts only, not on the
# project).
bind projects "$PROJECT" "serviceAccount:$(sa_email "$SA_DEPLOY")" roles/run.sourceDeveloper
bind projects "$PROJECT" "serviceAccount:$(sa_email "$SA_DEPLOY")" roles/serviceusage.serviceUsageConsumer
bind projects "$PROJECT" "serviceAccount:$(sa_email "$SA_DEPLOY")" roles/logging.logWriter
bind "storage buckets" "$build_bucket" "serviceAccount:$(sa_email "$SA_DEPLOY")" roles/storage.objectViewer
for sa in "$SA_ISSUE" "$SA_RELAY" "$SA_REDEEM" "$SA_CONSOLE" "$SA_BUILD"; do
  bind "iam service-accounts" "$(sa_email "$sa")" "serviceAccount:$(sa_email "$SA_DEPLOY")" roles/iam.serviceAccountUser
done
# Every image build: the functions' (gcloud run deploy --source, --build-service-account) and
# the daily jobs' (deploy/couponops.cloudbuild.yaml). roles/run.builder reads the source, writes
# the build's logs and pushes the image to Artifact Registry.
bind projects "$PROJECT" "serviceAccount:$(sa_email "$SA_BUILD")" roles/run.builder

echo "setup done. Next: add the LINE token (docs/deploy.md, step 2), then deploy/build.sh."
