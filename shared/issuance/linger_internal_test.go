package issuance

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// lingerer is a request of the coalescer's protocol alone ([waiter]), answered by its group's
// run with the ids of the group.
type lingerer struct {
	id, camp string
	dueAt    time.Time
	answer   chan string
	lead     chan []*lingerer
}

func newLingerer(id string) *lingerer {
	return &lingerer{id: id, camp: "HOT", dueAt: time.Now().Add(time.Hour), answer: make(chan string, 1), lead: make(chan []*lingerer, 1)}
}

func (l *lingerer) campaign() string         { return l.camp }
func (l *lingerer) due() time.Time           { return l.dueAt }
func (l *lingerer) context() context.Context { return context.Background() }
func (l *lingerer) answers() chan string     { return l.answer }
func (l *lingerer) leads() chan []*lingerer  { return l.lead }
func (l *lingerer) quit(error)               { l.answer <- "quit" }
func groupIDs(group []*lingerer) string {
	ids := make([]string, len(group))
	for i, l := range group {
		ids[i] = l.id
	}
	return strings.Join(ids, "+")
}

// lingerBench is a coalescer whose runs wait for a gate while gated and record their groups.
type lingerBench struct {
	co     *coalescer[*lingerer, string]
	mu     sync.Mutex
	groups []string
	gate   chan struct{}
}

func (b *lingerBench) run(group []*lingerer) {
	b.mu.Lock()
	b.groups = append(b.groups, groupIDs(group))
	gate := b.gate
	b.mu.Unlock()
	if gate != nil {
		<-gate
	}
	for _, l := range group {
		l.answer <- groupIDs(group)
	}
}

// send starts l through the coalescer and returns its answer's channel.
func (b *lingerBench) send(l *lingerer) <-chan string {
	out := make(chan string, 1)
	go func() { out <- b.co.do(l, b.run) }()
	return out
}

// waitFor waits until cond holds under the coalescer's lock.
func (b *lingerBench) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		b.co.mu.Lock()
		ok := cond()
		b.co.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}

// queuedHot is how many requests wait in HOT's queue (0 when idle); called with the lock held.
func (b *lingerBench) queuedHot() int {
	if q := b.co.queues["HOT"]; q != nil {
		return len(q.waiting)
	}
	return -1
}

