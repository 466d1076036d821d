package issuance

import (
	"context"
	"errors"
	"fmt"
	"time"
	_ "time/tzdata" // Asia/Tokyo must load on images without a zoneinfo database

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/shared/ids"
)

// Result is the outcome code callers branch on (docs/api.md, "IssueCoupon").
type Result string

// The results of one call. Only ResultIssued wrote anything.
const (
	ResultIssued            Result = "ISSUED"              // coupon, usage, budget and outbox row committed together
	ResultAlreadyIssued     Result = "ALREADY_ISSUED"      // R2: this member holds this campaign's coupon (double tap, re-send)
	ResultMonthlyCap        Result = "MONTHLY_CAP"         // R3 would be broken
	ResultBudgetExceeded    Result = "BUDGET_EXCEEDED"     // R1 would be broken
	ResultCampaignNotActive Result = "CAMPAIGN_NOT_ACTIVE" // outside starts_at..ends_at, past the coupons' fixed expiry, or paused: see [Outcome.Reason]
	ResultUnknownCampaign   Result = "UNKNOWN_CAMPAIGN"    // no such campaign
	ResultCouponVoided      Result = "COUPON_VOIDED"       // the member's coupon of the campaign was voided: see [Outcome.CouponID]
	ResultNotEligible       Result = "NOT_ELIGIBLE"        // an audience-only campaign whose audience lacks the member
	ResultRetryExhausted    Result = "RETRY_EXHAUSTED"     // contention or timeouts outlasted the budget; safe to re-send
)

// The reasons of CAMPAIGN_NOT_ACTIVE (docs/api.md), judged by issue_coupons_batch_v3 by its judge
// (campaign_judge) and on the campaign's budget stripes (campaign_inactive_reason, schema/current).
const (
	ReasonNotStarted = "NOT_STARTED" // before starts_at, or before the campaign's first release
	ReasonEnded      = "ENDED"       // at or after ends_at or coupons_expire_at, by the call's issue time or the stripe write's clock
	ReasonPaused     = "PAUSED"      // paused by an operator (couponctl campaign pause)
)

// Outcome is what one call did.
type Outcome struct {
	Result Result
	// CouponID is the issued coupon (ISSUED), the one the member already holds (ALREADY_ISSUED),
	// or the member's voided coupon (COUPON_VOIDED).
	CouponID string
	// ExpiresAt is when the coupon stops being valid (ISSUED, ALREADY_ISSUED), nil when its
	// campaign gives no validity.
	ExpiresAt *time.Time
	// AmountYen is the coupon's face value in yen (ISSUED).
	AmountYen int
	// Month is the Asia/Tokyo calendar month the coupon counts against, YYYY-MM (ISSUED): the
	// month of the instant the database stamped, never the service's clock.
	Month string
	// Reason says why the campaign is not active (CAMPAIGN_NOT_ACTIVE): [ReasonNotStarted],
	// [ReasonEnded] or [ReasonPaused].
	Reason string
	// NextReleaseAt is when the campaign's next scheduled release opens (BUDGET_EXCEEDED, and
	// CAMPAIGN_NOT_ACTIVE NOT_STARTED before its first release), nil when none is scheduled.
	NextReleaseAt *time.Time
	// Attempts is how many calls were sent or tried: at most [MaxAttempts] lost to
	// contention, more when connections failed (then the budget bounds them).
	Attempts int
}

// Tokyo is the time zone of the R3 calendar month (the member cap regulation counts in JST).
var Tokyo = mustLoad("Asia/Tokyo")

// Month returns the Asia/Tokyo calendar month of t as YYYY-MM.
func Month(t time.Time) string { return t.In(Tokyo).Format("2006-01") }

// Service issues coupons on a pgx pool. It is safe for concurrent use.
type Service struct {
	pool *pgxpool.Pool
	cfg  Config
	co   *coalescer[*joined, answered]       // the issuances'; nil when Config.BatchMax is 1
	dry  *coalescer[*dryJoined, dryAnswered] // the dry runs'; nil when Config.BatchMax is 1
	read *pgxpool.Pool                       // the dry runs' read pool ([Service.UseReadPool]); nil: the primary
	// withDeadline bounds each call by its group's tightest deadline: context.WithDeadline. A
	// test puts a broken variant in its place (onepath_internal_test.go).
	withDeadline func(context.Context, time.Time) (context.Context, context.CancelFunc)
}

