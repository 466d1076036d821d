// Package isolationlab is the isolation lab: it runs the same load through each strategy that the
// design compared (docs/design.md, "The two proposals that were rejected"), on a fresh PostgreSQL database per run, and counts with
// SQL afterwards what each one broke.
//
// The strategies ([Strategies]):
//
//   - before: the incident's code in Go ([Before]) at READ COMMITTED on the incident's schema
//     ([BreakSchema]): the lost update on the budget counter (R1), the phantom of
//     check-then-insert (R2), the write skew of lock-and-sum (R3), the push inside the
//     transaction, blind retries;
//   - repeatable-read: the same code at REPEATABLE READ retrying SQLSTATE 40001 (the first
//     junior proposal): the lost update and the double tap now collide on the counter row, but
//     the write skew across campaigns passes;
//   - serializable: the same logic at SERIALIZABLE with a transactional outbox, retrying 40001
//     with full jitter ([Serializable], the second junior proposal): correct, paid in retries;
//   - good: the production path, shared/issuance, itself.
//
// [Run] measures a [Plan] into one [Measurement] per strategy x workers x run; [WriteTable] and
// [WriteChart] present them.
//
// The black-friday scenario ([FirstCome], [FirstComeStrategies], [RunFirstComePlan],
// [WriteFirstComeTable]) runs one first-come campaign instead through one budget row, 16 budget
// stripes, a budget pre-allocated per instance ([Preallocated]) and SERIALIZABLE, and counts
// coupons, overshoot, stranded budget and false rejections (docs/hot-campaigns.md). `couponctl sim` is the command line; docs/isolation-lab.md holds the
// figures measured on the build machine. Nothing here is on a production path.
package isolationlab
