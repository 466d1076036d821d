package issuance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/mops/coupon-api/shared/backoff"
	"github.com/mops/coupon-api/shared/telemetry"
)

// Coalescing (docs/design.md, "Coalescing a hot campaign") is flat combining per campaign, in
// each instance, with no timer: a request whose campaign has no call in flight goes at once,
// alone; the requests that arrive while one is in flight wait for it, and when it returns the
// first of them runs them together as one call of issue_coupons_batch
// (schema/current/issue_coupons_batch.sql), then hands the campaign to the next group.

// coalescer queues the requests of each campaign behind its call in flight.
type coalescer struct {
	max    int
	mu     sync.Mutex
	queues map[string]*campaignQueue
}

// campaignQueue is one campaign's: whether a call is in flight, and who waits for it.
type campaignQueue struct {
	waiting []*joined
}

// joined is one request waiting for its campaign's call in flight.
type joined struct {
	ctx      context.Context // the request's: its span, for the outbox row's traceparent
	req      request
	couponID string    // made once: the same on every attempt of the batches it is in
	deadline time.Time // its attempts' end
	callEnd  time.Time // its whole call's end
	span     *issueSpan
	answer   chan answered  // its answer, once
	lead     chan []*joined // the group it is to run: it is the group's first
}

type answered struct {
	out Outcome
	err error
}

func newCoalescer(max int) *coalescer {
	return &coalescer{max: max, queues: map[string]*campaignQueue{}}
}

// join queues j behind its campaign's call in flight and reports false, or, when none is in
// flight, marks one and reports true: j goes alone, and hands the campaign on after.
func (c *coalescer) join(j *joined) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	q, busy := c.queues[j.req.campaignID]
	if !busy {
		c.queues[j.req.campaignID] = &campaignQueue{}
		return true
	}
	q.waiting = append(q.waiting, j)
	return false
}

