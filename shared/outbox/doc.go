// Package outbox relays the transactional outbox (notification_outbox) to LINE: each issued
// coupon becomes one LINE Messaging API push message to its member's LINE user id, effectively
// exactly once.
//
// Exactly once in effect is at-least-once delivery plus an idempotency key: every push carries
// X-Line-Retry-Key = coupon_id, and LINE turns a repeated key into 409 Conflict without sending
// anything, for 24 hours after the key's first use (LINE Messaging API reference, "Retry failed
// API requests"). The relay therefore only has to make sure each row is pushed until LINE has
// it, inside those 24 hours, and that concurrent runs do not push the same row at the same time.
//
// # A run
//
// [Relay.Run] claims batches of at most BatchSize rows ([outboxdb.Claim]: FOR UPDATE SKIP
// LOCKED and a lease, committed at once, so no database transaction is open during a push;
// other runs skip claimed rows until the lease ends, which outlasts a live run's batch:
// [Config.Lease] > BatchTimeout + MarkTimeout). It pushes each batch through the official SDK
// (github.com/line/line-bot-sdk-go/v8), at most Parallelism at once and RateLimit per second,
// each push bounded by PushTimeout, and records each row's outcome in its own statement as soon
// as its push ends, so a slow or failing row holds up nobody. It stops claiming when no row is
// due or maxRows are handled.
//
// A run returns within RunBudget (or its context's deadline if sooner): its start and each claim
// are statements bounded by MarkTimeout; a batch's pushes end by the batch's start +
// BatchTimeout and all of its marks by its start + BatchTimeout + MarkTimeout (one deadline for
// the batch, not one per mark); a claim is made only while more than BatchTimeout + 2*MarkTimeout
// is left.
//
// # How a row ends
//
//   - its coupon was voided, or expires before the claim's lease ends, or its member has no
//     LINE account linked: closed as skipped by the claim itself, in the database, with its
//     reason ([outboxdb.Claimed.SkipReason]), never pushed, counted in [Result.SkippedReasons];
//   - it was first pushed more than [RetryKeyWindow] ago: parked, not re-sent;
//   - LINE answered 2xx (even if the body could not be read) or 409: marked sent;
//   - a 4xx other than 401, 403, 409 and 429: parked with the reason ([ErrPushRejected]);
//   - a timeout, 429 or 5xx: sent back for a later run after a full-jitter wait, or LINE's
//     Retry-After (at most RetryCap) if longer, until MaxAttempts pushes, when it is parked;
//   - 401 or 403: the run ends at once with an ERROR log and [ErrTokenRefused], and every row
//     not accepted is given back;
//   - BreakerFailures timeouts, connection errors or 5xx in a row: the run ends early with
//     [ErrLINEUnavailable], and the rows not yet pushed are given back;
//   - the batch's time ran out before its push: given back.
//
// A row given back was claimed but not pushed: it is charged no attempt and gets the
// next_attempt_at and first_pushed_at it had before the claim ([outboxdb.Release]). Only a push
// actually written to LINE counts as an attempt. If a push succeeded but marking it sent fails,
// the row is sent back for the next run, which re-sends it with the same retry key and gets 409;
// if even that fails, or the run crashes between push and mark, the lease runs out and the row
// comes back the same way.
//
// # Around the relay
//
// The SQL on notification_outbox lives in [outboxdb]. Closed rows past the retention are
// deleted by [Prune]. The operator's view of the outbox, its dead letters and the members'
// LINE accounts is couponctl's (internal/ops/outboxadmin).
package outbox
