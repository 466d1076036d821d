package schema_test

import (
	"context"
	"testing"
)

// TestInterruptedKeySwapRecovers: a run of 00042 interrupted while building one of its indexes
// CONCURRENTLY leaves it INVALID under its name (here, as such a build would, by a build that
// fails); the next run drops it, builds it again and ends with the month-led keys, each valid and
// alone, and the member-led ones gone. Before, CREATE INDEX CONCURRENTLY IF NOT EXISTS kept the
// INVALID index and every run failed on it.
func TestInterruptedKeySwapRecovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, db, p := migratedTo(t, 41)
	for _, q := range []string{
		`SELECT campaign_create('SWAP', 100, 10000, 1, NULL, NULL, NULL, NULL, 'before 00042')`,
		`SELECT * FROM issue_coupon(gen_random_uuid(), 'SWAP', 'm1', issue_now(), 2000, NULL)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Builds that fail half-way (division by zero on the first row), as an interrupted one does,
	// leave INVALID indexes named as 00042's are.
	for _, q := range []string{
		`CREATE INDEX CONCURRENTLY issued_coupons_month_member ON issued_coupons ((1 / (amount_yen - amount_yen)))`,
		`CREATE UNIQUE INDEX CONCURRENTLY member_monthly_usage_month_member ON member_monthly_usage ((1 / (used_yen - used_yen)))`,
	} {
		if _, err := db.ExecContext(ctx, q); err == nil {
			t.Fatalf("%s succeeded, want it to fail half-way", q)
		}
	}
	var invalid int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_index WHERE NOT indisvalid`).Scan(&invalid); err != nil || invalid != 2 {
		t.Fatalf("%d INVALID indexes before the run (%v), want the 2 the failed builds left", invalid, err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("00042 after an interrupted run: %v", err)
	}
	rows, err := db.QueryContext(ctx, `
SELECT i.indexrelid::regclass::text || CASE WHEN i.indisvalid THEN '' ELSE ' (INVALID)' END || ': ' || pg_get_indexdef(i.indexrelid)
  FROM pg_index i
 WHERE i.indrelid IN ('issued_coupons'::regclass, 'member_monthly_usage'::regclass)
   AND (SELECT array_agg(a.attname::text) FROM pg_attribute a
         WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)) @> ARRAY['member_id', 'month']
 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	want := []string{
		"issued_coupons_month_member: CREATE INDEX issued_coupons_month_member ON public.issued_coupons USING btree (month, member_id)",
		"member_monthly_usage_month_member: CREATE UNIQUE INDEX member_monthly_usage_month_member ON public.member_monthly_usage USING btree (month, member_id)",
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("the member-month indexes after the run:\n%q\nwant\n%q", got, want)
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_index WHERE NOT indisvalid`).Scan(&invalid); err != nil || invalid != 0 {
		t.Errorf("%d INVALID indexes after the run (%v), want none", invalid, err)
	}
}
