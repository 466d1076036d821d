// Package lifecycletest holds the model-based test of a coupon's whole life cycle, where the
// issuance (shared/issuance, as IssueCoupon and `couponctl grant` call it) meets the operator
// verbs (internal/ops/campaign's changes and internal/ops/coupon's void, as couponctl calls them).
//
// Its test, with pgregory.net/rapid's state machine, runs random sequences of campaign
// creations, issues (alone, and in bursts that the service coalesces into issue_coupons_batch_v3),
// re-sends, grants, voids with and without reissue, pauses, resumes, ends, budget raises and
// cuts, re-stripes, period and validity changes, redemptions, rollbacks and double submits
// (RedeemCoupon's shared/redemption), and waits that let a period or an expiry pass,
// on a real PostgreSQL; after every step it compares each answer, and the tables counted with
// SQL, with a small model in Go. The package has no code of its own beyond this comment.
package lifecycletest
