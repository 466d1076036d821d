package main

import (
	"context"
	"strings"
	"testing"
)

// TestPruneKeepsAFloor: "outbox prune --older-than 1ns" is refused with exit 2 and the usage,
// deleting nothing (before: every closed row deleted at once); --dry-run counts the rows a prune
// would delete and deletes none; --force prunes below the floor; "outbox requeue" of a pruned
// row says it was pruned (before: "neither parked nor skipped"). Rows counted with SQL.
func TestPruneKeepsAFloor(t *testing.T) {
	d := newGrantDB(t)
	if _, err := d.owner.Exec(context.Background(), `
WITH k AS (INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('T', 1000, 1000000)),
c AS (INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
      VALUES ('T', 'm1', '2026-11', 1000), ('T', 'm2', '2026-11', 1000) RETURNING coupon_id, member_id)
INSERT INTO notification_outbox (coupon_id, member_id, sent_at) SELECT coupon_id, member_id, now() - interval '1 hour' FROM c`); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DATABASE_URL", d.admin)
	rows := func() int { return d.count(t, `SELECT count(*) FROM notification_outbox`) }
	code, stdout, stderr := grantCLI("outbox", "prune", "--older-than", "1ns")
	if code != 2 || !strings.Contains(stderr, "couponctl: --older-than 1ns: below the 24h0m0s floor") || !strings.Contains(stderr, "Usage:") {
		t.Errorf("prune --older-than 1ns: exit %d, want 2 with the floor and the usage\n%s%s", code, stdout, stderr)
	}
	if n := rows(); n != 2 {
		t.Fatalf("%d outbox rows after the refused prune, want 2", n)
	}
	code, stdout, stderr = grantCLI("outbox", "prune", "--older-than", "1m", "--force", "--dry-run")
	if code != 0 || !strings.Contains(stdout, "dry run: would delete 2 sent and skipped rows closed more than 1m0s ago") {
		t.Errorf("prune --dry-run: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := rows(); n != 2 {
		t.Fatalf("%d outbox rows after the dry run, want 2", n)
	}
	if code, stdout, stderr = grantCLI("outbox", "prune", "--older-than", "1m", "--force"); code != 0 || !strings.Contains(stdout, "deleted 2 ") {
		t.Errorf("prune --force: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := rows(); n != 0 {
		t.Fatalf("%d outbox rows after prune --force, want 0", n)
	}
	var id string
	if err := d.owner.QueryRow(context.Background(), `SELECT coupon_id::text FROM issued_coupons WHERE member_id = 'm1'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = grantCLI("outbox", "requeue", id)
	if code != 1 || !strings.Contains(stderr, "couponctl: "+id+": its outbox row was pruned at ") || strings.Contains(stdout, "neither parked nor skipped") {
		t.Errorf("requeue of a pruned row: exit %d, want 1 naming it as pruned\n%s%s", code, stdout, stderr)
	}
}
