package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/schema/current"
)

// BenchmarkClaimLeaseGuard is what 00022's BEFORE UPDATE trigger adds to a claim: outbox_claim
// leasing 1,000 due rows of live coupons (seeded as BenchmarkRelay's), on one connection, with
// the trigger as migrated, with the trigger's function given a SET search_path (the variant
// 00022 did not take), and with the trigger disabled (the schema before 00022). Each iteration
// runs the three in turn, so that the load of a shared machine falls on all alike, putting the
// rows back to due first, untimed (the trigger is not called for that update: it sets
// claimed_by to NULL). It reports microseconds per leased row for each (ns/op is the three
// claims together).
//
//	go test -run '^$' -bench ClaimLeaseGuard -benchtime 20x -count 3 ./shared/outbox
func BenchmarkClaimLeaseGuard(b *testing.B) {
	const rows = 1000
	bb := setup(b, rows)
	ctx := context.Background()
	conn, err := bb.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	migrated, _, err := current.Definition("outbox_lease_refused")
	if err != nil {
		b.Fatal(err)
	}
	withSet := strings.Replace(migrated, "AS $function$", "SET search_path = public, pg_temp AS $function$", 1)
	variants := []struct {
		name, def, trigger string
		took               time.Duration
	}{
		{name: "migrated", def: migrated, trigger: "ENABLE"},
		{name: "set-search-path", def: withSet, trigger: "ENABLE"},
		{name: "no-trigger", def: migrated, trigger: "DISABLE"},
	}
	b.ResetTimer()
	for range b.N {
		for i := range variants {
			v := &variants[i]
			b.StopTimer()
			onConn(b, conn, v.def)
			onConn(b, conn, `ALTER TABLE notification_outbox `+v.trigger+` TRIGGER outbox_lease_refused`)
			onConn(b, conn, `UPDATE notification_outbox
				SET claimed_by = NULL, first_pushed_at = NULL, next_attempt_at = now() - interval '1 hour'`)
			b.StartTimer()
			start := time.Now()
			var leased int
			if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE skip_reason IS NULL)
				FROM outbox_claim($1, gen_random_uuid(), interval '30 seconds', now(), interval '23 hours')`, rows).Scan(&leased); err != nil {
				b.Fatal(err)
			}
			v.took += time.Since(start)
			if leased != rows {
				b.Fatalf("%s: leased %d of %d", v.name, leased, rows)
			}
		}
	}
	for _, v := range variants {
		b.ReportMetric(float64(v.took.Microseconds())/float64(rows*b.N), "µs/row-"+v.name)
	}
}

// onConn runs sql on conn and stops the benchmark if it fails.
func onConn(b *testing.B, conn *pgxpool.Conn, sql string) {
	b.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		b.Fatalf("%s: %v", sql, err)
	}
}