// New returns a Service over pool, with cfg's zero fields defaulted. It refuses a cfg that
// [Config.Validate] rejects.
func New(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	svc := &Service{pool: pool, cfg: cfg, withDeadline: context.WithDeadline}
	if cfg.BatchMax > 1 {
		svc.co = newCoalescer[*joined, answered](cfg.BatchMax, HotLinger)
		svc.dry = newCoalescer[*dryJoined, dryAnswered](cfg.BatchMax, HotLinger)
	}
	return svc, nil
}

// Issue gives member memberID one coupon of campaign campaignID, or says why not.
//
// The request is a member of a group, alone or coalesced with the requests of its campaign that
// arrive while a call for it is in flight (docs/design.md, "Coalescing a hot campaign"; off when
// [Config.BatchMax] is 1). Each attempt is one call to PostgreSQL, one network round trip:
// issue_coupons_batch_v3 (schema/current/issue_coupons_batch_v3.sql), pipelined in autocommit
// behind the attempt's lock_timeout and statement_timeout. It takes the issue time from the
// database's clock and judges first (issue_judge, on the committed state), then takes its locks
// in the one order of docs/design.md, "Lock order", each write judging its rule on the row it
// writes. Attempts are run again by the issuance's retry policy, stated at [Service.run], which
// answers RETRY_EXHAUSTED, nothing written, when the request's time runs out first.
//
// When the call was sent but its answer lost, Issue settles it before answering (see
// [Service.settle]): ISSUED if the coupon was committed. The whole call ends inside the budget,
// every path included, a coalesced one too (see [attemptsEnd]).
//
// Errors: a wrapped [ids.ErrInvalid] for malformed ids, ctx's error when the caller gives up,
// [ErrOutcomeUnknown] when a lost answer cannot be settled, an error wrapping a panic of the call,
// and any other database error unretried (the caller answers 500).
func (s *Service) Issue(ctx context.Context, memberID, campaignID string) (Outcome, error) {
	return s.issue(ctx, memberID, campaignID, false)
}

// Grant is [Service.Issue] for `couponctl grant`, an operator's bulk grant, through
// grant_coupons_batch_v3 (00031_one_judge_one_clock.sql), never coalesced: the same rules, answers,
// retries, settlement and errors; the coupon records the database login that granted it. The
// pool's user must be in coupon_admin.
func (s *Service) Grant(ctx context.Context, memberID, campaignID string) (Outcome, error) {
	return s.issue(ctx, memberID, campaignID, true)
}

func (s *Service) issue(ctx context.Context, memberID, campaignID string, grant bool) (out Outcome, err error) {
	if err := ids.Request(memberID, campaignID); err != nil {
		return Outcome{}, err
	}
	callEnd := time.Now().Add(s.cfg.Budget)
	deadline := attemptsEnd(callEnd)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	req := request{memberID: memberID, campaignID: campaignID, grant: grant}
	ctx, span := startIssue(ctx, req)
	defer func() { span.end(ctx, out, err) }()
	j := &joined{ctx: ctx, req: req, couponID: newCouponID(), deadline: deadline, callEnd: callEnd, span: span,
		answer: make(chan answered, 1), lead: make(chan []*joined, 1)}
	if grant || s.co == nil {
		s.run([]*joined{j})
		a := <-j.answer
		return a.out, a.err
	}
	a := s.co.do(j, s.run)
	return a.out, a.err
}

// newCouponID is a new coupon's id: a UUIDv7, whose first 48 bits are the Unix time in
// milliseconds (google/uuid keeps them increasing within the process), so that issued_coupons'
// and notification_outbox's primary keys take each new coupon at their right edge instead of at
// a random leaf. Coupons of earlier releases keep their v4 ids; nothing reads the version.
func newCouponID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// step is the class of an attempt's outcome for a member: what the retry policy of
// [Service.run] does with it.
type step int

