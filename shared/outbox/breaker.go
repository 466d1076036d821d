package outbox

import (
	"errors"
	"sync"
)

// breaker ends a run after a streak of outage failures ([PushError.Outage]): open after
// threshold of them in a row, while any other answer, refusals included, shows LINE is up and
// resets the streak. It only ever goes from closed to open: the next run starts with a breaker
// of its own.
//
// It is a counter rather than a circuit-breaker library (the relay used sony/gobreaker): within
// a run the breaker never half-opens, so gobreaker's timeout, half-open probes and generations
// never came into play, and what remained was this counter behind a wider API.
type breaker struct {
	threshold int
	mu        sync.Mutex
	streak    int
	open      bool
}

// isOpen reports whether the run must stop pushing.
func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// record counts one push's result, err from [Relay.push].
func (b *breaker) record(err error) {
	var pe *PushError
	outage := errors.As(err, &pe) && pe.Outage()
	b.mu.Lock()
	defer b.mu.Unlock()
	if !outage {
		b.streak = 0
		return
	}
	b.streak++
	if b.streak >= b.threshold {
		b.open = true
	}
}
