-- The issuance as IssueCoupon sends it since 00009_issue_coupon.sql: one pipeline, one Sync, one
-- network round trip; the timeouts for the call's transaction, then issue_coupon(), committed in
-- autocommit as the Sync arrives (an implicit transaction: PostgreSQL 15 docs, 55.2.4
-- "Pipelining"). The client makes the coupon id, as IssueCoupon does (here md5 of the member, as
-- in pipelined.sql). A new member every time, on a campaign of one budget stripe. Run by
-- `couponctl bench` with -M prepared -D campaign=<id> (pgbench pipelines need the extended
-- protocol). The timeouts are IssueCoupon's defaults, ISSUE_LOCK_TIMEOUT and
-- ISSUE_STATEMENT_TIMEOUT (docs/api.md); 2000 is MONTHLY_CAP_YEN's default. The member id is
-- drawn from 9e18 values, so two transactions of one run practically never share one.
\set m random(1, 9000000000000000000)
\startpipeline
SELECT set_config('lock_timeout', '1s', true), set_config('statement_timeout', '2s', true);
SELECT * FROM issue_coupon(md5('p' || CAST(:m AS text))::uuid, :campaign, 'p' || CAST(:m AS text),
  now(), 2000, NULL);
\endpipeline
