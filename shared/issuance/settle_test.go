package issuance_test

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// holdQueriesToxic is a database that lets connections in and never runs a query: it forwards
// the startup and cancel packets of new connections (protocol codes 196608, 80877102, 80877103:
// PostgreSQL 15 docs, 55.7 "Message Formats") and holds back every other client byte, counting
// the messages it held: the fault's own evidence.
type holdQueriesToxic struct {
	held atomic.Int64
}

func (h *holdQueriesToxic) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if len(c.Data) >= 8 {
				switch binary.BigEndian.Uint32(c.Data[4:8]) {
				case 196608, 80877102, 80877103:
					stub.Output <- c
					continue
				}
			}
			h.held.Add(1)
		}
	}
}

func init() { toxics.Register("hold_queries", new(holdQueriesToxic)) }

// TestSettlementOfAnUnreadableDatabase: the call's answer is lost (its query never runs) and the
// database lets the settlement's connection in but never answers its queries either. The
// settlement cannot tell whether the coupon exists, and says so: the outcome is unknown, never
// "nothing was written". (That it gives up at the call's end is TestSettlementEndsWithTheBudget.)
func TestSettlementOfAnUnreadableDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	proxy, proxied := startProxy(t, dbURL)
	pool := prodPool(t, proxied, 1)
	svc := faultService(t, pool, issuance.Config{Budget: time.Second, LockTimeout: 300 * time.Millisecond,
		StatementTimeout: 600 * time.Millisecond}, "HOLD")
	if out, err := svc.Issue(ctx, "warm", "HOLD"); err != nil || out.Result != issuance.ResultIssued {
		t.Fatalf("warm-up: %+v %v", out, err)
	}
	wrapper, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name": "hold", "type": "hold_queries", "stream": "upstream"}`))
	if err != nil {
		t.Fatal(err)
	}
	hold := proxy.Toxics.GetToxic(wrapper.Name).Toxic.(*holdQueriesToxic)
	out, err := svc.Issue(ctx, "held", "HOLD")
	proxy.Stop() // ends the connections it holds, so that the pool closes at once
	if hold.held.Load() == 0 {
		t.Fatal("the toxic held back no query: the fault did not fire")
	}
	if !errors.Is(err, issuance.ErrOutcomeUnknown) {
		t.Errorf("%+v %v, want the outcome unknown (nothing could be looked up)", out, err)
	}
}

// TestReSendAfterTheCampaignEnded: a member's re-send after the campaign's end is answered with
// the coupon the member holds (ALREADY_ISSUED), as a re-send must be (docs/api.md), not
// CAMPAIGN_NOT_ACTIVE; a member without one gets CAMPAIGN_NOT_ACTIVE.
func TestReSendAfterTheCampaignEnded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, 2)
	now := time.Now()
	ends := now.Add(time.Hour)
	if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "ENDS", DiscountYen: 1000, BudgetYen: 100_000, EndsAt: &ends}); err != nil {
		t.Fatal(err)
	}
	svc, err := issuance.New(pool, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := svc.Issue(ctx, "m1", "ENDS")
	if err != nil || first.Result != issuance.ResultIssued {
		t.Fatalf("during the campaign: %+v %v", first, err)
	}
	pgtest.SetClock(t, pool, ends.Add(time.Minute))
	if out, err := svc.Issue(ctx, "m1", "ENDS"); err != nil || out.Result != issuance.ResultAlreadyIssued || out.CouponID != first.CouponID {
		t.Errorf("re-send after the end: %+v %v, want ALREADY_ISSUED with %s", out, err, first.CouponID)
	}
	if out, err := svc.Issue(ctx, "m2", "ENDS"); err != nil || out.Result != issuance.ResultCampaignNotActive {
		t.Errorf("a new member after the end: %+v %v, want CAMPAIGN_NOT_ACTIVE", out, err)
	}
}

