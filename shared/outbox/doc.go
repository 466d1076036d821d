// Package outbox relays the transactional outbox (notification_outbox) to LINE: each issued
// coupon becomes one LINE Messaging API push message to its member's LINE user id, effectively
// exactly once.
//
// Exactly once in effect is at-least-once delivery plus an idempotency key: every push carries
// X-Line-Retry-Key = coupon_id, and LINE turns a repeated key into 409 Conflict without sending
// anything, for 24 hours after the key's first use (LINE Messaging API reference, "Retry failed
// API requests"). The relay therefore only has to make sure each row is pushed until LINE has
// it, inside those 24 hours, and that concurrent runs do not push the same row at the same time:
//
//   - Claim: a run takes a batch with FOR UPDATE SKIP LOCKED in a materialized CTE and holds it
//     by a lease (next_attempt_at moved past the lease, claimed_by set), committed at once. No
//     database transaction is open during a push: the bound on a transaction held across a push
//     is zero. Other runs skip claimed rows until the lease ends, which outlasts a live run's
//     batch ([Config.Lease] > BatchTimeout + MarkTimeout). The claim reads the member's LINE
//     user id (member_line_accounts) and stamps first_pushed_at.
//   - Push: through the official SDK (github.com/line/line-bot-sdk-go/v8), at most Parallelism
//     at once and RateLimit per second, each bounded by PushTimeout, behind a per-run circuit
//     breaker (github.com/sony/gobreaker/v2) that ends the run when LINE stops answering.
//   - Mark: each row's outcome in its own short statement as soon as its push ends: sent;
//     retry later (attempts, next_attempt_at by full jitter or Retry-After, last_error); parked,
//     the dead letter (parked_at, last_error) for LINE's refusals, the attempt limit and an
//     expired retry key; skipped (skipped_at) for a member without a LINE account; or given
//     back unharmed, for a row that was not pushed after all.
//
// A crash after a push and before its mark leaves the row claimed; when the lease ends, another
// run re-sends it with the same retry key, LINE answers 409, and the row is marked sent.
//
// A run deletes nothing (its role, coupon_relay, may not: docs/roles.md). [Prune] deletes closed
// rows past the retention; the daily operator job runs it (`couponctl outbox prune`, as
// coupon_admin). The operator's view of the
// outbox, its dead letters and the members' LINE accounts is couponctl's (internal/outboxadmin).
package outbox
