-- +goose Up
-- Autovacuum sized for a year of history (issue 42; docs/operations.md, "Retention and vacuum at
-- tens of millions of coupons"). PostgreSQL's defaults wait for 20% of a table's rows to be
-- dead, or inserted since the last vacuum, before vacuuming it: 4M rows of issued_coupons at
-- 20M coupons, weeks of issuance, while the prune's and the voids' dead rows pile up and the
-- visibility map, which index-only scans and the next vacuum read, goes stale. At 1% each, a
-- table is vacuumed after 200,000 changes at 20M coupons. notification_outbox is a queue (each row
-- inserted, updated when pushed, deleted by the prune): vacuumed after 2% of it, at least 10,000
-- rows. Only future vacuums change: no row is read or written, and the lock (SHARE UPDATE
-- EXCLUSIVE) conflicts with no issuance, redemption, prune or read, only with a vacuum of
-- the same table, which it waits 5 s for at most. The previous release reads none of it.
SET LOCAL lock_timeout = '5s';
ALTER TABLE issued_coupons SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01,
  autovacuum_analyze_scale_factor = 0.01);
ALTER TABLE member_monthly_usage SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01,
  autovacuum_analyze_scale_factor = 0.01);
ALTER TABLE notification_outbox SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 10000,
  autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- +goose Down
SET LOCAL lock_timeout = '5s';
ALTER TABLE issued_coupons RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_insert_scale_factor,
  autovacuum_analyze_scale_factor);
ALTER TABLE member_monthly_usage RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_insert_scale_factor,
  autovacuum_analyze_scale_factor);
ALTER TABLE notification_outbox RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
  autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor);
