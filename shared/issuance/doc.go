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
// The transaction runs inside the server as one call, one network round trip per attempt, so
// that no lock is held across the network and a refusal is answered from reads without writing:
// issue_coupon for a request alone (schema/current/issue_coupon.sql), or, when requests for the
// same campaign arrive while a call for it is in flight in this instance, issue_coupons_batch for
// all of them at once (schema/current/issue_coupons_batch.sql; coalescing, [Config.BatchMax]).
// Both take their locks in the order every writer keeps (docs/design.md, "Lock order"). An
// attempt that wrote nothing is sent again within one time budget, after a full-jitter wait: on
// SQLSTATE 40001, 40P01 or 55P03, on a connection lost before the call was sent, and once on a
// stale cached plan (0A000); a batch also for its members answered RETRY ([Service.Issue]).
package issuance