// TestHotLeaderLingersForItsInstancesShare: once a campaign had a group of 3 (it is hot), a
// request that finds it idle waits before its call for the 2 more its instance had, and the 3 go
// as one call. The linger is long here (a minute, and the last call as long), so the test ends
// only because the group fills up: no clock decides it. The coalescer without a linger (before issue 42, kept as the broken
// variant: linger 0) runs the first request alone and the other two as a second call: a lone
// request leading a group of one whenever its campaign's requests arrive spread out, as they do
// over many instances, the cost per coupon of coalescing off. Red against it.
func TestHotLeaderLingersForItsInstancesShare(t *testing.T) {
	for _, c := range []struct {
		name   string
		linger time.Duration
		want   []string
	}{
		{"linger", time.Minute, []string{"a", "b+c+d", "e+f+g"}},
		{"broken=no linger", 0, []string{"a", "b+c+d", "e", "f+g"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &lingerBench{co: newCoalescer[*lingerer, string](32, c.linger), gate: make(chan struct{})}
			// A call in flight with three waiting: the next group is of 3, HOT's peak.
			a := b.send(newLingerer("a"))
			b.waitFor(t, "a leads", func() bool { return b.queuedHot() == 0 })
			var rest []<-chan string
			for _, id := range []string{"b", "c", "d"} {
				rest = append(rest, b.send(newLingerer(id)))
				b.waitFor(t, id+" queues", func() bool { return b.queuedHot() == len(rest) })
			}
			b.mu.Lock()
			close(b.gate)
			b.gate = nil
			b.mu.Unlock()
			for _, ch := range append([]<-chan string{a}, rest...) {
				<-ch
			}
			b.waitFor(t, "HOT idle", func() bool { return b.queuedHot() == -1 })
			b.co.mu.Lock()
			if p := b.co.peaks["HOT"]; p.size != 3 {
				t.Errorf("HOT's peak %+v, want its group of 3", p)
			}
			// As if its last call took a minute: the leader's wait is not bounded by the call's
			// time here, only by the linger.
			b.co.peaks["HOT"] = peak{size: 3, at: time.Now(), call: time.Minute}
			b.co.mu.Unlock()
			// HOT is idle and hot: e comes first, f and g a moment later; the calls wait for the
			// gate, so that whatever waits behind e's is still waiting when g comes.
			b.mu.Lock()
			b.gate = make(chan struct{})
			b.mu.Unlock()
			e := b.send(newLingerer("e"))
			b.waitFor(t, "e leads", func() bool { return b.queuedHot() == 0 })
			f := b.send(newLingerer("f"))
			b.waitFor(t, "f waits", func() bool { return b.queuedHot() == 1 })
			g := b.send(newLingerer("g"))
			b.waitFor(t, "g placed", func() bool {
				b.mu.Lock()
				defer b.mu.Unlock()
				return slices.Contains(b.groups, "e+f+g") || b.queuedHot() == 2
			})
			close(b.gate)
			for _, ch := range []<-chan string{e, f, g} {
				<-ch
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			if !slices.Equal(b.groups, c.want) {
				t.Errorf("groups %v, want %v", b.groups, c.want)
			}
		})
	}
}

// TestLingerIsBounded: a hot campaign's leader whose instance has no other request of it goes
// alone once the linger is over, or once its last call's time is, when shorter; a campaign that
// was never hot does not wait at all (the lingers here would outlast the test).
func TestLingerIsBounded(t *testing.T) {
	b := &lingerBench{co: newCoalescer[*lingerer, string](32, 5*time.Millisecond)}
	b.co.peaks["HOT"] = peak{size: 8, at: time.Now()}
	if got := <-b.send(newLingerer("a")); got != "a" {
		t.Errorf("hot, alone: answered %q, want a group of a alone", got)
	}
	short := &lingerBench{co: newCoalescer[*lingerer, string](32, time.Hour)}
	short.co.peaks["HOT"] = peak{size: 8, at: time.Now(), call: time.Millisecond}
	if got := <-short.send(newLingerer("s")); got != "s" {
		t.Errorf("hot, alone, a short last call: answered %q, want s alone", got)
	}
	cold := &lingerBench{co: newCoalescer[*lingerer, string](32, time.Hour)}
	if got := <-cold.send(newLingerer("z")); got != "z" {
		t.Errorf("cold: answered %q, want z alone", got)
	}
	if len(cold.co.peaks) != 0 {
		t.Errorf("a group of one left a peak: %v", cold.co.peaks)
	}
}

// placed reports whether l is in HOT's queue or in a group that has started its run; called
// with the coalescer's lock held.
func (b *lingerBench) placed(id string) bool {
	if q := b.co.queues["HOT"]; q != nil && slices.ContainsFunc(q.waiting, func(l *lingerer) bool { return l.id == id }) {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.ContainsFunc(b.groups, func(g string) bool { return slices.Contains(strings.Split(g, "+"), id) })
}

// TestHandedOffGroupFillsUpToThePeak: on a campaign hot with a peak of 4, the group handOff gives
// the next leader (the two that queued during the last call) waits too, for the two more the
// peak says come, and the 4 go as one call. Every call waits for a gate, so the groups depend
// on the order of the requests alone, and the linger (a minute) never ends by the clock.
// Red against the coalescer before issue 42 (linger 0), whose calls take what queued during
// the last one: [a b+c+d+e+f g+h].
func TestHandedOffGroupFillsUpToThePeak(t *testing.T) {
	for _, c := range []struct {
		name   string
		linger time.Duration
		want   []string
	}{
		{"linger", time.Minute, []string{"a+b+c+d", "e+f+g+h"}},
		{"broken=no linger", 0, []string{"a", "b+c+d+e+f", "g+h"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g1 := make(chan struct{})
			b := &lingerBench{co: newCoalescer[*lingerer, string](32, c.linger), gate: g1}
			b.co.peaks["HOT"] = peak{size: 4, at: time.Now(), call: time.Minute}
			var answers []<-chan string
			send := func(id string) {
				answers = append(answers, b.send(newLingerer(id)))
				if id == "a" {
					b.waitFor(t, "a leads", func() bool { return b.queuedHot() >= 0 })
					return
				}
				b.waitFor(t, id+" placed", func() bool { return b.placed(id) })
			}
			for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
				send(id)
			}
			b.mu.Lock()
			b.gate = make(chan struct{})
			g2 := b.gate
			b.mu.Unlock()
			close(g1) // the first call returns: the next group is handed off
			b.waitFor(t, "the next group formed or lingering", func() bool {
				b.mu.Lock()
				defer b.mu.Unlock()
				return len(b.groups) == 2 || b.queuedHot() == 0
			})
			send("g")
			send("h")
			b.mu.Lock()
			b.gate = nil
			b.mu.Unlock()
			close(g2)
			for _, ch := range answers {
				<-ch
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			if !slices.Equal(b.groups, c.want) {
				t.Errorf("groups %v, want %v", b.groups, c.want)
			}
		})
	}
}
