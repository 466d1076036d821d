package issuance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Coalescing (docs/design.md, "Coalescing a hot campaign") is flat combining per campaign, in
// each instance, with no timer. Every request is one member of a group that [Service.run] issues
// as one call of issue_coupons_batch_v2; the coalescer decides the groups. Its protocol, written only
// here:
//
//   - join: a request whose campaign has no call in flight marks one and leads a group of
//     itself; any other request of the campaign waits in the campaign's queue.
//   - The leader of a group, and only it, runs the group ([Service.lead]) and then calls handOff,
//     exactly once, deferred, so that a panic in the run hands the campaign on too.
//   - handOff, under the lock, empties the queue into the next group of at most max requests and
//     sends it to the group's first on its lead channel, which makes that request the next
//     leader; a queued request whose time cannot fit an attempt is answered RETRY_EXHAUSTED on
//     its answer channel instead; when nobody waits, the campaign is idle again.
//   - The run answers each member of its group on its answer channel once ([joined.reply]): every
//     member, on every path, a panic included.
//   - A queued request whose caller gives up or whose deadline passes leaves the queue (leave)
//     and answers itself; if handOff took it already, its answer or its group comes, within its
//     deadline, and it waits for that.
//
// So each answer channel gets at most one send, from handOff while the request is queued or from
// its group's run once it is taken, never both: handOff takes a request out of the queue in the
// same critical section as it sends to it. Each lead channel gets at most one send, from the one
// handOff that takes its request. Both channels have room for that one send, so no sender blocks.

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

func newCoalescer(max int) *coalescer {
	return &coalescer{max: max, queues: map[string]*campaignQueue{}}
}

// join queues j behind its campaign's call in flight and reports false, or, when none is in
// flight, marks one and reports true: j leads a group of itself.
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
// into a group (its answer, or the group to lead, will come).
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
// given to its first to lead, or, when none waits, the campaign is idle. A waiting request whose
// time cannot fit an attempt is answered RETRY_EXHAUSTED instead of joining, as [Service.run]
// would answer it.
func (c *coalescer) handOff(campaign string) {
	c.mu.Lock()
	q := c.queues[campaign]
	var group, rest []*joined
	for _, j := range q.waiting {
		switch {
		case len(group) == c.max:
			rest = append(rest, j)
		case !fits(j.deadline, 0):
			j.reply(Outcome{Result: ResultRetryExhausted}, nil)
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

// coalesced issues j behind its campaign's call in flight, if any, following the protocol
// above, and returns its answer.
func (s *Service) coalesced(j *joined) (Outcome, error) {
	if s.co.join(j) {
		return s.lead(j, []*joined{j})
	}
	select {
	case a := <-j.answer:
		return a.out, a.err
	case group := <-j.lead:
		return s.lead(j, group)
	case <-j.ctx.Done():
	}
	if s.co.leave(j) {
		if errors.Is(j.ctx.Err(), context.DeadlineExceeded) {
			return Outcome{Result: ResultRetryExhausted}, nil
		}
		return Outcome{}, fmt.Errorf("issuance: waiting for the campaign's call in flight: %w", j.ctx.Err())
	}
	select { // taken into a group already
	case a := <-j.answer:
		return a.out, a.err
	case group := <-j.lead:
		return s.lead(j, group)
	}
}

// lead runs group, whose first is j, hands the campaign on, and returns j's answer.
func (s *Service) lead(j *joined, group []*joined) (Outcome, error) {
	func() {
		defer s.co.handOff(j.req.campaignID)
		s.run(group)
	}()
	a := <-j.answer
	return a.out, a.err
}

// fits reports whether an attempt still fits before deadline after waiting wait.
func fits(deadline time.Time, wait time.Duration) bool {
	return time.Until(deadline)-wait >= minAttemptTime+serverMargin
}
