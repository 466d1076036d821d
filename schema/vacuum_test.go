package schema_test

import (
	"context"
	"slices"
	"testing"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestHistoryVacuumSettings: a migrated database vacuums issued_coupons and member_monthly_usage
// after 1% of their rows changed or were inserted, and notification_outbox after 2% (at least
// 10,000 rows) (00041), as docs/operations.md, "Retention and vacuum", sizes them.
func TestHistoryVacuumSettings(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, 1)
	want := map[string][]string{
		"issued_coupons": {"autovacuum_analyze_scale_factor=0.01", "autovacuum_vacuum_insert_scale_factor=0.01",
			"autovacuum_vacuum_scale_factor=0.01"},
		"member_monthly_usage": {"autovacuum_analyze_scale_factor=0.01", "autovacuum_vacuum_insert_scale_factor=0.01",
			"autovacuum_vacuum_scale_factor=0.01"},
		"notification_outbox": {"autovacuum_analyze_scale_factor=0.02", "autovacuum_vacuum_insert_scale_factor=0.02",
			"autovacuum_vacuum_scale_factor=0.02", "autovacuum_vacuum_threshold=10000"},
	}
	for table, opts := range want {
		var got []string
		if err := pool.QueryRow(context.Background(), `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`, table).Scan(&got); err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if !slices.Equal(got, opts) {
			t.Errorf("%s: reloptions %v, want %v", table, got, opts)
		}
	}
}
