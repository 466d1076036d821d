// Package deploy holds the Google Cloud deployment: the gcloud scripts (setup.sh, env.sh,
// build.sh, access.sh, grant-roles.sh, rollback.sh, with lib.sh), the functions' Cloud Run
// environment templates (issue.env.yaml, relay.env.yaml) and, one directory up,
// cloudbuild.yaml. docs/deploy.md walks through them. Its tests check them offline: the
// scripts' --dry-run output against the expected IAM bindings (so a change that opens a
// function to the public fails), no placeholder left in a deployable file, the connection
// budget and timeouts of docs/deploy.md, each function's configuration loader on the generated
// environment, and shellcheck when it is installed.
package deploy
