#!/usr/bin/env bash
# Step 5 of docs/deploy.md: grant the database group roles to the IAM database users
# (docs/roles.md): coupon_issue to IssueCoupon's user, coupon_relay to RelayOutbox's,
# coupon_redeem to RedeemCoupon's (coupon-redeem: the three redemption functions only),
# coupon_console to the console's (coupon-console: its console_* functions only), coupon_admin
# to the operators' (coupon-admin, couponctl's operator verbs). The roles
# themselves, and what each may read and write, are created by the schema migrations; this
# script only grants them, as the migrations' own user (coupon-deploy, impersonated, which has
# CREATEROLE: docs/deploy.md, step 2), through the Cloud SQL Auth Proxy and psql. Idempotent:
# granting a role twice changes nothing.
set -euo pipefail
usage="Usage: deploy/grant-roles.sh --project ID [--region R] [--instance NAME] [--dry-run]

Needs cloud-sql-proxy (v2), psql and pg_isready on PATH, and roles/iam.serviceAccountTokenCreator on
coupon-deploy for the operator who runs it."
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"
parse_common_flags "$@"

readonly PROXY_PORT=5439
grants="GRANT coupon_issue TO \"$(db_user "$SA_ISSUE")\";
GRANT coupon_relay TO \"$(db_user "$SA_RELAY")\";
GRANT coupon_redeem TO \"$(db_user "$SA_REDEEM")\";
GRANT coupon_console TO \"$(db_user "$SA_CONSOLE")\";
GRANT coupon_admin TO \"$(db_user "$SA_ADMIN")\";"

if [ "$DRY_RUN" = false ]; then
  for tool in cloud-sql-proxy psql pg_isready; do
    command -v "$tool" >/dev/null || die "$tool not found on PATH (docs/deploy.md, prerequisites)"
  done
fi
proxy=(cloud-sql-proxy --auto-iam-authn --port="$PROXY_PORT"
  --impersonate-service-account="$(sa_email "$SA_DEPLOY")" "$(connection_name)")
if [ "$DRY_RUN" = true ]; then
  run "${proxy[@]}"
else
  run "${proxy[@]}" &
  pid=$!
  trap 'kill "$pid" 2>/dev/null || true' EXIT
  for _ in $(seq 30); do
    pg_isready -q -h 127.0.0.1 -p "$PROXY_PORT" && break
    sleep 1
  done
fi
run psql "host=127.0.0.1 port=$PROXY_PORT dbname=$DATABASE user=$(db_user "$SA_DEPLOY") sslmode=disable" \
  -v ON_ERROR_STOP=1 -c "$grants"
