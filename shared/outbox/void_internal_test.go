package outbox

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/mops/coupon-api/internal/coupon"
	"github.com/mops/coupon-api/internal/linestub"
	"github.com/mops/coupon-api/internal/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox/outboxdb"
)

// TestVoidedCouponIsNeverPushed: three coupons, all linked to LINE, one voided before the relay
// runs. The relay pushes the two others, skips the voided one and counts it, and LINE never sees
// it. The broken variant, a relay that ignores voids (the claimed rows' Voided flag dropped before
// they are delivered), pushes it: the check sees that.
func TestVoidedCouponIsNeverPushed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, broken := range []bool{false, true} {
		pool := pgtest.Pool(t, 8)
		if _, err := pool.Exec(ctx, `INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('V', 1000, 1000000);
			INSERT INTO campaign_budgets (campaign_id, discount_yen, budget_yen) VALUES ('V', 1000, 1000000);
			INSERT INTO member_line_accounts (member_id, line_user_id) SELECT 'm' || g, 'U' || md5('m' || g::text) FROM generate_series(1, 3) g`); err != nil {
			t.Fatal(err)
		}
		svc, err := issuance.New(pool, issuance.Config{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range []string{"m1", "m2", "m3"} {
			out, err := svc.Issue(ctx, m, "V")
			if err != nil || out.Result != issuance.ResultIssued {
				t.Fatalf("issue %s: %+v %v", m, out, err)
			}
			ids = append(ids, out.CouponID)
		}
		v, err := coupon.Void(ctx, pool, ids[1], "fraud ring", false)
		if err != nil || v.Push != "not sent" {
			t.Fatalf("void: %+v %v, want voided before its push", v, err)
		}
		stub := linestub.New()
		srv := httptest.NewServer(stub)
		r, err := New(pool, Config{ChannelAccessToken: "t", BaseURL: srv.URL, BatchSize: 10, Parallelism: 2,
			PushTimeout: time.Second, BatchTimeout: 5 * time.Second, Lease: 10 * time.Second, RunBudget: 20 * time.Second,
			MaxAttempts: 5, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		var res Result
		if broken {
			res = deliverIgnoringVoids(t, r)
		} else if res, err = r.Run(ctx, 0); err != nil {
			t.Fatal(err)
		}
		srv.Close()
		pushed := slices.ContainsFunc(stub.Pushes(), func(p linestub.Push) bool { return p.RetryKey == ids[1] })
		if broken {
			if !pushed {
				t.Error("the broken variant pushed no voided coupon: the test would not see a relay that ignores voids")
			}
			continue
		}
		if pushed || res != (Result{Sent: 2, Skipped: 1}) {
			t.Errorf("relay run %+v, voided coupon pushed: %v; want 2 sent, 1 skipped, the voided one never pushed", res, pushed)
		}
		var lastErr string
		if err := pool.QueryRow(ctx, `SELECT last_error FROM notification_outbox WHERE coupon_id = $1 AND skipped_at IS NOT NULL`,
			ids[1]).Scan(&lastErr); err != nil || lastErr != couponVoided {
			t.Errorf("the voided coupon's outbox row: %q %v, want skipped with %q", lastErr, err, couponVoided)
		}
	}
}

// deliverIgnoringVoids is the broken relay: it claims the due rows and delivers them as if no
// coupon were voided.
func deliverIgnoringVoids(t *testing.T, r *Relay) Result {
	t.Helper()
	ctx := context.Background()
	run := runState{id: uuid.New(), breaker: &breaker{threshold: r.cfg.BreakerFailures}}
	rows, err := outboxdb.Claim(ctx, r.pool, outboxdb.ClaimParams{Run: run.id, Limit: 10, Lease: r.cfg.Lease,
		DueAt: time.Now().Add(time.Minute), KeyWindow: RetryKeyWindow})
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		rows[i].Voided = false
	}
	return r.deliver(ctx, &run, rows)
}
