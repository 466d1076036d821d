package issuance

import (
	"context"
	"sync"
	"time"
)

// Coalescing (docs/design.md, "Coalescing a hot campaign") is flat combining per campaign, in
// each instance, with one bounded timer: the linger of a hot campaign's leader. Every request is one member of a group that one call answers:
// an issuance's group one call of issue_coupons_batch_v3 ([Service.run]), a dry run's one call of
// issue_dry_run_batch ([Service.runDry]), each kind through a coalescer of its own, so that a dry
// run never waits behind an issuance's call nor an issuance behind a dry run's. The coalescer
// decides the groups. Its protocol, written only here:
//
//   - join: a request whose campaign has no call in flight marks one and leads a group of
//     itself; any other request of the campaign waits in the campaign's queue.
//   - linger: a campaign is hot while its largest group formed within [hotFor] (its peak) had
//     more than one request. The leader of a hot campaign's group smaller than the peak (a
//     request alone that found the campaign idle, or a group handOff gave it), before its run,
//     waits as long as the campaign's last call took, at most the coalescer's linger
//     ([HotLinger]), and only while an attempt of each member fits after it ([fits]), for the queue to
//     fill the group up to the peak (at most max), then takes the queue into its group as
//     handOff would. Each instance of a service sees only its share of a campaign's requests:
//     without the wait, each call takes what queued during the last, and the calls per coupon
//     follow the instance's share, not the campaign's load.
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

// HotLinger bounds how long the leader of a hot campaign's group waits for its instance's other
// requests of the campaign before its call (see the protocol above), far inside the 3 s budget;
// it waits no longer than the campaign's last call took (an issuance call: 1.4 ms,
// docs/performance.md).
const HotLinger = 10 * time.Millisecond

// hotFor is how long a campaign's peak group stays its peak without a group as large again.
const hotFor = time.Second

// coalescer queues the requests of each campaign behind its call in flight.
type coalescer[W waiter[W, A], A any] struct {
	max    int
	linger time.Duration // a hot campaign's leader's wait; 0 is none
	mu     sync.Mutex
	queues map[string]*campaignQueue[W]
	peaks  map[string]peak // the campaigns whose peak is above 1
}

// campaignQueue is one campaign's: whether a call is in flight, and who waits for it.
type campaignQueue[W any] struct {
	waiting []W
	want    int           // while its leader lingers: the requests it waits for
	full    chan struct{} // closed when want requests wait; nil when nobody lingers
}

// peak is a campaign's largest group since at, and how long its last call took.
type peak struct {
	size int
	at   time.Time
	call time.Duration
}

func newCoalescer[W waiter[W, A], A any](max int, linger time.Duration) *coalescer[W, A] {
	return &coalescer[W, A]{max: max, linger: linger, queues: map[string]*campaignQueue[W]{}, peaks: map[string]peak{}}
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
	if q.full != nil && len(q.waiting) >= q.want {
		close(q.full)
		q.full = nil
	}
	return false
}

// gather is the group w leads, group (whose first is w) as it is, or, when its campaign is hot
// (a peak above group's size) and an attempt of each member still fits after the linger, with
// the requests that queue within the linger, up to the peak's size in all.
func (c *coalescer[W, A]) gather(w W, group []W, hot peak) []W {
	linger := c.linger
	if hot.call > 0 {
		linger = min(linger, hot.call)
	}
	due := w.due()
	for _, m := range group {
		due = earlier(due, m.due())
	}
	if hot.size <= len(group) || linger <= 0 || !fits(due, linger) {
		if len(group) == 1 {
			c.formed(w.campaign(), 1)
		}
		return group
	}
	c.mu.Lock()
	q := c.queues[w.campaign()]
	q.want = min(hot.size, c.max) - len(group)
	full := make(chan struct{})
	if len(q.waiting) >= q.want {
		close(full)
	} else {
		q.full = full
	}
	c.mu.Unlock()
	t := time.NewTimer(linger)
	defer t.Stop()
	select {
	case <-full:
	case <-t.C:
	case <-w.context().Done(): // the run answers it as it answers a request alone whose caller left
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	q.full = nil
	return c.take(w.campaign(), q, group)
}

// hot is campaign's peak while it is hot, else the zero peak.
func (c *coalescer[W, A]) hot(campaign string) peak {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.peaks[campaign]; ok && time.Since(p.at) < hotFor {
		return p
	}
	return peak{}
}

// take moves q's waiting requests into group, up to max in all, and returns it: a request whose
// time cannot fit an attempt is answered RETRY_EXHAUSTED instead of joining, as its run would
// answer it. It notes the group's size in the campaign's peak. Called with mu held.
func (c *coalescer[W, A]) take(campaign string, q *campaignQueue[W], group []W) []W {
	var rest []W
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
	c.note(campaign, len(group))
	return group
}

// formed notes a group of size formed without the queue ([coalescer.note]).
func (c *coalescer[W, A]) formed(campaign string, size int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.note(campaign, size)
}

// note records a group of size of campaign in its peak: the new peak when at least as large,
// or when the peak is older than [hotFor] (dropped when the group is of one). Called with mu
// held; when many campaigns were hot once, the stale peaks are dropped.
func (c *coalescer[W, A]) note(campaign string, size int) {
	now := time.Now()
	p, ok := c.peaks[campaign]
	switch {
	case ok && size < p.size && now.Sub(p.at) < hotFor:
	case size > 1:
		c.peaks[campaign] = peak{size: size, at: now, call: p.call}
	case ok:
		delete(c.peaks, campaign)
	}
	if len(c.peaks) > maxPeaks {
		for id, p := range c.peaks {
			if now.Sub(p.at) >= hotFor {
				delete(c.peaks, id)
			}
		}
	}
}

// maxPeaks is how many campaigns' peaks a coalescer keeps before it drops the stale ones.
const maxPeaks = 1024

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

// handOff ends campaign's call in flight, which took took: the next group of at most max waiting requests is
// given to its first to lead ([coalescer.take]), or, when none waits, the campaign is idle.
func (c *coalescer[W, A]) handOff(campaign string, took time.Duration) {
	c.mu.Lock()
	if p, ok := c.peaks[campaign]; ok {
		p.call = took
		c.peaks[campaign] = p
	}
	q := c.queues[campaign]
	group := c.take(campaign, q, nil)
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
		return c.lead(w, c.gather(w, []W{w}, c.hot(w.campaign())), run)
	}
	select {
	case a := <-w.answers():
		return a
	case group := <-w.leads():
		return c.lead(w, c.gather(w, group, c.hot(w.campaign())), run)
	case <-w.context().Done():
	}
	if c.leave(w) {
		w.quit(w.context().Err())
	}
	select { // its own answer, or taken into a group already
	case a := <-w.answers():
		return a
	case group := <-w.leads():
		return c.lead(w, c.gather(w, group, c.hot(w.campaign())), run)
	}
}

// lead runs group, whose first is w, hands the campaign on, and returns w's answer.
func (c *coalescer[W, A]) lead(w W, group []W, run func([]W)) A {
	func() {
		start := time.Now()
		defer func() { c.handOff(w.campaign(), time.Since(start)) }()
		run(group)
	}()
	return <-w.answers()
}

// fits reports whether an attempt still fits before deadline after waiting wait.
func fits(deadline time.Time, wait time.Duration) bool {
	return time.Until(deadline)-wait >= minAttemptTime+ServerMargin
}
