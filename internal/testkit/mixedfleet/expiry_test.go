package mixedfleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
	"github.com/mops/coupon-api/schema"
)

// dropLeaseGuard is the broken migration of TestPreviousRelayPushesExpiredCouponsWithoutTheGuard:
// it drops the trigger by which 00022_lease_refuses_unpushable.sql makes the database refuse any
// relay's lease on an outbox row whose coupon may not be pushed, and leaves the rest of the schema
// as this tree has it (later migrations name the trigger's function, so 00022 cannot be left out).
const dropLeaseGuard = `-- +goose Up
SET LOCAL lock_timeout = '3s';
DROP TRIGGER outbox_lease_refused ON notification_outbox;
`

// TestPreviousRelayLeavesExpiredCoupons: after this tree's migrations, the previous release's
// RelayOutbox, whose claim does not read a coupon's expiry, pushes a live coupon but not one
// whose expiry has passed, and leaves its outbox row open and unleased; this tree's RelayOutbox
// then closes that row as skipped, 'expired'. Pushes are counted at the LINE stand-in, the rows
// in notification_outbox.
func TestPreviousRelayLeavesExpiredCoupons(t *testing.T) {
	x := pastExpiry(t, schema.Migrations())
	if n := x.stub.Calls(x.expired); n != 0 {
		t.Errorf("the previous release's relay pushed the expired coupon %d times, want 0", n)
	}
	if n := x.stub.Calls(x.live); n != 1 {
		t.Errorf("the previous release's relay pushed the live coupon %d times, want once", n)
	}
	if row := x.expiredRow(t); row != "open" {
		t.Errorf("after the previous release's relay, the expired coupon's outbox row is %s, want open (not leased, not closed)", row)
	}

	this := serve(t, "this", proctest.Build(t, root+"/cmd/couponctl"), x.dbURL, x.lineURL)
	if n := relay(t, this).SkippedReasons.Expired; n != 1 {
		t.Errorf("this release's RelayOutbox counted %d rows skipped as expired, want 1", n)
	}
	if row := x.expiredRow(t); row != "skipped expired" {
		t.Errorf("after this release's relay, the expired coupon's outbox row is %s, want skipped expired", row)
	}
	if e, l := x.stub.Calls(x.expired), x.stub.Calls(x.live); e != 0 || l != 1 {
		t.Errorf("after this release's relay: the expired coupon pushed %d times, the live one %d; want 0 and 1", e, l)
	}
}

// TestPreviousRelayPushesExpiredCouponsWithoutTheGuard is the negative control of
// TestPreviousRelayLeavesExpiredCoupons: on this tree's schema without 00022's trigger
// (dropLeaseGuard), the previous release's relay pushes the expired coupon. The test above must be
// able to fail.
func TestPreviousRelayPushesExpiredCouponsWithoutTheGuard(t *testing.T) {
	x := pastExpiry(t, withMigrationAfter(t, "drop_lease_guard", dropLeaseGuard))
	if n := x.stub.Calls(x.expired); n != 1 {
		t.Errorf("without 00022's trigger the previous release's relay pushed the expired coupon %d times, want once (the push it stops)", n)
	}
	if n := x.stub.Calls(x.live); n != 1 {
		t.Errorf("the previous release's relay pushed the live coupon %d times, want once", n)
	}
}

// expiryFixture is a database, migrated by this tree, holding two coupons the previous release
// issued to linked members, one of them expired, and the LINE stand-in after one RelayOutbox run
// of the previous release.
type expiryFixture struct {
	dbURL, lineURL string
	pool           *pgxpool.Pool
	stub           *linestub.Stub
	expired, live  string // coupon ids
}

// pastExpiry issues two coupons of linked members through the previous release, migrates the
// database with migrations while it serves, moves one coupon's expiry into the past (the
// fixture: waiting for a real expiry would tie the test to the clock), and runs the previous
// release's RelayOutbox once.
func pastExpiry(t *testing.T, migrations fs.FS) *expiryFixture {
	ctx := context.Background()
	prev := buildPrevious(t)
	x := &expiryFixture{dbURL: pgtest.EmptyURL(t), stub: linestub.New()}
	line := httptest.NewServer(x.stub)
	t.Cleanup(line.Close)
	x.lineURL = line.URL

	runCLI(t, prev, x.dbURL, "migrate")
	runCLI(t, prev, x.dbURL, "campaign", "create", "--id", "EXPIRY", "--discount-yen", "500", "--budget-yen", "10000")
	pool, err := pgxpool.New(ctx, x.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	x.pool = pool
	if _, err := pool.Exec(ctx, `INSERT INTO member_line_accounts (member_id, line_user_id)
		VALUES ('m-expired', 'U' || md5('m-expired')), ('m-live', 'U' || md5('m-live'))`); err != nil {
		t.Fatal(err)
	}
	previous := serve(t, "previous", prev, x.dbURL, x.lineURL)
	x.expired, x.live = issue(t, previous, "m-expired"), issue(t, previous, "m-live")

	var report syncbuf.Buffer
	if err := migrate(ctx, x.dbURL, migrations, &report); err != nil {
		t.Fatalf("this tree's migrate: %v\n%s", err, report.String())
	}
	if _, err := pool.Exec(ctx, `UPDATE issued_coupons SET expires_at = now() - interval '1 minute' WHERE coupon_id = $1`, x.expired); err != nil {
		t.Fatal(err)
	}
	relay(t, previous)
	return x
}

// expiredRow is the state of the expired coupon's outbox row: open, leased (a run holds it),
// sent, skipped REASON or parked.
func (x *expiryFixture) expiredRow(t *testing.T) string {
	t.Helper()
	var s string
	if err := x.pool.QueryRow(context.Background(), `SELECT CASE WHEN sent_at IS NOT NULL THEN 'sent'
	    WHEN skipped_at IS NOT NULL THEN 'skipped ' || coalesce(skip_reason, '(no reason)')
	    WHEN parked_at IS NOT NULL THEN 'parked'
	    WHEN claimed_by IS NOT NULL AND next_attempt_at > now() THEN 'leased' ELSE 'open' END
	  FROM notification_outbox WHERE coupon_id = $1`, x.expired).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// issue asks f's IssueCoupon for member's coupon of campaign EXPIRY and returns its id.
func issue(t *testing.T, f fleet, member string) string {
	t.Helper()
	status, body, err := post(context.Background(), f.url+"/IssueCoupon", fmt.Sprintf(`{"member_id": %q, "campaign_id": "EXPIRY"}`, member))
	var got struct {
		Result   string
		CouponID string `json:"coupon_id"`
	}
	if err == nil {
		err = json.Unmarshal([]byte(body), &got)
	}
	if err != nil || status != http.StatusCreated || got.Result != "ISSUED" || got.CouponID == "" {
		t.Fatalf("IssueCoupon %s on the %s release: %d %s %v", member, f.name, status, body, err)
	}
	return got.CouponID
}

// relayAnswer is the part of RelayOutbox's answer the test reads.
type relayAnswer struct {
	SkippedReasons struct{ Expired int } `json:"skipped_reasons"`
}

// relay runs f's RelayOutbox once and returns its answer.
func relay(t *testing.T, f fleet) relayAnswer {
	t.Helper()
	status, body, err := post(context.Background(), f.url+"/RelayOutbox", `{"max_rows": 1000}`)
	var got relayAnswer
	if err == nil {
		err = json.Unmarshal([]byte(body), &got)
	}
	if err != nil || status != http.StatusOK {
		t.Fatalf("RelayOutbox on the %s release: %d %s %v", f.name, status, body, err)
	}
	return got
}