const (
	answer         step = iota // the attempt's outcome, or ErrOutcomeUnknown, is the answer
	fail                       // the caller went away, or an error that no retry mends (500)
	retryContended             // contention: 40001, 40P01, 55P03 (IsRetryable) or the answer RETRY
	retryConnLost              // a connection lost with nothing written
	retryTimeout               // 57014 or the call's deadline, nothing written
	retryStalePlan             // 0A000, a call prepared before a migration changed its result
)

// classify classifies the error of an attempt made under ctx, and returns, for a failure, its
// cause: ctx's error when the caller went away, else err.
func classify(ctx context.Context, err error) (step, error) {
	switch {
	case err == nil, errors.Is(err, ErrOutcomeUnknown):
		return answer, err
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fail, ctx.Err()
	case errors.As(err, new(*connLostError)):
		return retryConnLost, err // each dead pooled connection costs one round trip
	case isTimeout(err):
		return retryTimeout, err
	case IsRetryable(err):
		return retryContended, err
	case isStalePlan(err):
		return retryStalePlan, err
	}
	return fail, err
}

type request struct {
	memberID, campaignID string
	grant                bool // a bulk grant (Service.Grant): grant_coupons_batch_v3, not issue_coupons_batch_v3
}

// call is the statement of r's attempts.
func (r request) call() string {
	if r.grant {
		return sqlGrantBatch
	}
	return sqlIssueBatch
}

// session names the server session of a pooled connection: its pid and when it started.
type session struct {
	pid   uint32
	start time.Time
}

// sessionKey keys the [session] kept in a pooled connection's CustomData.
const sessionKey = "issuance.session"

// sessionOf returns conn's server session, read with [sqlBackendStart] on the connection's first
// attempt and kept on the connection: one round trip per connection, none per request.
func sessionOf(ctx context.Context, conn *pgxpool.Conn) (session, error) {
	data := conn.Conn().PgConn().CustomData()
	if s, ok := data[sessionKey].(session); ok {
		return s, nil
	}
	s := session{pid: conn.Conn().PgConn().PID()}
	if err := conn.QueryRow(ctx, sqlBackendStart).Scan(&s.start); err != nil {
		return s, err
	}
	data[sessionKey] = s
	return s, nil
}

// beforeSend classifies err, met before anything of the call was committed (closed: pgx closed
// the connection): a [connLostError] when the connection rather than the request failed and the
// caller still waits, else err itself. Nothing was written either way.
func beforeSend(ctx context.Context, err error, closed bool) error {
	if ctx.Err() == nil && isConnLost(err, closed) {
		return &connLostError{err}
	}
	return err
}

// outcomeOf turns the call's result row into an [Outcome].
func outcomeOf(result string, coupon *string, amount *int, reason, month *string) (Outcome, error) {
	out := Outcome{Result: Result(result)}
	switch out.Result {
	case ResultIssued:
		if coupon == nil || amount == nil || month == nil {
			return Outcome{}, fmt.Errorf("issuance: ISSUED without a coupon id, an amount or a month")
		}
		out.CouponID, out.AmountYen, out.Month = *coupon, *amount, *month
	case ResultAlreadyIssued, ResultCouponVoided:
		if coupon == nil {
			return Outcome{}, fmt.Errorf("issuance: %s without the member's coupon id", result)
		}
		out.CouponID = *coupon
	case ResultCampaignNotActive:
		if !knownReason(reason) {
			return Outcome{}, fmt.Errorf("issuance: CAMPAIGN_NOT_ACTIVE without a reason")
		}
		out.Reason = *reason
	case ResultMonthlyCap, ResultBudgetExceeded, ResultUnknownCampaign, ResultNotEligible:
	default:
		return Outcome{}, fmt.Errorf("issuance: the call answered %q, not a result code", result)
	}
	return out, nil
}

// knownReason says reason is one of CAMPAIGN_NOT_ACTIVE's.
func knownReason(reason *string) bool {
	return reason != nil && (*reason == ReasonNotStarted || *reason == ReasonEnded || *reason == ReasonPaused)
}

// settlement is the connection of its own that settles lost answers: the lost call's session is
// over (ended), or could not be seen to be.
type settlement struct {
	ctx    context.Context
	cancel context.CancelFunc
	conn   *pgx.Conn
	ended  bool
	lost   *answerLostError
}

