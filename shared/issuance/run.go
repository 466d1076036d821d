package issuance

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/mops/coupon-api/shared/backoff"
	"github.com/mops/coupon-api/shared/telemetry"
)

// joined is one request: a member of the group that issues it, alone or coalesced.
type joined struct {
	ctx      context.Context // the request's: its deadline (the attempts' end), its span, its traceparent
	req      request
	couponID string    // made once: the same on every attempt of the calls it is in
	deadline time.Time // its attempts' end
	callEnd  time.Time // its whole call's end
	span     *issueSpan
	answer   chan answered  // its answer, once
	lead     chan []*joined // the group it is to lead, once: it is the group's first
	answered bool           // its answer was sent (by the one goroutine that may answer it)
}

type answered struct {
	out Outcome
	err error
}

// reply sends j its answer, unless it has one already.
func (j *joined) reply(out Outcome, err error) {
	if j.answered {
		return
	}
	j.answered = true
	j.answer <- answered{out: out, err: err}
}

// A request as the issuance's coalescer queues it ([waiter]), and its answer on a panic (answerPanic).
func (j *joined) campaign() string         { return j.req.campaignID }
func (j *joined) due() time.Time           { return j.deadline }
func (j *joined) context() context.Context { return j.ctx }
func (j *joined) answers() chan answered   { return j.answer }
func (j *joined) leads() chan []*joined    { return j.lead }
func (j *joined) fail(err error)           { j.reply(Outcome{}, err) }
func (j *joined) quit(cause error) {
	if cause == nil || errors.Is(cause, context.DeadlineExceeded) {
		j.reply(Outcome{Result: ResultRetryExhausted}, nil)
		return
	}
	j.reply(Outcome{}, fmt.Errorf("issuance: waiting for the campaign's call in flight: %w", cause))
}

// member is one request of a group being run, with its attempts so far.
type member struct {
	*joined
	attempts   int
	contended  int // attempts lost to contention (retryContended)
	stalePlans int // attempts lost to 0A000
}

// errPanicked wraps a panic in a group's run: each member is answered it (500).
var errPanicked = errors.New("issuance: the call panicked")

// run issues group's requests, all of one campaign (one request alone is a group of one), as
// calls of issue_coupons_batch_v3 (grant_coupons_batch_v3 for a grant) until each is answered, and
// answers each member once, on every path: a panic is answered to every member not yet answered
// as an error wrapping errPanicked.
//
// The issuance's retry policy is this, stated here alone and enforced by [classify], [act] and
// [pause]: one policy for every member, alone or coalesced, issued or granted. Only a failure the
// database rolled back, or that wrote nothing, is sent again:
//
//   - a call's answer is each member's answer; a member answered RETRY (issue_coupons_batch_v3
//     could not place it without waiting out of lock order) goes again, as contention;
//   - contention, SQLSTATE 40001 serialization_failure, 40P01 deadlock_detected or 55P03
//     lock_not_available ([IsRetryable]; the attempt's lock_timeout ends a lock wait as 55P03),
//     or the answer RETRY: again after a full-jitter wait, at most [MaxAttempts] (5) attempts
//     lost to contention per member, then RETRY_EXHAUSTED;
//   - a connection lost before the call was sent, a lost answer settled as nothing written
//     ([Service.settleLost]), or 57014 statement_timeout: again after a full-jitter wait, bounded
//     by the member's time alone (each dead pooled connection costs one round trip);
//   - 0A000, a call prepared before a migration changed its result: again at once, once;
//   - the caller gone (a group of one), or any other error: that error, never a blind retry
//     (500); a lost answer that cannot be settled: [ErrOutcomeUnknown] (500).
//
// The wait after failed attempt n is uniform in [0, min([BackoffCap], [BackoffBase] x 2^(n-1))),
// at most 10, 20, 40 and 80 ms before attempts 2 to 5 (full jitter, [backoff.FullJitter]; M.
// Brooker, "Exponential Backoff And Jitter"), so that members that failed together do not meet
// again together; none is taken after 0A000 alone. A member's time is its request's budget,
// ISSUE_BUDGET ([Config.Budget], 2.5 s by default, inside the app gateway's 3 s, [AppTimeout]),
// of which its attempts get what [attemptsEnd] leaves (docs/api.md, "The 3 s bound"). Every call
// ends by the deadline of the group's tightest member, its lock_timeout and statement_timeout
// derived from that member's time left ([Config.attemptTimeouts]), and a member is tried again,
// or waited for, only while an attempt still fits after the wait ([fits]); otherwise it is
// answered RETRY_EXHAUSTED: nothing was written, and the same request is safe to send again. A
// lost answer is settled by the group's earliest call end.
func (s *Service) run(group []*joined) {
	defer answerPanic(group)
	s.calls(group)
}

