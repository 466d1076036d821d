package outbox

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox/outboxdb"
)

// previousClaim is the previous release's claim, inline SQL on the tables (shared/outbox/outboxdb
// before 00015_expiry.sql): it leases every due row, voided, expired or unlinked alike, and
// leaves the decision to the relay's Go code. The tables it reads stay, so the previous release
// keeps running beside this one; since 00022_lease_refuses_unpushable.sql the database refuses
// its lease of a voided or expired coupon's row. It is kept here as a fixture.
const previousClaim = `
WITH due AS MATERIALIZED (
  SELECT coupon_id, member_id, next_attempt_at, first_pushed_at FROM notification_outbox
   WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL AND next_attempt_at <= $4
   ORDER BY next_attempt_at
   LIMIT $1
   FOR UPDATE SKIP LOCKED
)
UPDATE notification_outbox o
   SET next_attempt_at = now() + $3::interval, claimed_by = $2,
       first_pushed_at = CASE WHEN l.line_user_id IS NULL OR i.voided_at IS NOT NULL THEN o.first_pushed_at
                              ELSE COALESCE(o.first_pushed_at, now()) END
  FROM due JOIN issued_coupons i USING (coupon_id)
       LEFT JOIN member_line_accounts l ON l.member_id = due.member_id
 WHERE o.coupon_id = due.coupon_id
RETURNING o.coupon_id::text, o.member_id, o.attempts, i.campaign_id, i.amount_yen, COALESCE(l.line_user_id, ''),
          COALESCE(o.first_pushed_at < now() - $5::interval, false), due.next_attempt_at, due.first_pushed_at,
          o.trace_parent, i.expires_at, ''`