// settle opens the settlement's connection, on a context that ends at callEnd, the call's
// deadline (the attempts' deadline has often passed already), and makes sure the session of
// lost's call is over: if it still runs (the call is in flight or its Sync never arrived), it is
// terminated and waited for. Errors wrap [ErrOutcomeUnknown].
func (s *Service) settle(ctx context.Context, lost *answerLostError, callEnd time.Time) (*settlement, error) {
	st := &settlement{lost: lost}
	st.ctx, st.cancel = context.WithDeadline(context.WithoutCancel(ctx), callEnd)
	// A connection of its own, not one from the pool: under load every pooled connection may
	// be busy, and the look-up must not queue.
	// The network that lost the answer may be back a moment later: dial again until the call's
	// time is up.
	conn, err := pgx.ConnectConfig(st.ctx, settleConfig(s.pool))
	for err != nil && st.ctx.Err() == nil {
		time.Sleep(terminateStep)
		conn, err = pgx.ConnectConfig(st.ctx, settleConfig(s.pool))
	}
	if err != nil {
		st.cancel()
		return nil, st.unknown(err)
	}
	st.conn = conn
	// Terminate and wait in short steps, each re-reading whether the session still runs:
	// pg_terminate_backend itself only looks every 100 ms.
	deadline, _ := st.ctx.Deadline()
	for !st.ended && time.Until(deadline) > 2*terminateStep {
		err := conn.QueryRow(st.ctx, sqlSessionEnd, int64(lost.session.pid), lost.session.start, terminateStep.Milliseconds()).Scan(&st.ended)
		if err != nil {
			st.close()
			return nil, st.unknown(err)
		}
	}
	return st, nil
}

func (st *settlement) close() {
	st.conn.Close(context.WithoutCancel(st.ctx))
	st.cancel()
}

func (st *settlement) unknown(err error) error {
	return fmt.Errorf("%w: %v (after: %v)", ErrOutcomeUnknown, err, st.lost.err)
}

// lookup settles request r, whose lost call made coupon couponID: it looks up the coupon that
// holds (campaign_id, member_id):
//
//   - found, with the call's id: ISSUED, as the call would have answered;
//   - found, another id: ALREADY_ISSUED with that id;
//   - found, voided: COUPON_VOIDED with its id;
//   - absent, the session ended: nothing was written; a [connLostError], so the member goes again
//     while its time lasts.
//
// If the session's end could not be confirmed, or the look-up fails, it returns [ErrOutcomeUnknown].
func (st *settlement) lookup(r request, couponID string) (Outcome, error) {
	var existing, month string
	var amount int
	var voided bool
	var expires *time.Time
	err := st.conn.QueryRow(st.ctx, sqlCouponOf, r.campaignID, r.memberID).Scan(&existing, &amount, &voided, &expires, &month)
	switch {
	case errors.Is(err, pgx.ErrNoRows) && st.ended:
		return Outcome{}, &connLostError{st.lost.err}
	case errors.Is(err, pgx.ErrNoRows):
		return Outcome{}, st.unknown(fmt.Errorf("the session of backend %d still runs", st.lost.session.pid))
	case err != nil:
		return Outcome{}, st.unknown(err)
	case voided:
		return Outcome{Result: ResultCouponVoided, CouponID: existing}, nil
	case existing == couponID:
		return Outcome{Result: ResultIssued, CouponID: existing, AmountYen: amount, Month: month, ExpiresAt: expires}, nil
	}
	return Outcome{Result: ResultAlreadyIssued, CouponID: existing, ExpiresAt: expires}, nil
}

// settleConfig is pool's connection configuration for the settlement's own connection, with
// pgx's default reaction to a context's end (the connection's deadline set at once) in place of
// the pool's cancel-then-wait (shared/db): the settlement ends with the call's budget, not
// db.CancelGrace after it.
func settleConfig(pool *pgxpool.Pool) *pgx.ConnConfig {
	cfg := pool.Config().ConnConfig.Copy()
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	return cfg
}

// pgInterval formats d as a PostgreSQL duration setting in whole milliseconds, at least 1 ms
// (0 would mean "no timeout").
func pgInterval(d time.Duration) string {
	return fmt.Sprintf("%dms", max(1, d.Milliseconds()))
}

func mustLoad(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err) // time/tzdata is embedded, so this cannot fail
	}
	return loc
}
