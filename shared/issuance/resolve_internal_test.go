package issuance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/campaign"
	"github.com/mops/coupon-api/internal/pgtest"
)

// lostAttempt runs one attempt's statements for member on its own connection and leaves the
// transaction open, as a session whose COMMIT never arrived sits idle in it. It returns the
// connection, the attempt's outcome and what the service knows of the lost COMMIT.
func lostAttempt(t *testing.T, s *Service, dbURL, member string) (*pgx.Conn, Outcome, *commitUnknownError) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := request{memberID: member, campaignID: "LOST", issuedAt: time.Now(), month: Month(time.Now())}
	out, xid, err := s.statements(ctx, tx, r, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return conn, out, &commitUnknownError{err: errors.New("answer lost"), pid: conn.PgConn().PID(), xid: xid}
}

// TestResolveTerminatesTheSession: a lost COMMIT whose session is still open (a partition: the
// COMMIT never arrived, the server's session sits idle in its transaction, holding its rows) is
// settled by terminating that session, which rolls the transaction back: resolve reports nothing
// written, and no session is left. A lost COMMIT that did commit is answered ISSUED with its id.
// All of it as a user in coupon_issue, the function's role (00008_roles.sql).
func TestResolveTerminatesTheSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ownerURL := pgtest.URL(t)
	owner, err := pgxpool.New(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	if err := campaign.Create(ctx, owner, campaign.Campaign{ID: "LOST", DiscountYen: 1000, BudgetYen: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	// The function's own role (00008_roles.sql): it may read and terminate its own sessions.
	dbURL := pgtest.LoginAs(t, ownerURL, "coupon_issue")
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(pool, Config{})
	if err != nil {
		t.Fatal(err)
	}

	conn, out, lost := lostAttempt(t, s, dbURL, "open")
	_, err = s.resolve(ctx, request{memberID: "open", campaignID: "LOST"}, out, lost)
	if !errors.As(err, new(*connLostError)) {
		t.Fatalf("session idle in its transaction: %v, want nothing written (a connection lost)", err)
	}
	var sessions, coupons int
	if err := owner.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_stat_activity WHERE pid = $1),
		(SELECT count(*) FROM issued_coupons)`, int64(lost.pid)).Scan(&sessions, &coupons); err != nil {
		t.Fatal(err)
	}
	if sessions != 0 || coupons != 0 {
		t.Errorf("after resolve: the session is there %d times, %d coupons; want it ended and none", sessions, coupons)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Error("the lost session still answers")
	}

	conn, out, lost = lostAttempt(t, s, dbURL, "committed")
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	got, err := s.resolve(ctx, request{memberID: "committed", campaignID: "LOST"}, out, lost)
	if err != nil || got.Result != ResultIssued || got.CouponID != out.CouponID {
		t.Errorf("committed: %+v %v, want ISSUED with %s", got, err, out.CouponID)
	}
}
