// Package deploy holds the Google Cloud deployment: the gcloud scripts (setup.sh, env.sh,
// build.sh, access.sh, grant-roles.sh, daily.sh, monitoring.sh, rollback.sh, with lib.sh), the
// Cloud Run environment templates of the functions and the console (issue.env.yaml,
// relay.env.yaml, redeem.env.yaml, console.env.yaml), the daily jobs' image build (couponops.cloudbuild.yaml),
// the dashboard and alerts (monitoring/) and, one directory up, cloudbuild.yaml. docs/deploy.md walks through them. Its tests check them
// offline: every gcloud command line the scripts (both paths of each) and cloudbuild.yaml's
// steps run, passed to the real gcloud with no account, which must take it (gcloud_test.go);
// cloudbuild.yaml's test step in the tree gcloud uploads (ci_test.go); the monitoring files and
// the build configs as the APIs' messages; the scripts' --dry-run output against the expected
// IAM bindings (so a change that opens a function to the public fails); no placeholder left in
// a deployable file; the connection budget and timeouts of docs/deploy.md; each function's
// configuration loader on the generated environment, and the console's IAP audience; .ci/run's
// install of what the tests need; and shellcheck when it is installed.
package deploy
