package outbox_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/shared/outbox"
)

// BenchmarkRelay drains 2,000 outbox rows, every member linked to a LINE user id, into the LINE
// stand-in over loopback HTTP per iteration, one relay calling Run until nothing is due, and
// reports rows per second. The stand-in answers at once, so this is the relay's own ceiling
// (claims joining the LINE accounts, pushes through the SDK and the breaker, one mark
// per row), not LINE's latency.
//
//	go test -run '^$' -bench Relay -benchtime 5x ./shared/outbox
func BenchmarkRelay(b *testing.B) {
	const rows = 2000
	for _, c := range []struct {
		name string
		cfg  outbox.Config
	}{
		{"defaults", outbox.Config{}}, // 50 per batch, 8 in flight, 500 pushes/s
		{"line-limit", outbox.Config{RateLimit: outbox.LINEPushRateLimit, Parallelism: 16}}, // LINE's 2,000/s
	} {
		b.Run(c.name, func(b *testing.B) {
			bb := setup(b, rows)
			ctx := context.Background()
			for range b.N {
				b.StopTimer()
				_, err := bb.pool.Exec(ctx, `UPDATE notification_outbox
					SET sent_at = NULL, attempts = 0, claimed_by = NULL, first_pushed_at = NULL,
					    next_attempt_at = now() - interval '1 hour'`)
				if err != nil {
					b.Fatal(err)
				}
				srv := httptest.NewServer(linestub.New()) // fresh retry keys: every push a 200
				cfg := c.cfg
				cfg.ChannelAccessToken, cfg.BaseURL, cfg.Logger = "bench-token", srv.URL, bb.cfg.Logger
				r, err := outbox.New(bb.pool, cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				sent := 0
				for {
					res, err := r.Run(ctx, 0)
					if err != nil {
						b.Fatal(err)
					}
					if res.Rows() == 0 {
						break
					}
					sent += res.Sent
				}
				b.StopTimer()
				srv.Close()
				if sent != rows {
					b.Fatalf("sent %d of %d", sent, rows)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(rows*b.N)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
