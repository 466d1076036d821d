// Package outbox relays the transactional outbox (notification_outbox) to LINE: each issued
// coupon becomes one LINE Messaging API push message, effectively exactly once.
//
// Exactly once in effect is at-least-once delivery plus an idempotency key: every push carries
// X-Line-Retry-Key = coupon_id, and LINE turns a repeated key into 409 Conflict without sending
// anything (LINE Messaging API reference, "Retry failed API requests"). The relay therefore only
// has to make sure each row is pushed until LINE has it, and that concurrent runs do not push
// the same row at the same time:
//
//   - Claim: a run takes a batch with FOR UPDATE SKIP LOCKED in a materialized CTE and holds it
//     by a lease (next_attempt_at moved past the lease, claimed_by set), committed at once. No
//     database transaction is open during a push: the bound on a transaction held across a push
//     is zero. Other runs skip claimed rows until the lease ends, which outlasts a live run's
//     batch ([Config.Lease] > BatchTimeout + MarkTimeout).
//   - Push: through the official SDK (github.com/line/line-bot-sdk-go/v8), at most Parallelism
//     at once and RateLimit per second, each bounded by PushTimeout.
//   - Mark: each row's outcome in its own short statement as soon as its push ends: sent;
//     retry later (attempts, next_attempt_at by full jitter or Retry-After, last_error); or
//     parked, the dead letter (parked_at, last_error) for LINE's refusals and the attempt limit.
//
// A crash after a push and before its mark leaves the row claimed; when the lease ends, another
// run re-sends it with the same retry key, LINE answers 409, and the row is marked sent.
//
// [Status] and [Requeue] are the operator's view of the outbox and its dead letters.
package outbox
