package issuance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/campaign"
	"github.com/mops/coupon-api/internal/pgtest"
)

// lostAttempt makes one attempt's call for member on its own connection inside an open
// transaction, as a session whose pipeline's Sync never arrived sits idle in the call's
// transaction. It returns the connection and what the service knows of the lost answer.
func lostAttempt(t *testing.T, s *Service, dbURL, member string) (*pgx.Conn, *answerLostError) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	lost := &answerLostError{err: errors.New("answer lost"), couponID: uuid.NewString(), session: session{pid: conn.PgConn().PID()}}
	if err := conn.QueryRow(ctx, sqlBackendStart).Scan(&lost.session.start); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	var result string
	if err := conn.QueryRow(ctx, sqlIssue, lost.couponID, "LOST", member, time.Now(), s.cfg.MonthlyCapYen, nil).
		Scan(&result, nil, nil, nil, nil); err != nil || result != string(ResultIssued) {
		t.Fatalf("the call: %s %v, want ISSUED", result, err)
	}
	return conn, lost
}

// TestResolveTerminatesTheSession: a lost answer whose session is still open (a partition: the
// pipeline's Sync never arrived, the session sits idle in the call's transaction, holding its rows) is
// settled by terminating that session, which rolls the transaction back: resolve reports nothing
// written, and no session is left. A lost answer whose call did commit is answered ISSUED with
// its id. All of it as a user in coupon_issue, the function's role (00008_roles.sql, 00009).
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

	conn, lost := lostAttempt(t, s, dbURL, "open")
	_, err = s.resolve(ctx, request{memberID: "open", campaignID: "LOST"}, lost, time.Now().Add(ResolveTimeout))
	if !errors.As(err, new(*connLostError)) {
		t.Fatalf("session idle in its transaction: %v, want nothing written (a connection lost)", err)
	}
	var sessions, coupons int
	if err := owner.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_stat_activity WHERE pid = $1),
		(SELECT count(*) FROM issued_coupons)`, int64(lost.session.pid)).Scan(&sessions, &coupons); err != nil {
		t.Fatal(err)
	}
	if sessions != 0 || coupons != 0 {
		t.Errorf("after resolve: the session is there %d times, %d coupons; want it ended and none", sessions, coupons)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Error("the lost session still answers")
	}

	conn, lost = lostAttempt(t, s, dbURL, "committed")
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	got, err := s.resolve(ctx, request{memberID: "committed", campaignID: "LOST"}, lost, time.Now().Add(ResolveTimeout))
	if err != nil || got.Result != ResultIssued || got.CouponID != lost.couponID || got.AmountYen != 1000 {
		t.Errorf("committed: %+v %v, want ISSUED with %s, 1000 yen", got, err, lost.couponID)
	}
}
