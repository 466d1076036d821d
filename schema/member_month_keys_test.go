package schema_test

import (
	"context"
	"testing"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestMemberMonthKeysLeadWithTheMonth: every index of issued_coupons and member_monthly_usage that
// keys a member's month starts with the month, member_monthly_usage's primary key among them
// (00042), so that an issuance's entries land in this month's part of each index rather than at
// a random leaf of the whole history's (docs/performance.md, "History at scale").
func TestMemberMonthKeysLeadWithTheMonth(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, 1)
	rows, err := pool.Query(context.Background(), `
SELECT i.indexrelid::regclass::text, i.indrelid::regclass::text, i.indisprimary,
       (SELECT array_agg(a.attname::text ORDER BY k.n) FROM unnest(i.indkey) WITH ORDINALITY k(attnum, n)
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum)
  FROM pg_index i
 WHERE i.indrelid IN ('issued_coupons'::regclass, 'member_monthly_usage'::regclass)`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	primary := false
	for rows.Next() {
		var index, table string
		var isPrimary bool
		var cols []string
		if err := rows.Scan(&index, &table, &isPrimary, &cols); err != nil {
			t.Fatal(err)
		}
		member, month := -1, -1
		for i, c := range cols {
			switch c {
			case "member_id":
				member = i
			case "month":
				month = i
			}
		}
		if member >= 0 && month >= 0 && month > member {
			t.Errorf("%s on %s %v: the member before the month, a random leaf of the whole history per issuance", index, table, cols)
		}
		if table == "member_monthly_usage" && isPrimary {
			primary = true
			if len(cols) != 2 || cols[0] != "month" || cols[1] != "member_id" {
				t.Errorf("member_monthly_usage's primary key %s is %v, want [month member_id]", index, cols)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !primary {
		t.Error("member_monthly_usage has no primary key")
	}
}
