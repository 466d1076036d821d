// Package outboxadmin is the operator's view of the transactional outbox that shared/outbox
// relays (couponctl outbox and line): rows by state and the dead letters, requeueing parked and
// skipped rows (refusing rows whose LINE retry key has expired unless forced), and linking
// members to their LINE user ids in member_line_accounts.
package outboxadmin
