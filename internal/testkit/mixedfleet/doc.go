// Package mixedfleet holds the test that a release runs beside the previous one, as a deploy runs
// them: the previous release (its commit in deploy/previous-release) is built from the
// repository's own history and serves both functions on its schema under load; this tree's
// migrations are applied in the middle of that load; this tree's functions then serve beside
// the previous ones while operators void, pause, resume and raise. It passes when the migration
// applies on its first try, neither release answers 500, no coupon voided before its push is
// pushed, and reconcile finds the tables consistent (docs/deploy.md, "Releases"). A second test
// holds the previous release's relay to a rule it does not know: it pushes no coupon whose
// expiry has passed once this tree's migrations ran (00022), and this tree's relay closes that
// coupon's outbox row as skipped.
package mixedfleet