// calls is run's loop: the calls, and the answers of every member, on every path but a panic.
func (s *Service) calls(group []*joined) {
	ctx, end := s.callContext(group)
	defer end()
	pending := make([]*member, len(group))
	for i, j := range group {
		pending[i] = &member{joined: j}
	}
	for n := 1; len(pending) > 0; n++ {
		pending = dropLate(pending, 0)
		if len(pending) == 0 {
			return
		}
		var wait bool
		pending, wait = act(pending, s.try(ctx, pending, n))
		if wait {
			pending = pause(ctx, pending, n)
		}
	}
}

// answerPanic, deferred by a group's run ([Service.run], [Service.runDry]), answers every member
// of group not yet answered an error wrapping errPanicked when the run panicked.
func answerPanic[W interface{ fail(error) }](group []W) {
	r := recover()
	if r == nil {
		return
	}
	err := fmt.Errorf("%w: %v\n%s", errPanicked, r, debug.Stack())
	for _, j := range group {
		j.fail(err)
	}
}

// callContext is the context of group's calls: a request alone runs under its own (its deadline,
// its cancellation, its span as the calls' parent); a coalesced group's calls run under a span
// of their own, linked to each member's, and no member's cancellation ends the others' call. It
// returns the function that ends the group's span.
func (s *Service) callContext(group []*joined) (context.Context, func()) {
	if len(group) == 1 {
		return group[0].ctx, func() {}
	}
	ctx, span := startBatch(group)
	telemetry.Global().RecordBatch(ctx, group[0].req.campaignID, len(group))
	return ctx, func() { span.End() }
}

// verdict is what one attempt came to for one member: a step and, for [answer], the answer.
type verdict struct {
	step step
	out  Outcome
	err  error
}

// try makes attempt n, one call for pending, by its tightest member's deadline, and returns a
// verdict per member, in order. A lost answer is settled first (see [Service.settleLost]).
func (s *Service) try(ctx context.Context, pending []*member, n int) []verdict {
	tightest, callEnd := pending[0].deadline, pending[0].callEnd
	for _, m := range pending {
		tightest, callEnd = earlier(tightest, m.deadline), earlier(callEnd, m.callEnd)
		m.attempts++
	}
	callCtx, cancel := s.withDeadline(ctx, tightest)
	outs, err := s.attempt(callCtx, pending, time.Until(tightest))
	cancel()
	for _, m := range pending {
		m.span.attempted(n, err)
	}
	if IsRetryable(err) {
		telemetry.Global().RecordRetryableError(ctx, sqlState(err))
	}
	var lost *answerLostError
	if errors.As(err, &lost) {
		return s.settleLost(ctx, pending, lost, callEnd)
	}
	step, cause := classify(ctx, err) // ctx, not callCtx: a call past its deadline is a timeout
	verdicts := make([]verdict, len(pending))
	for i := range verdicts {
		switch {
		case err != nil:
			verdicts[i] = verdict{step: step, err: cause}
		case outs[i].Result == resultRetry:
			verdicts[i] = verdict{step: retryContended}
		default:
			verdicts[i] = verdict{step: answer, out: outs[i]}
		}
	}
	return verdicts
}

