package issuance

import (
	"context"
	"sync"
	"time"
)

// Coalescing (docs/design.md, "Coalescing a hot campaign") is flat combining per campaign, in
// each instance, with no timer. Every request is one member of a group that one call answers:
// an issuance's group one call of issue_coupons_batch_v3 ([Service.run]), a dry run's one call of
// issue_dry_run_batch ([Service.runDry]), each kind through a coalescer of its own, so that a dry
// run never waits behind an issuance's call nor an issuance behind a dry run's. The coalescer
// decides the groups. Its protocol, written only here:
//
//   - join: a request whose campaign has no call in flight marks one and leads a group of
//     itself; any other request of the campaign waits in the campaign's queue.
//   - The leader of a group, and only it, runs the group ([coalescer.lead]) and then calls
//     handOff, exactly once, deferred, so that a panic in the run hands the campaign on too.
//   - handOff, under the lock, empties the queue into the next group of at most max requests and
//     sends it to the group's first on its lead channel, which makes that request the next
//     leader; a queued request whose time cannot fit an attempt is answered RETRY_EXHAUSTED on
//     its answer channel instead; when nobody waits, the campaign is idle again.
//   - The run answers each member of its group on its answer channel once: every member, on
//     every path, a panic included.
//   - A queued request whose caller gives up or whose deadline passes leaves the queue (leave)
//     and answers itself; if handOff took it already, its answer or its group comes, within its
//     deadline, and it waits for that.
//
// So each answer channel gets at most one send, from handOff while the request is queued or from
// its group's run once it is taken, never both: handOff takes a request out of the queue in the
// same critical section as it sends to it. Each lead channel gets at most one send, from the one
// handOff that takes its request. Both channels have room for that one send, so no sender blocks.

// waiter is one request a coalescer queues: W is its own (pointer) type, A its answer's.
type waiter[W any, A any] interface {
	comparable
	campaign() string         // the campaign whose call in flight it waits behind
	due() time.Time           // its attempts' end
	context() context.Context // ends when its caller gives up or due passes
	answers() chan A          // its answer, once, with room for it
	leads() chan []W          // the group it is to lead, once, with room for it
	// quit answers it having done nothing, once it is out of the queue: RETRY_EXHAUSTED when
	// cause is nil (its time cannot fit an attempt) or context.DeadlineExceeded, else an error
	// wrapping cause (its caller gave up).
	quit(cause error)
}

// coalescer queues the requests of each campaign behind its call in flight.
type coalescer[W waiter[W, A], A any] struct {
	max    int
	mu     sync.Mutex
	queues map[string]*campaignQueue[W]
}

// campaignQueue is one campaign's: whether a call is in flight, and who waits for it.
type campaignQueue[W any] struct {
	waiting []W
}

func newCoalescer[W waiter[W, A], A any](max int) *coalescer[W, A] {
	return &coalescer[W, A]{max: max, queues: map[string]*campaignQueue[W]{}}
}

// join queues w behind its campaign's call in flight and reports false, or, when none is in
// flight, marks one and reports true: w leads a group of itself.
func (c *coalescer[W, A]) join(w W) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	q, busy := c.queues[w.campaign()]
	if !busy {
		c.queues[w.campaign()] = &campaignQueue[W]{}
		return true
	}
	q.waiting = append(q.waiting, w)
	return false
}

// leave takes w out of its queue and reports true, or reports false when it was already taken
// into a group (its answer, or the group to lead, will come).
func (c *coalescer[W, A]) leave(w W) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.queues[w.campaign()]
	if q == nil {
		return false
	}
	for i, x := range q.waiting {
		if x == w {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// handOff ends campaign's call in flight: the next group of at most max waiting requests is
// given to its first to lead, or, when none waits, the campaign is idle. A waiting request whose
// time cannot fit an attempt is answered RETRY_EXHAUSTED instead of joining, as its run would
// answer it.
func (c *coalescer[W, A]) handOff(campaign string) {
	c.mu.Lock()
	q := c.queues[campaign]
	var group, rest []W
	for _, w := range q.waiting {
		switch {
		case len(group) == c.max:
			rest = append(rest, w)
		case !fits(w.due(), 0):
			w.quit(nil)
		default:
			group = append(group, w)
		}
	}
	q.waiting = rest
	if len(group) == 0 {
		delete(c.queues, campaign) // nobody waits: the campaign is idle
	}
	c.mu.Unlock()
	if len(group) > 0 {
		group[0].leads() <- group
	}
}

// do answers w behind its campaign's call in flight, if any, following the protocol above: run
// runs a group and answers each of its members.
func (c *coalescer[W, A]) do(w W, run func([]W)) A {
	if c.join(w) {
		return c.lead(w, []W{w}, run)
	}
	select {
	case a := <-w.answers():
		return a
	case group := <-w.leads():
		return c.lead(w, group, run)
	case <-w.context().Done():
	}
	if c.leave(w) {
		w.quit(w.context().Err())
	}
	select { // its own answer, or taken into a group already
	case a := <-w.answers():
		return a
	case group := <-w.leads():
		return c.lead(w, group, run)
	}
}

// lead runs group, whose first is w, hands the campaign on, and returns w's answer.
func (c *coalescer[W, A]) lead(w W, group []W, run func([]W)) A {
	func() {
		defer c.handOff(w.campaign())
		run(group)
	}()
	return <-w.answers()
}

// fits reports whether an attempt still fits before deadline after waiting wait.
func fits(deadline time.Time, wait time.Duration) bool {
	return time.Until(deadline)-wait >= minAttemptTime+ServerMargin
}
