#!/usr/bin/env bash
# Step 4 of docs/deploy.md, after the first build has created the services: who may call them,
# and the Cloud Scheduler job that calls RelayOutbox. Idempotent.
#
# roles/run.invoker on issue-coupon and on coupon-redeem goes to the app gateway's account only
# (the cart and the POS call RedeemCoupon through the gateway, as the app calls IssueCoupon), on
# relay-outbox to the scheduler's only, on coupon-console to IAP's service agent only (IAP calls
# the service with its own token once it has let a person through); all four were deployed with
# --no-allow-unauthenticated. IAP lets through the promotion team's Google group only
# (roles/iap.httpsResourceAccessor on the console's IAP resource). The script then reads every
# policy back and fails if anyone else holds a role on any of them.
set -euo pipefail
usage="Usage: deploy/access.sh --project ID [--region R] [--gateway-sa EMAIL] --console-group EMAIL [--dry-run]

Grants roles/run.invoker on issue-coupon and coupon-redeem to the gateway's account, on
relay-outbox to coupon-scheduler and on coupon-console to IAP's service agent; admits the
promotion team's group through IAP to coupon-console; checks that nobody else holds a role on
any of them; and creates or updates the Cloud Scheduler job that POSTs to RelayOutbox every
minute.

  --console-group EMAIL  the promotion team's Google group, the people IAP lets through to
                         coupon-console (what each may do there is kept in the database:
                         couponctl console grant)"
CONSOLE_GROUP=""
extra_flag() { CONSOLE_GROUP=$2; }
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"
[ -n "$CONSOLE_GROUP" ] || die "--console-group is required (see --help)"
[[ "$CONSOLE_GROUP" =~ ^[^@[:space:]]+@[^@[:space:]]+$ ]] || die "--console-group $CONSOLE_GROUP: not a group's email"

# The relay's budgets (docs/deploy.md, "Timeouts"): RELAY_RUN_BUDGET 50 s < the Scheduler
# attempt deadline < the Cloud Run request timeout of relay-outbox (90 s, cloudbuild.yaml).
readonly SCHEDULE="* * * * *"
readonly ATTEMPT_DEADLINE=70s

# IAP's service agent (service-NUMBER@gcp-sa-iap.iam.gserviceaccount.com, NUMBER the project's): made if
# missing, and named, by the same command.
agent=$(run gcloud beta services identity create --service=iap.googleapis.com --project="$PROJECT" --format='value(email)')
if [ "$DRY_RUN" = true ]; then
  agent="\$IAP_SERVICE_AGENT" # what the command above prints
elif ! [[ "$agent" =~ ^service-[0-9]+@gcp-sa-iap\.iam\.gserviceaccount\.com$ ]]; then
  die "IAP's service agent: gcloud printed \"$agent\", not service-NUMBER@gcp-sa-iap.iam.gserviceaccount.com"
fi

bind "run services" "$ISSUE_SERVICE" "serviceAccount:$GATEWAY_SA" roles/run.invoker --region="$REGION"
bind "run services" "$RELAY_SERVICE" "serviceAccount:$(sa_email "$SA_SCHEDULER")" roles/run.invoker --region="$REGION"
bind "run services" "$REDEEM_SERVICE" "serviceAccount:$GATEWAY_SA" roles/run.invoker --region="$REGION"
bind "run services" "$CONSOLE_SERVICE" "serviceAccount:$agent" roles/run.invoker --region="$REGION"
bind "beta iap web" "$CONSOLE_SERVICE" "group:$CONSOLE_GROUP" roles/iap.httpsResourceAccessor --region="$REGION"

# only_binding WHAT WANT GET-IAM-POLICY...: fail if the policy that command reads holds any
# binding but WANT (the role, a tab, the member): a resource opened to everyone, or to one more
# person, fails here.
only_binding() {
  local what=$1 want=$2 policy line
  shift 2
  policy=$(run "$@" --flatten=bindings[].members --format='value(bindings.role,bindings.members)')
  while IFS= read -r line; do
    case "$line" in
      "" | "$want") ;;
      *) die "$what: unexpected binding \"$line\" (only \"$want\" belongs there): remove it" ;;
    esac
  done <<<"$policy"
}
only_binding "$ISSUE_SERVICE" "roles/run.invoker	serviceAccount:$GATEWAY_SA" \
  gcloud run services get-iam-policy "$ISSUE_SERVICE" --project="$PROJECT" --region="$REGION"
only_binding "$RELAY_SERVICE" "roles/run.invoker	serviceAccount:$(sa_email "$SA_SCHEDULER")" \
  gcloud run services get-iam-policy "$RELAY_SERVICE" --project="$PROJECT" --region="$REGION"
only_binding "$REDEEM_SERVICE" "roles/run.invoker	serviceAccount:$GATEWAY_SA" \
  gcloud run services get-iam-policy "$REDEEM_SERVICE" --project="$PROJECT" --region="$REGION"
only_binding "$CONSOLE_SERVICE" "roles/run.invoker	serviceAccount:$agent" \
  gcloud run services get-iam-policy "$CONSOLE_SERVICE" --project="$PROJECT" --region="$REGION"
only_binding "IAP on $CONSOLE_SERVICE" "roles/iap.httpsResourceAccessor	group:$CONSOLE_GROUP" \
  gcloud beta iap web get-iam-policy --resource-type=cloud-run --service="$CONSOLE_SERVICE" --project="$PROJECT" --region="$REGION"

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
echo "access done: issue-coupon and coupon-redeem callable by $GATEWAY_SA, relay-outbox by the scheduler every minute, coupon-console by group:$CONSOLE_GROUP through IAP."
