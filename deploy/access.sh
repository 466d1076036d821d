#!/usr/bin/env bash
# Step 4 of docs/deploy.md, after the first build has created both services: who may call
# them, and the Cloud Scheduler job that calls RelayOutbox. Idempotent.
#
# roles/run.invoker on issue-coupon goes to the app gateway's account only, on relay-outbox to
# the scheduler's only; both services were deployed with --no-allow-unauthenticated. The script
# then reads both policies back and fails if anyone else holds a role on either service.
set -euo pipefail
usage="Usage: deploy/access.sh --project ID [--region R] [--gateway-sa EMAIL] [--dry-run]

Grants roles/run.invoker on issue-coupon to the gateway's account and on relay-outbox to
coupon-scheduler, checks that nobody else holds a role on either service, and creates or
updates the Cloud Scheduler job that POSTs to RelayOutbox every minute."
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"

# The relay's budgets (docs/deploy.md, "Timeouts"): RELAY_RUN_BUDGET 50 s < the Scheduler
# attempt deadline < the Cloud Run request timeout of relay-outbox (90 s, cloudbuild.yaml).
readonly SCHEDULE="* * * * *"
readonly ATTEMPT_DEADLINE=70s

bind "run services" "$ISSUE_SERVICE" "serviceAccount:$GATEWAY_SA" roles/run.invoker --region="$REGION"
bind "run services" "$RELAY_SERVICE" "serviceAccount:$(sa_email "$SA_SCHEDULER")" roles/run.invoker --region="$REGION"

# only_member SERVICE MEMBER: fail if any binding on SERVICE names another member, or a role
# other than roles/run.invoker (a service opened to everyone fails here).
only_member() {
  local service=$1 want=$2 policy line
  policy=$(run gcloud run services get-iam-policy "$service" --project="$PROJECT" --region="$REGION" \
    --flatten=bindings[].members --format='value(bindings.role,bindings.members)')
  while IFS= read -r line; do
    case "$line" in
      "") ;;
      "roles/run.invoker	$want") ;;
      *) die "$service: unexpected binding \"$line\" (only $want may invoke it): remove it" ;;
    esac
  done <<<"$policy"
}
only_member "$ISSUE_SERVICE" "serviceAccount:$GATEWAY_SA"
only_member "$RELAY_SERVICE" "serviceAccount:$(sa_email "$SA_SCHEDULER")"

url=$(run gcloud run services describe "$RELAY_SERVICE" --project="$PROJECT" --region="$REGION" --format='value(status.url)')
if [ "$DRY_RUN" = true ]; then
  url="\$RELAY_URL" # what the describe above prints
fi
job=(--project="$PROJECT" --location="$REGION" --schedule="$SCHEDULE" --time-zone=Asia/Tokyo
  --uri="$url" --http-method=POST --message-body='{}' --attempt-deadline="$ATTEMPT_DEADLINE"
  --max-retry-attempts=0 --oidc-service-account-email="$(sa_email "$SA_SCHEDULER")" --oidc-token-audience="$url")
if exists gcloud scheduler jobs describe "$SCHEDULER_JOB" --project="$PROJECT" --location="$REGION"; then
  run gcloud scheduler jobs update http "$SCHEDULER_JOB" "${job[@]}" --update-headers=Content-Type=application/json
else
  run gcloud scheduler jobs create http "$SCHEDULER_JOB" "${job[@]}" --headers=Content-Type=application/json
fi
echo "access done: issue-coupon callable by $GATEWAY_SA, relay-outbox by the scheduler every minute."
