package issuance

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/db"
)

// lostAttempt makes one attempt's call for member on its own connection inside an open
// transaction, as a session whose pipeline's Sync never arrived sits idle in the call's
// transaction. It returns the connection and what the service knows of the lost answer: the
// error, and the coupon id the call was given.
func lostAttempt(t *testing.T, s *Service, dbURL, member string) (*pgx.Conn, *answerLost) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	lost := &answerLost{answerLostError{err: errors.New("answer lost"), session: session{pid: conn.PgConn().PID()}}, uuid.NewString()}
	if err := conn.QueryRow(ctx, sqlBackendStart).Scan(&lost.session.start); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	var result string
	if err := conn.QueryRow(ctx, sqlIssueBatch, "LOST", []string{lost.couponID}, []string{member},
		[]*string{nil}).Scan(nil, &result, nil, nil, nil, nil, nil, nil); err != nil || result != string(ResultIssued) {
		t.Fatalf("the call: %s %v, want ISSUED", result, err)
	}
	return conn, lost
}

// answerLost is a lost answer and the coupon id its call was given.
type answerLost struct {
	answerLostError
	couponID string
}

// resolve settles request r's lost call as [Service.run] settles a group of one, by callEnd.
func (s *Service) resolve(ctx context.Context, r request, lost *answerLost, callEnd time.Time) (Outcome, error) {
	m := &member{joined: &joined{req: r, couponID: lost.couponID}}
	v := s.settleLost(ctx, []*member{m}, &lost.answerLostError, callEnd)[0]
	return v.out, v.err
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

	// The mechanism, not the budget: a deadline a loaded machine does not miss (the service gives
	// the look-up ResolveTimeout; CI, 2026-12-07, missed 300 ms under load).
	settle := func() time.Time { return time.Now().Add(time.Minute) }
	conn, lost := lostAttempt(t, s, dbURL, "open")
	_, err = s.resolve(ctx, request{memberID: "open", campaignID: "LOST"}, lost, settle())
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
	got, err := s.resolve(ctx, request{memberID: "committed", campaignID: "LOST"}, lost, settle())
	if err != nil || got.Result != ResultIssued || got.CouponID != lost.couponID || got.AmountYen != 1000 {
		t.Errorf("committed: %+v %v, want ISSUED with %s, 1000 yen", got, err, lost.couponID)
	}
}

// deadlines records the deadline of the context of each query it sees, by its SQL.
type deadlines struct {
	mu sync.Mutex
	of map[string][]time.Time
}

func (d *deadlines) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	deadline, _ := ctx.Deadline()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.of[data.SQL] = append(d.of[data.SQL], deadline)
	return ctx
}

func (*deadlines) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestSettlementEndsWithTheBudget: the settlement of a lost answer runs under the call's own end,
// not the attempts' nor a timeout of its own: every query of it has exactly callEnd as its
// deadline. And its connection reacts to that end as pgx does by default, setting the
// connection's deadline at once, not as the pool's connections do (shared/db: ask the server to
// cancel, then wait db.CancelGrace), which would let the settlement run past the budget.
func TestSettlementEndsWithTheBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	owner, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	if err := campaign.Create(ctx, owner, campaign.Campaign{ID: "LOST", DiscountYen: 1000, BudgetYen: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	rec := &deadlines{of: map[string][]time.Time{}}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = rec
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler { // as shared/db builds the pool
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: db.CancelGrace}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(pool, Config{})
	if err != nil {
		t.Fatal(err)
	}

	_, lost := lostAttempt(t, s, dbURL, "open")
	callEnd := time.Now().Add(time.Hour) // far: this settlement ends by its own work
	if _, err := s.resolve(ctx, request{memberID: "open", campaignID: "LOST"}, lost, callEnd); !errors.As(err, new(*connLostError)) {
		t.Fatalf("settlement: %v, want nothing written (a connection lost)", err)
	}
	for _, sql := range []string{sqlSessionEnd, sqlCouponOf} {
		got := rec.of[sql]
		if len(got) == 0 {
			t.Errorf("the settlement did not run %q", strings.TrimSpace(sql))
		}
		for _, d := range got {
			if !d.Equal(callEnd) {
				t.Errorf("%q ran with deadline %v, want the call's end %v", strings.TrimSpace(sql), d, callEnd)
			}
		}
	}

	conn, err := pgx.ConnectConfig(ctx, settleConfig(pool))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if h := settleConfig(pool).BuildContextWatcherHandler(conn.PgConn()); reflect.TypeOf(h) != reflect.TypeFor[*pgconn.DeadlineContextWatcherHandler]() {
		t.Errorf("the settlement's connection reacts to its context's end with %T, want *pgconn.DeadlineContextWatcherHandler", h)
	}
	if h := pool.Config().ConnConfig.BuildContextWatcherHandler(conn.PgConn()); reflect.TypeOf(h) == reflect.TypeFor[*pgconn.DeadlineContextWatcherHandler]() {
		t.Errorf("the pool's connections react with %T too: this test no longer tells them apart", h)
	}
}
