package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestPruneKeepsAFloor: "outbox prune --older-than 1ns" is refused with exit 2 and the usage,
// deleting nothing (before: every closed row deleted at once); --dry-run counts the rows a prune
// would delete and deletes none; --force prunes below the floor; "outbox requeue" of a pruned
// row says it was pruned (before: "neither parked nor skipped"). Rows counted with SQL. Shown red
// on its broken variants: a prune without the floor (every prune given its bypass, --force), a
// --dry-run not honoured, a requeue that does not look for pruned rows.
func TestPruneKeepsAFloor(t *testing.T) {
	var floorOff []string // what every prune is given besides its flags: the floor's bypass, in the variant
	dryRun := "--dry-run"
	checkAndBreak(t, func(t *testing.T, v *verdict) { pruneCheck(t, v, floorOff, dryRun) },
		brokenVariant{"no floor", func(t *testing.T) { swap(t, &floorOff, []string{"--force"}) }},
		brokenVariant{"--dry-run not honoured", func(t *testing.T) { swap(t, &dryRun, "--dry-run=false") }},
		brokenVariant{"a requeue blind to pruned rows", func(t *testing.T) {
			swap(t, &prunedRows, func(context.Context, *pgxpool.Pool, []string) ([]prunedRow, error) { return nil, nil })
		}})
}

// pruneCheck prunes below the floor, then with dryRun (the flag that makes a dry run), then with
// --force, each prune given extra too, requeues a pruned row, and records what went wrong.
func pruneCheck(t *testing.T, v *verdict, extra []string, dryRun string) {
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
	code, stdout, stderr := grantCLI(append([]string{"outbox", "prune", "--older-than", "1ns"}, extra...)...)
	if code != 2 || !strings.Contains(stderr, "couponctl: --older-than 1ns: below the 24h0m0s floor") || !strings.Contains(stderr, "Usage:") {
		v.Errorf("prune --older-than 1ns: exit %d, want 2 with the floor and the usage\n%s%s", code, stdout, stderr)
	}
	if n := rows(); n != 2 {
		v.Errorf("%d outbox rows after the refused prune, want 2", n)
	}
	code, stdout, stderr = grantCLI("outbox", "prune", "--older-than", "1m", "--force", dryRun)
	if code != 0 || !strings.Contains(stdout, "dry run: would delete 2 sent and skipped rows closed more than 1m0s ago") {
		v.Errorf("prune --dry-run: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := rows(); n != 2 {
		v.Errorf("%d outbox rows after the dry run, want 2", n)
	}
	if code, stdout, stderr = grantCLI("outbox", "prune", "--older-than", "1m", "--force"); code != 0 || !strings.Contains(stdout, "deleted 2 ") {
		v.Errorf("prune --force: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := rows(); n != 0 {
		v.Errorf("%d outbox rows after prune --force, want 0", n)
	}
	var id string
	if err := d.owner.QueryRow(context.Background(), `SELECT coupon_id::text FROM issued_coupons WHERE member_id = 'm1'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = grantCLI("outbox", "requeue", id)
	if code != 1 || !strings.Contains(stderr, "couponctl: "+id+": its outbox row was pruned at ") || strings.Contains(stdout, "neither parked nor skipped") {
		v.Errorf("requeue of a pruned row: exit %d, want 1 naming it as pruned\n%s%s", code, stdout, stderr)
	}
}