// TestIssueCouponChecksItsArguments: issue_coupon refuses a cap that is missing or not positive
// and missing ids (22023), and counts a coupon against the Asia/Tokyo month of its issue time,
// whatever the caller's session time zone.
func TestIssueCouponChecksItsArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, 1)
	if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "ARGS", DiscountYen: 1000, BudgetYen: 100_000}); err != nil {
		t.Fatal(err)
	}
	call := `SELECT result FROM issue_coupon(gen_random_uuid(), $1, $2, $3, $4, NULL)`
	// 2026-09-30 23:30 in Tokyo is 14:30 UTC: September in Tokyo, whatever the session says.
	lateSeptember := time.Date(2026, 9, 30, 14, 30, 0, 0, time.UTC)
	pgtest.SetClock(t, pool, lateSeptember)
	for _, bad := range []struct {
		campaign, member any
		cap              any
	}{{"ARGS", "m1", nil}, {"ARGS", "m1", 0}, {"ARGS", "m1", -2000}, {nil, "m1", 2000}, {"ARGS", nil, 2000}} {
		var result *string
		err := pool.QueryRow(ctx, call, bad.campaign, bad.member, lateSeptember, bad.cap).Scan(&result)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.InvalidParameterValue {
			t.Errorf("campaign %v member %v cap %v: %v %v, want 22023", bad.campaign, bad.member, bad.cap, result, err)
		}
	}
	if _, err := pool.Exec(ctx, `SET TIME ZONE 'America/Los_Angeles'`); err != nil {
		t.Fatal(err)
	}
	var result string
	if err := pool.QueryRow(ctx, call, "ARGS", "m1", lateSeptember, 2000).Scan(&result); err != nil || result != "ISSUED" {
		t.Fatalf("a valid call: %s %v", result, err)
	}
	if month := scalar[string](t, pool, `SELECT month FROM issued_coupons WHERE member_id = 'm1'`); month != "2026-09" {
		t.Errorf("month %s, want 2026-09 (Tokyo)", month)
	}
}

// TestFunctionResultChangedUnderPreparedCalls: a migration replaces issue_coupons_batch_v3 with one
// whose amount is bigint (answering through the old one, renamed) while the pooled connection holds the call prepared, so the next call fails
// with 0A000 "cached plan must not change result type". The service prepares it afresh and
// answers ISSUED.
func TestFunctionResultChangedUnderPreparedCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	pool := prodPool(t, dbURL, 1)
	svc := faultService(t, pool, issuance.Config{}, "RESULT")
	if out, err := svc.Issue(ctx, "before", "RESULT"); err != nil || out.Result != issuance.ResultIssued {
		t.Fatalf("before the migration: %+v %v", out, err)
	}
	// The migration: the function is renamed and a new one, whose amount is bigint, answers
	// through it.
	owner := connect(t, dbURL)
	if _, err := owner.Exec(ctx, `
ALTER FUNCTION issue_coupons_batch_v3(text, uuid[], text[], text[]) RENAME TO issue_coupons_batch_before;
CREATE FUNCTION issue_coupons_batch_v3(c text, ids uuid[], ms text[], tps text[])
RETURNS TABLE (i integer, result text, coupon text, amount bigint, reason text, expires_at timestamptz, next_release_at timestamptz,
               month text, issued_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public, pg_temp
AS $$ SELECT b.i, b.result, b.coupon, b.amount::bigint, b.reason, b.expires_at, b.next_release_at, b.month, b.issued_at
        FROM issue_coupons_batch_before(c, ids, ms, tps) b $$;
GRANT EXECUTE ON FUNCTION issue_coupons_batch_v3(text, uuid[], text[], text[]) TO coupon_issue`); err != nil {
		t.Fatal(err)
	}
	out, err := svc.Issue(ctx, "after", "RESULT")
	if err != nil || out.Result != issuance.ResultIssued || out.AmountYen != 1000 {
		t.Fatalf("after the migration: %+v %v, want ISSUED for 1000 yen", out, err)
	}
	if out.Attempts != 2 {
		t.Errorf("after the migration: %d attempts, want 2 (the prepared call failed with 0A000 once)", out.Attempts)
	}
}
