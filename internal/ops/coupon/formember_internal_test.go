package coupon

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// sqlForMemberByScan is sqlForMember before 00042: the member alone, which a key led by the
// month cannot look up (the broken variant of TestForMemberLooksUpEachMonth).
var sqlForMemberByScan = strings.Replace(sqlShow, "WHERE c.coupon_id = $1",
	"WHERE c.member_id = $1 AND ($2 = '' OR c.campaign_id = $2) ORDER BY c.issued_at, c.coupon_id", 1)

// TestForMemberLooksUpEachMonth: a member's coupons are found through issued_coupons_month_member
// with both the month and the member in the index condition (a probe a month), not by reading
// the whole index or table, whatever the planner would pick on a small table (seq scans off).
func TestForMemberLooksUpEachMonth(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SET enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	if err := probesEachMonth(ctx, conn, sqlForMember); err != nil {
		t.Error(err)
	}
	if err := probesEachMonth(ctx, conn, sqlForMemberByScan); err == nil {
		t.Error("the member alone passed too: the check cannot fail")
	}
}

// probesEachMonth says why sql's plan reads issued_coupons other than by (month, member) or at
// an end of issued_coupons_month_member.
func probesEachMonth(ctx context.Context, conn *pgx.Conn, sql string) error {
	var plan []struct{ Plan planNode }
	if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, "m1", "").Scan(&plan); err != nil {
		return err
	}
	var reads []string
	var walk func(n planNode)
	walk = func(n planNode) {
		if n.Relation == "issued_coupons" {
			reads = append(reads, n.Type+" "+n.Index+" "+n.Cond)
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plan[0].Plan)
	for _, r := range reads {
		if r == "Index Only Scan issued_coupons_month_member (month IS NOT NULL)" {
			continue // min(month) or max(month): one end of the index
		}
		if !strings.Contains(r, "issued_coupons_month_member") || !strings.Contains(r, "month =") || !strings.Contains(r, "member_id =") {
			return fmt.Errorf("issued_coupons read by %q, want issued_coupons_month_member on month and member", r)
		}
	}
	if len(reads) == 0 {
		return fmt.Errorf("no read of issued_coupons in the plan")
	}
	return nil
}

type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Cond     string     `json:"Index Cond"`
	Plans    []planNode `json:"Plans"`
}