// settleLost settles each member of a call whose answer was lost (docs/api.md: never "nothing
// was written" for a coupon that exists), on one connection of its own, by callEnd (see
// [Service.settle] and [settlement.lookup]): a member whose coupon is there is answered as the
// call would have; one whose coupon is not goes again (nothing was written), unless ctx ended.
func (s *Service) settleLost(ctx context.Context, pending []*member, lost *answerLostError, callEnd time.Time) []verdict {
	verdicts := make([]verdict, len(pending))
	st, err := s.settle(ctx, lost, callEnd)
	if err != nil {
		for i := range verdicts {
			verdicts[i] = verdict{step: answer, err: err}
		}
		return verdicts
	}
	defer st.close()
	for i, m := range pending {
		out, err := st.lookup(m.req, m.couponID)
		step, cause := classify(ctx, err)
		verdicts[i] = verdict{step: step, out: out, err: cause}
	}
	return verdicts
}

// act answers each member whose verdict is final and returns the members that go again, and
// whether a wait comes first (not after 0A000 alone: there is no contention to wait out).
func act(pending []*member, verdicts []verdict) (again []*member, wait bool) {
	for i, m := range pending {
		v := verdicts[i]
		switch v.step {
		case answer:
			v.out.Attempts = m.attempts
			m.reply(v.out, v.err)
			continue
		case fail:
			m.reply(Outcome{Attempts: m.attempts}, fmt.Errorf("issuance: attempt %d: %w", m.attempts, v.err))
			continue
		case retryContended:
			if m.contended++; m.contended == MaxAttempts {
				m.reply(Outcome{Result: ResultRetryExhausted, Attempts: m.attempts}, nil)
				continue
			}
			wait = true
		case retryStalePlan:
			if m.stalePlans++; m.stalePlans > 1 {
				m.reply(Outcome{Attempts: m.attempts}, fmt.Errorf("issuance: attempt %d: %w", m.attempts, v.err))
				continue
			}
		case retryConnLost, retryTimeout:
			wait = true
		}
		again = append(again, m)
	}
	return again, wait
}

// pause waits the full-jitter time after attempt n for the members that go again, and returns
// them: a member whose time would not fit an attempt after the wait is answered RETRY_EXHAUSTED
// at once, and when none is left nobody waits. The wait ends early when ctx ends (a request
// alone whose caller went away: its next attempt fails at once with that).
func pause(ctx context.Context, pending []*member, n int) []*member {
	wait := backoff.FullJitter(BackoffBase, BackoffCap, n)
	if pending = dropLate(pending, wait); len(pending) == 0 {
		return nil
	}
	for _, m := range pending {
		m.span.waiting(wait)
	}
	select {
	case <-time.After(wait):
	case <-ctx.Done():
	}
	return pending
}

// dropLate answers RETRY_EXHAUSTED to the members whose time cannot fit an attempt after
// waiting wait, and returns the others.
func dropLate(pending []*member, wait time.Duration) []*member {
	kept := pending[:0]
	for _, m := range pending {
		if !fits(m.deadline, wait) {
			m.reply(Outcome{Result: ResultRetryExhausted, Attempts: m.attempts}, nil)
			continue
		}
		kept = append(kept, m)
	}
	return kept
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// resultRetry is issue_coupons_batch_v3's answer for a member it could not finish in this call.
const resultRetry Result = "RETRY"

// attempt runs one call for pending, all of one campaign: issue_coupons_batch_v3 (grant_coupons_batch_v3
// for a grant), pipelined behind its lock_timeout and statement_timeout (derived from left, the
// tightest member's time) in one round trip. It returns an outcome per member, in order (RETRY
// for a member to send again), or an error: a statement's (the call was rolled back), a
// [connLostError] when the connection failed before the call was sent, an [answerLostError] when
// the call was sent and its answer never came.
func (s *Service) attempt(ctx context.Context, pending []*member, left time.Duration) ([]Outcome, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, beforeSend(ctx, err, false)
	}
	defer conn.Release()
	sess, err := sessionOf(ctx, conn)
	if err != nil {
		return nil, beforeSend(ctx, err, conn.Conn().IsClosed())
	}
	n := len(pending)
	couponIDs, memberIDs, traces := make([]string, n), make([]string, n), make([]*string, n)
	for i, m := range pending {
		couponIDs[i], memberIDs[i], traces[i] = m.couponID, m.req.memberID, traceParent(m.ctx)
	}
	outs := make([]Outcome, n)
	b := &pgx.Batch{}
	s.cfg.QueueTimeouts(b, left)
	b.Queue(pending[0].req.call(), pending[0].req.campaignID, couponIDs, memberIDs, traces).
		Query(func(rows pgx.Rows) error { return scanAnswers(rows, pending, outs) })
	return outs, afterSend(ctx, conn.SendBatch(ctx, b).Close(), outs, sess)
}