// leave takes j out of its queue and reports true, or reports false when it was already taken
// into a group (its answer, or the group to run, will come).
func (c *coalescer) leave(j *joined) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.queues[j.req.campaignID]
	if q == nil {
		return false
	}
	for i, w := range q.waiting {
		if w == j {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// handOff ends campaign's call in flight: the next group of at most max waiting requests is
// given to its first to run, or, when none waits, the campaign is idle. A waiting request
// whose time cannot fit an attempt is answered RETRY_EXHAUSTED instead of joining, as it would
// be alone.
func (c *coalescer) handOff(campaign string) {
	c.mu.Lock()
	q := c.queues[campaign]
	var group, rest []*joined
	for _, j := range q.waiting {
		switch {
		case len(group) == c.max:
			rest = append(rest, j)
		case time.Until(j.deadline) < minAttemptTime+serverMargin:
			j.answer <- answered{out: Outcome{Result: ResultRetryExhausted}}
		default:
			group = append(group, j)
		}
	}
	q.waiting = rest
	if len(group) == 0 {
		delete(c.queues, campaign) // nobody waits: the campaign is idle
	}
	c.mu.Unlock()
	if len(group) > 0 {
		group[0].lead <- group
	}
}

// coalesced issues r behind its campaign's call in flight, if any (see the package's
// coalescing), and answers as [Service.alone] would.
func (s *Service) coalesced(ctx context.Context, r request, deadline, callEnd time.Time, span *issueSpan) (Outcome, error) {
	j := &joined{ctx: ctx, req: r, couponID: uuid.NewString(), deadline: deadline, callEnd: callEnd, span: span,
		answer: make(chan answered, 1), lead: make(chan []*joined, 1)}
	if s.co.join(j) {
		out, err := s.alone(ctx, r, deadline, callEnd, span)
		s.co.handOff(r.campaignID)
		return out, err
	}
	select {
	case a := <-j.answer:
		return a.out, a.err
	case group := <-j.lead:
		return s.runGroup(j, group)
	case <-ctx.Done():
	}
	if s.co.leave(j) {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return Outcome{Result: ResultRetryExhausted}, nil
		}
		return Outcome{}, fmt.Errorf("issuance: waiting for the campaign's call in flight: %w", ctx.Err())
	}
	// Taken into a group already: its answer comes within its deadline, or it runs the group.
	select {
	case a := <-j.answer:
		return a.out, a.err
	case group := <-j.lead:
		return s.runGroup(j, group)
	}
}

// runGroup runs group, whose first is j, as one batch (alone when it is one request), answers
// each of its requests, hands the campaign on, and returns j's answer.
func (s *Service) runGroup(j *joined, group []*joined) (Outcome, error) {
	if len(group) == 1 {
		out, err := s.alone(context.WithoutCancel(j.ctx), j.req, j.deadline, j.callEnd, j.span)
		s.co.handOff(j.req.campaignID)
		return out, err
	}
	s.batch(group)
	s.co.handOff(j.req.campaignID)
	a := <-j.answer
	return a.out, a.err
}

// member is one request of a batch, with its attempts so far.
type member struct {
	*joined
	attempts int
}

// batch runs group's requests as calls of issue_coupons_batch until each is answered: a member
// answered RETRY goes again in the next call; a call that failed with 40001, 40P01, 55P03, a
// lost connection or a statement_timeout goes again, with the same coupon ids, for the members
// whose time still fits an attempt (the others answer RETRY_EXHAUSTED, as alone); a call whose
// answer was lost is settled member by member. Each call's timeouts end with its tightest
// member's time.
func (s *Service) batch(group []*joined) {
	ctx, span := startBatch(group)
	defer span.End()
	telemetry.Global().RecordBatch(ctx, group[0].req.campaignID, len(group))
	pending := make([]*member, len(group))
	for i, j := range group {
		pending[i] = &member{joined: j}
	}
	contended, stalePlans := 0, 0
	for n := 1; len(pending) > 0; n++ {
		pending = s.dropLate(pending)
		if len(pending) == 0 {
			return
		}
		tightest := pending[0].deadline
		for _, m := range pending {
			tightest = earlier(tightest, m.deadline)
			m.attempts++
		}
		callCtx, cancel := context.WithDeadline(ctx, tightest)
		outs, err := s.batchAttempt(callCtx, pending, time.Until(tightest))
		cancel()
		var lost *answerLostError
		if errors.As(err, &lost) {
			pending = s.settleBatch(ctx, pending, lost)
			continue
		}
		step, cause := next(ctx, err) // ctx, never cancelled: a call past its deadline is a timeout
		switch step {
		case answer:
			pending = deliver(pending, outs)
			continue
		case fail:
			for _, m := range pending {
				m.answer <- answered{out: Outcome{Attempts: m.attempts}, err: fmt.Errorf("issuance: batch attempt %d: %w", n, cause)}
			}
			return
		case retryContended:
			if contended++; contended == MaxAttempts {
				for _, m := range pending {
					m.answer <- answered{out: Outcome{Result: ResultRetryExhausted, Attempts: m.attempts}}
				}
				return
			}
		case retryStalePlan:
			if stalePlans++; stalePlans > 1 {
				for _, m := range pending {
					m.answer <- answered{out: Outcome{Attempts: m.attempts}, err: fmt.Errorf("issuance: batch attempt %d: %w", n, cause)}
				}
				return
			}
			continue
		case giveUp, retryConnLost: // rolled back, or never sent: again, for whom time is left
		}
		time.Sleep(backoff.FullJitter(BackoffBase, BackoffCap, n))
	}
}

// dropLate answers RETRY_EXHAUSTED to the members whose time cannot fit another attempt, as
// [Service.alone] would, and returns the others.
func (s *Service) dropLate(pending []*member) []*member {
	kept := pending[:0]
	for _, m := range pending {
		if time.Until(m.deadline) < minAttemptTime+serverMargin {
			m.answer <- answered{out: Outcome{Result: ResultRetryExhausted, Attempts: m.attempts}}
			continue
		}
		kept = append(kept, m)
	}
	return kept
}

// deliver answers each member its outcome, and returns those answered RETRY.
func deliver(pending []*member, outs []Outcome) []*member {
	var again []*member
	for i, m := range pending {
		if outs[i].Result == resultRetry {
			again = append(again, m)
			continue
		}
		outs[i].Attempts = m.attempts
		m.answer <- answered{out: outs[i]}
	}
	return again
}

// settleBatch settles each member of a call whose answer was lost, on one connection, and returns
// the members whose coupon is not there (nothing was written: they go again).
func (s *Service) settleBatch(ctx context.Context, pending []*member, lost *answerLostError) []*member {
	callEnd := pending[0].callEnd
	for _, m := range pending {
		callEnd = earlier(callEnd, m.callEnd)
	}
	st, err := s.settle(ctx, lost, callEnd)
	if err != nil {
		for _, m := range pending {
			m.answer <- answered{out: Outcome{Attempts: m.attempts}, err: err}
		}
		return nil
	}
	defer st.close()
	var again []*member
	for _, m := range pending {
		out, err := st.lookup(m.req, m.couponID)
		if errors.As(err, new(*connLostError)) {
			again = append(again, m)
			continue
		}
		out.Attempts = m.attempts
		m.answer <- answered{out: out, err: err}
	}
	return again
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// resultRetry is issue_coupons_batch's answer for a member it could not finish in this call.
const resultRetry Result = "RETRY"

// batchAttempt is [Service.attempt] for the members of one batch: one call of
// issue_coupons_batch, pipelined behind its timeouts, in one round trip. It returns an outcome
// per member, in order, or an error as attempt does.
func (s *Service) batchAttempt(ctx context.Context, pending []*member, left time.Duration) ([]Outcome, error) {
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
	couponIDs, memberIDs, issuedAt, traces := make([]string, n), make([]string, n), make([]time.Time, n), make([]*string, n)
	for i, m := range pending {
		couponIDs[i], memberIDs[i], issuedAt[i], traces[i] = m.couponID, m.req.memberID, m.req.issuedAt, traceParent(m.ctx)
	}
	lockTimeout, statementTimeout := s.cfg.attemptTimeouts(left)
	outs := make([]Outcome, n)
	b := &pgx.Batch{}
	b.Queue(sqlTimeoutsSet, pgInterval(lockTimeout), pgInterval(statementTimeout))
	b.Queue(sqlIssueBatch, pending[0].req.campaignID, couponIDs, memberIDs, issuedAt, s.cfg.MonthlyCapYen, traces).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var i int
				var result string
				var coupon, reason *string
				var amount *int
				var expires *time.Time
				if err := rows.Scan(&i, &result, &coupon, &amount, &reason, &expires); err != nil {
					return err
				}
				if i < 1 || i > n {
					return fmt.Errorf("issuance: issue_coupons_batch answered for member %d of %d", i, n)
				}
				if Result(result) == resultRetry {
					outs[i-1] = Outcome{Result: resultRetry}
					continue
				}
				out, err := outcomeOf(pending[i-1].req, result, coupon, amount, reason)
				if err != nil {
					return err
				}
				out.ExpiresAt = expires
				outs[i-1] = out
			}
			return rows.Err()
		})
	err = conn.SendBatch(ctx, b).Close()
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		for i := range outs {
			if outs[i].Result == "" {
				return nil, fmt.Errorf("issuance: issue_coupons_batch gave no answer for member %d of %d", i+1, n)
			}
		}
		return outs, nil
	case errors.As(err, &pgErr) && pgErr.SeverityUnlocalized == "ERROR":
		return nil, err // the server ended the call with an error: rolled back
	case errors.As(err, &pgErr) && pgErr.SeverityUnlocalized == "FATAL", pgconn.SafeToRetry(err):
		return nil, beforeSend(ctx, err, true) // nothing committed (see attempt)
	}
	return nil, &answerLostError{err: err, session: sess}
}

// startBatch starts the span of one batch's calls, linked to each member's request span, and
// links each member's span to it.
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

// BatchSpanName is the name of the span around one batch's calls ([Config.BatchMax]); its calls
// (otelpgx's batch spans) are its children, and it links to each member's [SpanName] span.
const BatchSpanName = "issuance.Batch"
