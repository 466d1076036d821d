// Package issuance is the coupon issuance transaction: one coupon per request, at PostgreSQL's
// READ COMMITTED, keeping three money rules true under double taps, re-sends and concurrency.
//
//   - R1 budget: per campaign, the yen issued never exceeds the campaign budget approval.
//   - R2 one per member: at most one coupon per (campaign, member).
//   - R3 monthly cap: per member and Asia/Tokyo calendar month, the yen issued across all
//     campaigns never exceeds the cap of the member cap regulation (2,000 yen by default).
//
// Isolation levels do not keep these rules (docs/design.md and docs/isolation-lab.md: REPEATABLE READ lets
// the R3 write skew through, SERIALIZABLE keeps them at the price of retries on almost every hot
// request). Instead each rule has one row that every conflicting transaction must write, and each
// check is folded into that write as one conditional statement, so PostgreSQL re-evaluates it on
// the newest row version after waiting (PostgreSQL 15 docs, 13.2.1 "Read Committed Isolation
// Level"). There is no read-then-write in Go, so there is nothing to lose: no lost update, no
// write skew, no phantom.
//
// The transaction runs inside the server as one call, issue_coupons_batch_v3
// (schema/current/issue_coupons_batch_v3.sql), one network round trip per attempt, so that no lock
// is held across the network and a refusal is answered from reads without writing (the one judge,
// issue_judge, which the dry run calls too); it takes its locks in one fixed order
// (docs/design.md, "Lock order"). The database decides the issue time and the month, by its own
// clock (issue_now(): docs/design.md, "One judge, one clock"); the service sends neither.
// Every request is a member of a group: alone, a group of one; coalesced, the requests of its
// campaign that waited behind the call in flight in this instance (coalesce.go, where the
// protocol is written). One implementation of the
// rules and one retry policy serve both: the policy is stated where it is enforced, at
// [Service.run] (run.go). A dry run ([Service.DryRun]) is coalesced by the same protocol in a
// coalescer of its own, a group of dry runs one call of issue_dry_run_batch, not retried.
package issuance
