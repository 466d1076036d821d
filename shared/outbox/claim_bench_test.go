package outbox_test

import (
	"context"
	"testing"
)

// BenchmarkClaimLeaseGuard is the database's cost of outbox_claim leasing 1,000 due rows of live
// coupons (rows seeded as BenchmarkRelay's), with 00022's BEFORE UPDATE trigger, which reads
// each leased row's coupon, and with the trigger dropped (the schema before 00022), and reports
// microseconds per leased row. Each iteration puts the rows back to due first, untimed; the
// trigger is not called for that update (it sets claimed_by to NULL).
//
//	go test -run '^$' -bench ClaimLeaseGuard -benchtime 50x ./shared/outbox
func BenchmarkClaimLeaseGuard(b *testing.B) {
	const rows = 1000
	for _, guard := range []string{"with-trigger", "without-trigger"} {
		b.Run(guard, func(b *testing.B) {
			bb := setup(b, rows)
			ctx := context.Background()
			if guard == "without-trigger" {
				if _, err := bb.pool.Exec(ctx, `DROP TRIGGER outbox_lease_refused ON notification_outbox`); err != nil {
					b.Fatal(err)
				}
			}
			conn, err := bb.pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			for range b.N {
				b.StopTimer()
				if _, err := conn.Exec(ctx, `UPDATE notification_outbox
					SET claimed_by = NULL, first_pushed_at = NULL, next_attempt_at = now() - interval '1 hour'`); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				var leased int
				if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE skip_reason IS NULL)
					FROM outbox_claim($1, gen_random_uuid(), interval '30 seconds', now(), interval '23 hours')`, rows).Scan(&leased); err != nil {
					b.Fatal(err)
				}
				if leased != rows {
					b.Fatalf("leased %d of %d", leased, rows)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(rows*b.N), "µs/row")
		})
	}
}
