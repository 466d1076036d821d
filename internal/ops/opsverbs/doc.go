// Package opsverbs holds the operator verbs that production runs: migrate (cloudbuild.yaml's
// migrate step), reconcile and outbox prune (the daily Cloud Run jobs of deploy/daily.sh), as
// cobra commands. cmd/couponops, the binary those jobs run, is made of them alone; couponctl,
// the tool for people, adds the same commands, so both run one implementation.
//
// Each verb connects as the functions do (shared/db: DATABASE_URL, or Cloud SQL through the Go
// connector) and returns [ErrViolations] after it has printed a finding.
package opsverbs
