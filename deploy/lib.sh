#!/usr/bin/env bash
# Shared by the deploy/ scripts (sourced, never run): flags, names, and the run/ensure/bind
# helpers that print every command under --dry-run instead of running it.
#
# Every command is echoed to stderr after "+ " (shell-quoted, as set -x does) before it
# runs, so a run's log is also its record; under --dry-run nothing runs and "describe" checks
# count as "missing".

# shellcheck disable=SC2034 # the names are used by the scripts that source this file

# A command that fails inside $(...) fails the script too (bash otherwise ignores it there, and a
# failed lookup would read as "not found").
shopt -s inherit_errexit

# Names shared by the scripts and cloudbuild.yaml (change them in both).
readonly ISSUE_SERVICE=issue-coupon
readonly RELAY_SERVICE=relay-outbox
readonly REDEEM_SERVICE=coupon-redeem # RedeemCoupon: the cart's and the POS's, through the app gateway
readonly CONSOLE_SERVICE=coupon-console # the promotion team's console, behind IAP (docs/deploy.md, "The console")
readonly SCHEDULER_JOB=relay-outbox
readonly RECONCILE_JOB=coupon-reconcile # the daily operator jobs (deploy/daily.sh)
readonly PRUNE_JOB=coupon-prune
readonly DATABASE=coupons
readonly LINE_SECRET=line-channel-access-token
readonly MEMBER_KEY_SECRET=telemetry-member-key # TELEMETRY_MEMBER_KEY: member hashes in logs
readonly CSRF_KEY_SECRET=console-csrf-key       # CONSOLE_CSRF_KEY: the console's form tokens
# One service account per function and one for the console, one for each caller, one for the
# deploy build (whose identity is also the migrations' database user), one for the source builds
# of Cloud Run, one for the operators' couponctl (docs/roles.md).
readonly SA_ISSUE=coupon-issue
readonly SA_RELAY=coupon-relay
readonly SA_REDEEM=coupon-redeem # RedeemCoupon's runtime, as database role coupon_redeem
readonly SA_SCHEDULER=coupon-scheduler
readonly SA_GATEWAY=coupon-gateway
readonly SA_DEPLOY=coupon-deploy
readonly SA_ADMIN=coupon-admin # operators' couponctl, as database role coupon_admin
readonly SA_BUILD=coupon-build
readonly SA_CONSOLE=coupon-console # the console's runtime, as database role coupon_console

PROJECT=""
REGION=asia-northeast1
INSTANCE=coupon-db
DRY_RUN=false
GATEWAY_SA=""
READ_POOL_NODES=0

usage_common='  --project ID       the Google Cloud project (required)
  --region REGION    Cloud Run, Cloud SQL and Scheduler region (default asia-northeast1)
  --instance NAME    the Cloud SQL instance (default coupon-db)
  --gateway-sa EMAIL the app gateway'"'"'s service account, the only caller of IssueCoupon
                     and RedeemCoupon (default: coupon-gateway in this project, which
                     setup.sh creates)
  --read-pool-nodes N
                     the Cloud SQL read pool that answers IssueCoupon'"'"'s dry runs, INSTANCE-read,
                     with N nodes (1 to 20; it needs the instance in Enterprise Plus:
                     docs/deploy.md, "The read pool"); 0, the default: none, the primary
                     answers them
  --dry-run          print every command instead of running it'

die() {
  echo "${0##*/}: $*" >&2
  exit 2
}

# takes_flag FLAG: whether the script takes FLAG, that is, names it in the first line of its
# $usage.
takes_flag() {
  local line=${usage:-}
  line=${line%%$'\n'*}
  [[ "$line " == *" $1 "* || "$line" == *"[$1 "* || "$line" == *"[$1]"* ]]
}