// scanAnswers reads the call's answer rows into outs, one per member of pending, in order.
func scanAnswers(rows pgx.Rows, pending []*member, outs []Outcome) error {
	for rows.Next() {
		var i int
		var result string
		var coupon, reason, month *string
		var amount *int
		var expires, next *time.Time
		if err := rows.Scan(&i, &result, &coupon, &amount, &reason, &expires, &next, &month); err != nil {
			return err
		}
		if i < 1 || i > len(pending) {
			return fmt.Errorf("issuance: the call answered for member %d of %d", i, len(pending))
		}
		if Result(result) == resultRetry {
			outs[i-1] = Outcome{Result: resultRetry}
			continue
		}
		out, err := outcomeOf(result, coupon, amount, reason, month)
		if err != nil {
			return err
		}
		out.ExpiresAt, out.NextReleaseAt = expires, next
		outs[i-1] = out
	}
	return rows.Err()
}

// afterSend classifies err, the end of a call sent on session sess: nil when every member of
// outs has an answer, the server's error when the call was rolled back, a [connLostError] when
// nothing was committed, and an [answerLostError] when the call may have committed.
func afterSend(ctx context.Context, err error, outs []Outcome, sess session) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		for i := range outs {
			if outs[i].Result == "" {
				return fmt.Errorf("issuance: the call gave no answer for member %d of %d", i+1, len(outs))
			}
		}
		return nil
	case errors.As(err, &pgErr) && pgErr.SeverityUnlocalized == "ERROR":
		return err // the server ended the call with an error: rolled back
	case errors.As(err, &pgErr) && pgErr.SeverityUnlocalized == "FATAL", pgconn.SafeToRetry(err):
		// Nothing committed: the call never left, or the server ended the session before the
		// call's ReadyForQuery, which it sends as soon as the COMMIT is done, before it next
		// looks at a termination request (a terminated session, 57P01 on every pooled session of
		// a restart or failover; PostgreSQL 15 docs, 55.2.3 "Extended Query").
		return beforeSend(ctx, err, true)
	}
	// Anything else, even a plain "conn closed" or an immediate shutdown's bare end of stream,
	// is settled by a look-up: the call may have committed before its answer was lost.
	return &answerLostError{err: err, session: sess}
}

// startBatch starts the span of one coalesced group's calls, linked to each member's request
// span, and links each member's span to it.
func startBatch(group []*joined) (context.Context, trace.Span) {
	links := make([]trace.Link, len(group))
	for i, j := range group {
		links[i] = trace.Link{SpanContext: j.span.span.SpanContext()}
	}
	ctx, span := otel.Tracer(telemetry.ScopeName).Start(context.Background(), BatchSpanName, trace.WithLinks(links...),
		trace.WithAttributes(telemetry.AttrCampaign.String(group[0].req.campaignID), telemetry.AttrBatchSize.Int(len(group))))
	for _, j := range group {
		j.span.span.AddLink(trace.Link{SpanContext: span.SpanContext()})
	}
	return ctx, span
}

// BatchSpanName is the name of the span around one coalesced group's calls ([Config.BatchMax]);
// its calls (otelpgx's batch spans) are its children, and it links to each member's [SpanName]
// span. A request alone has none: its calls are children of its own span.
const BatchSpanName = "issuance.Batch"
