-- The ceiling of one hot row (docs/performance.md): one autocommitted UPDATE of one row, nothing
-- else. `couponctl bench` runs it with -M prepared on bench_hot_row, a copy of campaign_budgets'
-- shape (CREATE TABLE ... (LIKE campaign_budgets INCLUDING ALL)) that no coupon counts against,
-- so the rules checked after the run are not disturbed.
UPDATE bench_hot_row SET issued_yen = issued_yen + 1 WHERE campaign_id = :campaign AND stripe = 0;