# print_usage: the script's $usage, then the shared flags it takes.
print_usage() {
  local line flag=""
  echo "${usage:-}"
  echo
  while IFS= read -r line; do
    if [[ "$line" == "  --"* ]]; then
      flag=${line#"  "}
      flag=${flag%% *}
    fi
    if takes_flag "$flag"; then
      echo "$line"
    fi
  done <<<"$usage_common"
  echo "Each flag with a value takes it as --flag VALUE or --flag=VALUE, as gcloud does."
}

# parse_common_flags sets PROJECT, REGION, INSTANCE, DRY_RUN, GATEWAY_SA from "$@", each
# value given as --flag VALUE or --flag=VALUE. A script takes the flags its $usage names on its
# first line; those not shared here it stores with its own extra_flag FLAG VALUE. An unknown
# flag, a missing value and a value given to --dry-run are errors; --help prints the usage.
parse_common_flags() {
  local flag value has_value
  while [ $# -gt 0 ]; do
    flag=$1 value="" has_value=false
    shift
    if [[ "$flag" == --*=* ]]; then
      value=${flag#*=} flag=${flag%%=*} has_value=true
    fi
    case "$flag" in
      -h | --help) print_usage; exit 0 ;;
    esac
    [[ "$flag" == -* ]] || die "unexpected argument $flag: every value follows its flag (see --help)"
    takes_flag "$flag" || die "unknown flag $flag (see --help)"
    if [ "$flag" = --dry-run ]; then
      [ "$has_value" = false ] || die "--dry-run takes no value (see --help)"
      DRY_RUN=true
      continue
    fi
    if [ "$has_value" = false ]; then
      if [ $# -eq 0 ] || [[ "$1" == --* ]]; then
        die "$flag needs a value (see --help)"
      fi
      value=$1
      shift
    fi
    [ -n "$value" ] || die "$flag needs a value (see --help)"
    case "$flag" in
      --project) PROJECT=$value ;;
      --region) REGION=$value ;;
      --instance) INSTANCE=$value ;;
      --gateway-sa) GATEWAY_SA=$value ;;
      --read-pool-nodes) READ_POOL_NODES=$value ;;
      *) extra_flag "$flag" "$value" ;;
    esac
  done
  [ -n "$PROJECT" ] || die "--project is required (see --help)"
  [[ "$PROJECT" =~ ^[a-z][a-z0-9-]{4,28}[a-z0-9]$ ]] || die "--project $PROJECT: not a project id"
  [[ "$REGION" =~ ^[a-z]+-[a-z]+[0-9]$ ]] || die "--region $REGION: not a region"
  [[ "$READ_POOL_NODES" =~ ^([0-9]|1[0-9]|20)$ ]] || die "--read-pool-nodes $READ_POOL_NODES: want 0 (no read pool) to 20 nodes"
  if [ -z "$GATEWAY_SA" ]; then
    GATEWAY_SA=$(sa_email "$SA_GATEWAY")
  fi
}

# sa_email NAME: the email of service account NAME in $PROJECT.
sa_email() { echo "$1@$PROJECT.iam.gserviceaccount.com"; }

# db_user NAME: the Cloud SQL IAM database user of service account NAME (the email without
# ".gserviceaccount.com", Cloud SQL's rule for service accounts).
db_user() { echo "$1@$PROJECT.iam"; }

connection_name() { echo "$PROJECT:$REGION:$INSTANCE"; }

# read_pool: the name of the dry runs' read pool (--read-pool-nodes), a Cloud SQL instance of its own.
read_pool() { echo "$INSTANCE-read"; }

# run COMMAND...: print it, then run it unless --dry-run.
run() {
  local q
  printf -v q '%q ' "$@"
  echo "+ ${q% }" >&2
  if [ "$DRY_RUN" = false ]; then
    "$@"
  fi
}

# exists COMMAND...: run a describe command quietly; under --dry-run print it and say missing.
exists() {
  local q
  printf -v q '%q ' "$@"
  echo "+ ${q% } >/dev/null" >&2
  if [ "$DRY_RUN" = true ]; then
    return 1
  fi
  "$@" >/dev/null 2>&1
}

# bind KIND RESOURCE MEMBER ROLE [EXTRA...]: add one IAM binding (idempotent: adding a binding
# that exists changes nothing). KIND is projects, "run services", "run jobs", "iam
# service-accounts", "storage buckets", secrets, or "beta iap web", whose RESOURCE is the Cloud
# Run service behind IAP (SDK 528 takes --resource-type=cloud-run in beta only). Every grant of
# every script goes through here, so that deploy_test.go sees them all.
bind() {
  local kind=$1 resource=$2 member=$3 role=$4
  shift 4
  local target=("$resource")
  case "$kind" in
    projects) set -- --condition=None "$@" ;;
    "beta iap web")
      target=(--resource-type=cloud-run --service="$resource")
      set -- --condition=None "$@"
      ;;
  esac
  # shellcheck disable=SC2086 # KIND is several words on purpose ("run services")
  run gcloud $kind add-iam-policy-binding "${target[@]}" --project="$PROJECT" \
    --member="$member" --role="$role" "$@" --format=none --quiet
}
