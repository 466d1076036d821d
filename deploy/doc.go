// Package deploy holds the Cloud Run deployment files: the functions' environments
// (issue.env.yaml, relay.env.yaml) used by ../cloudbuild.yaml. Its test validates them offline:
// YAML syntax, Cloud Build substitutions, the buildable mains, and that each function's own
// configuration loader accepts its environment file.
package deploy