// TestClaimClosesVoidedAndExpiredCoupons: the relay as coupon_relay. Six coupons issued, then m2's voided, m3's past its
// expiry, m4's expiring inside the relay's lease, m5's member without a LINE account; m1's and
// m6's (expiring after the lease) are live. The relay pushes m1 and m6 alone; the void closed m2's
// row as skipped (voided), the claim closes the three others, each with its reason, counted apart
// in the run's answer; LINE never sees m2, m3 or m4. Judged by the outbox rows (SQL) and by the
// requests at the LINE stand-in. The previous release's inline claim, which still runs as
// coupon_relay on this schema, is refused the leases of m3 and m4 (00022): they stay open and
// unleased, for outbox_claim to close, and LINE never sees them. The broken variants, that
// inline claim without 00022's trigger and outbox_claim with neither its nor the trigger's
// expiry rule (pgtest.BreakFunction), push the expired coupon: the check sees that.
func TestClaimClosesVoidedAndExpiredCoupons(t *testing.T) {
	t.Parallel()
	const lease = 10 * time.Second
	const (
		current        = "outbox_claim"
		inline         = "previous inline claim"
		inlineUnguared = "previous inline claim without the lease guard"
		noExpiry       = "outbox_claim and the lease guard without expiry"
	)
	for _, variant := range []string{current, inline, inlineUnguared, noExpiry} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := pgtest.URL(t)
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			ids := issueSix(t, pool, lease)
			// The relay as RelayOutbox runs it: a login in coupon_relay (00008_roles.sql).
			relayPool, err := pgxpool.New(ctx, pgtest.LoginAs(t, url, "coupon_relay"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(relayPool.Close)
			stub := linestub.New()
			srv := httptest.NewServer(stub)
			r, err := New(relayPool, Config{ChannelAccessToken: "t", BaseURL: srv.URL, BatchSize: 10, Parallelism: 2,
				PushTimeout: time.Second, BatchTimeout: 5 * time.Second, Lease: lease, RunBudget: 20 * time.Second,
				MaxAttempts: 5, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			var res Result
			switch variant {
			case inlineUnguared:
				if _, err := pool.Exec(ctx, `DROP TRIGGER outbox_lease_refused ON notification_outbox`); err != nil {
					t.Fatal(err)
				}
				fallthrough
			case inline:
				res = deliverClaimedBy(t, r, previousClaim)
			case noExpiry:
				pgtest.BreakFunction(t, pool, "outbox_claim", [2]string{"WHEN i.expires_at <= issue_now() + p_lease THEN 'expired'", ""})
				pgtest.BreakFunction(t, pool, "outbox_lease_refused", [2]string{"OR c.expires_at <= NEW.next_attempt_at", ""})
				fallthrough
			default:
				if res, err = r.Run(ctx, 0); err != nil {
					t.Fatal(err)
				}
			}
			srv.Close()
			switch variant {
			case inlineUnguared, noExpiry:
				if stub.Calls(ids["m3"]) == 0 {
					t.Errorf("%s pushed no expired coupon: the test would not see a claim that ignores expiry", variant)
				}
				return
			case inline:
				checkInlineLeftExpired(t, pool, stub, ids)
				return
			}
			for _, m := range []string{"m2", "m3", "m4", "m5"} {
				if n := stub.Calls(ids[m]); n != 0 {
					t.Errorf("%s's coupon: %d push requests at LINE, want none", m, n)
				}
			}
			// m2's row was closed by its void (00018_void_closes_outbox.sql), before any claim: the
			// run skips the three others. The claim's own 'voided' closes a row left open by a
			// void made before 00018.
			want := Result{Sent: 2, Skipped: 3, SkippedReasons: SkippedReasons{NoLINEAccount: 1, Expired: 2}}
			if res != want {
				t.Errorf("relay run %+v, want %+v", res, want)
			}
			var rows string
			if err := pool.QueryRow(ctx, `SELECT string_agg(member_id || ':' || CASE
			    WHEN sent_at IS NOT NULL THEN 'sent' WHEN skipped_at IS NOT NULL THEN 'skipped/' || skip_reason
			    ELSE 'open' END, ' ' ORDER BY member_id)
			  FROM notification_outbox WHERE claimed_by IS NULL AND first_pushed_at IS NOT DISTINCT FROM
			    CASE WHEN sent_at IS NOT NULL THEN first_pushed_at END`).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if w := "m1:sent m2:skipped/voided m3:skipped/expired m4:skipped/expired m5:skipped/no_line_account m6:sent"; rows != w {
				t.Errorf("outbox rows (released, first pushed only when sent): %q, want %q", rows, w)
			}
		})
	}
}

// checkInlineLeftExpired: after the previous release's inline claim, LINE saw none of the voided
// and expired coupons (m2, m3, m4), and the expired ones' rows are open and unleased, the lease
// refused, for outbox_claim to close.
func checkInlineLeftExpired(t *testing.T, pool *pgxpool.Pool, stub *linestub.Stub, ids map[string]string) {
	t.Helper()
	for _, m := range []string{"m2", "m3", "m4"} {
		if n := stub.Calls(ids[m]); n != 0 {
			t.Errorf("%s's coupon: %d push requests at LINE after the previous release's claim, want none", m, n)
		}
	}
	var rows string
	if err := pool.QueryRow(context.Background(), `SELECT string_agg(member_id || ':' || CASE
	    WHEN sent_at IS NOT NULL OR skipped_at IS NOT NULL OR parked_at IS NOT NULL THEN 'closed'
	    WHEN claimed_by IS NOT NULL THEN 'leased' ELSE 'open' END, ' ' ORDER BY member_id)
	  FROM notification_outbox WHERE member_id IN ('m3', 'm4')`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if w := "m3:open m4:open"; rows != w {
		t.Errorf("expired coupons' outbox rows after the previous release's claim: %q, want %q", rows, w)
	}
}

// issueSix issues campaign X to m1..m6 through the issuance service, links m1..m4 and m6 to LINE,
// voids m2's coupon, and moves m3's expiry into the past and m4's to half the lease from now,
// m6's to an hour away: the states the passing of time would give, without waiting for it.
func issueSix(t *testing.T, pool *pgxpool.Pool, lease time.Duration) map[string]string {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO campaigns (campaign_id, discount_yen, budget_yen) VALUES ('X', 100, 1000000);
		INSERT INTO campaign_budgets (campaign_id, discount_yen, budget_yen, coupon_valid_days) VALUES ('X', 100, 1000000, 30);
		INSERT INTO member_line_accounts (member_id, line_user_id)
		SELECT 'm' || g, 'U' || md5('m' || g::text) FROM generate_series(1, 6) g WHERE g <> 5`); err != nil {
		t.Fatal(err)
	}
	svc, err := issuance.New(pool, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, m := range []string{"m1", "m2", "m3", "m4", "m5", "m6"} {
		out, err := svc.Issue(ctx, m, "X")
		if err != nil || out.Result != issuance.ResultIssued {
			t.Fatalf("issue %s: %+v %v", m, out, err)
		}
		ids[m] = out.CouponID
	}
	if v, err := coupon.Void(ctx, pool, ids["m2"], "fraud ring", false); err != nil || v.Push != "not sent" {
		t.Fatalf("void: %+v %v, want voided before its push", v, err)
	}
	b := &pgx.Batch{}
	b.Queue(`UPDATE issued_coupons SET expires_at = now() - interval '1 minute' WHERE coupon_id = $1`, ids["m3"])
	b.Queue(`UPDATE issued_coupons SET expires_at = now() + $2::interval WHERE coupon_id = $1`, ids["m4"], lease/2)
	b.Queue(`UPDATE issued_coupons SET expires_at = now() + interval '1 hour' WHERE coupon_id = $1`, ids["m6"])
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// deliverClaimedBy claims the due rows with claim (outboxdb.Claim's parameters) and delivers
// them as a run does.
func deliverClaimedBy(t *testing.T, r *Relay, claim string) Result {
	t.Helper()
	ctx := context.Background()
	run := runState{id: uuid.New(), breaker: &breaker{threshold: r.cfg.BreakerFailures}}
	rows, err := r.pool.Query(ctx, claim, 10, run.id, r.cfg.Lease, time.Now().Add(time.Minute), RetryKeyWindow)
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxdb.Claimed])
	if err != nil {
		t.Fatal(err)
	}
	return r.deliver(ctx, &run, claimed)
}

// TestLeaseGuardLetsTheMarksThrough: 00022's trigger refuses leases only. Two rows leased by
// outbox_claim (m1's and m6's coupons, live), then m1's coupon voided while its push is in flight
// and m6's moved past its expiry: the relay's marks of the push that was under way, sent for m1
// and retry for m6, still apply (they give the lease back, claimed_by NULL), so the rows say what
// happened to the pushes. Judged by the rows. The broken variant, the trigger called for every
// update (no WHEN), swallows both marks: m1's row stays leased although LINE took the push.
func TestLeaseGuardLetsTheMarksThrough(t *testing.T) {
	t.Parallel()
	const lease = 10 * time.Second
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "as migrated", true: "trigger without WHEN"}[broken], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			ids := issueSix(t, pool, lease)
			if broken {
				if _, err := pool.Exec(ctx, `DROP TRIGGER outbox_lease_refused ON notification_outbox;
					CREATE TRIGGER outbox_lease_refused BEFORE UPDATE ON notification_outbox
					  FOR EACH ROW EXECUTE FUNCTION outbox_lease_refused()`); err != nil {
					t.Fatal(err)
				}
			}
			run := uuid.New()
			claimed, err := outboxdb.Claim(ctx, pool, outboxdb.ClaimParams{Run: run, Limit: 10, Lease: lease,
				DueAt: time.Now(), KeyWindow: RetryKeyWindow})
			if err != nil {
				t.Fatal(err)
			}
			leased := map[string]bool{}
			for _, c := range claimed {
				if c.SkipReason == "" {
					leased[c.CouponID] = true
				}
			}
			if len(leased) != 2 || !leased[ids["m1"]] || !leased[ids["m6"]] {
				t.Fatalf("leased %v, want m1's and m6's coupons %s, %s", leased, ids["m1"], ids["m6"])
			}
			if v, err := coupon.Void(ctx, pool, ids["m1"], "voided in flight", false); err != nil || v.Push != "in flight" {
				t.Fatalf("void of m1's coupon: %+v %v, want in flight", v, err)
			}
			if _, err := pool.Exec(ctx, `UPDATE issued_coupons SET expires_at = now() - interval '1 minute' WHERE coupon_id = $1`, ids["m6"]); err != nil {
				t.Fatal(err)
			}
			if err := outboxdb.MarkSent(ctx, pool, ids["m1"]); err != nil {
				t.Fatal(err)
			}
			if err := outboxdb.MarkRetry(ctx, pool, run, ids["m6"], 0, "LINE answered 500"); err != nil {
				t.Fatal(err)
			}
			var rows string
			if err := pool.QueryRow(ctx, `SELECT string_agg(member_id || ':' || CASE
			    WHEN claimed_by IS NOT NULL THEN 'leased' WHEN sent_at IS NOT NULL THEN 'sent'
			    ELSE 'open/' || attempts || '/' || coalesce(last_error, '') END, ' ' ORDER BY member_id)
			  FROM notification_outbox WHERE member_id IN ('m1', 'm6')`).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			const want = "m1:sent m6:open/1/LINE answered 500"
			t.Logf("outbox rows after the marks: %q", rows)
			switch {
			case broken && rows == want:
				t.Errorf("with the trigger called for every update the marks still applied (%q): the test would not see a guard that swallows them", rows)
			case !broken && rows != want:
				t.Errorf("outbox rows after the marks: %q, want %q", rows, want)
			}
		})
	}
}
