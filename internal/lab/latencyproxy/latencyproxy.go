// Package latencyproxy is a TCP proxy on 127.0.0.1 that adds a fixed round-trip latency to every
// connection through it, so that a database client can be measured as if its database were a
// network hop away (`couponctl bench --rtt`). It is toxiproxy (github.com/Shopify/toxiproxy/v2)
// used as a library, with a toxic of its own, [Delay]: toxiproxy's stock "latency" toxic counts
// whole milliseconds and waits on a Go timer, and Go timers wake up late below a millisecond
// (the runtime sleeps in epoll_wait, whose timeout is in milliseconds). [Delay] waits on a Linux
// timerfd instead, which the runtime's netpoller watches like a socket, armed early by the
// wake-up latency it has learned. The package test measures the accuracy of the added round
// trip and logs it (docs/performance.md has the figures).
package latencyproxy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// Proxy is a running proxy. Its methods are safe for concurrent use.
type Proxy struct {
	proxy *toxiproxy.Proxy
	mu    sync.Mutex // serializes SetRTT
}

// Start listens on a free port of 127.0.0.1 and forwards every connection to target (host:port),
// adding rtt to each round trip (see [Proxy.SetRTT]). Errors: a negative rtt, a system without
// timerfd (Linux only), or the listen's.
func Start(target string, rtt time.Duration) (*Proxy, error) {
	t, err := newTimer()
	if err != nil {
		return nil, err
	}
	t.Close()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	tp := toxiproxy.NewProxy(srv, "latency", "127.0.0.1:0", target)
	if err := tp.Start(); err != nil {
		return nil, fmt.Errorf("latencyproxy: listen: %w", err)
	}
	p := &Proxy{proxy: tp}
	if err := p.SetRTT(rtt); err != nil {
		tp.Stop()
		return nil, err
	}
	return p, nil
}

// Addr is the proxy's listen address, 127.0.0.1:port.
func (p *Proxy) Addr() string { return p.proxy.Listen }

// SetRTT makes the added round trip d, for the connections open and the new ones: each direction
// is delayed by half of it (the odd nanosecond downstream). 0 adds nothing: the data only passes
// through the proxy. Change it between measurements: data in flight at the change may leave with
// the old delay or none. Errors: a negative d.
func (p *Proxy) SetRTT(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("latencyproxy: round trip %s: must not be negative", d)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.proxy.Toxics.ResetToxics(context.Background())
	if d == 0 {
		return nil
	}
	for _, half := range []struct {
		stream string
		delay  time.Duration
	}{{"upstream", d / 2}, {"downstream", d - d/2}} {
		body := fmt.Sprintf(`{"name": "rtt_%s", "type": %q, "stream": %q, "toxicity": 1, "attributes": {"delay_ns": %d}}`,
			half.stream, ToxicType, half.stream, half.delay.Nanoseconds())
		if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			p.proxy.Toxics.ResetToxics(context.Background())
			return fmt.Errorf("latencyproxy: %s delay: %w", half.stream, err)
		}
	}
	return nil
}

// Close stops listening and closes every connection through the proxy.
func (p *Proxy) Close() { p.proxy.Stop() }

// ToxicType is the toxiproxy type name of [Delay], registered when the package loads.
const ToxicType = "timerfd_delay"

func init() { toxics.Register(ToxicType, new(Delay)) }

// Delay is a toxiproxy toxic that delivers each chunk of one direction of a connection Nanos
// after the proxy read it, in order. Chunks that arrive back to back wait at the same time, not
// one after another: chunk i leaves at its arrival + the delay (toxiproxy stamps each chunk with
// the time it was read), or right after chunk i-1 if that is later.
type Delay struct {
	// Nanos is the delay in nanoseconds.
	Nanos int64 `json:"delay_ns"`
}

// chunkBuffer is how many chunks may wait in one direction of one connection: toxiproxy's own
// latency toxic's buffer (toxics/latency.go). With it full, the proxy stops reading that
// direction, and the chunks it reads afterwards are stamped late.
const chunkBuffer = 1024

// GetBufferSize sizes the channel of chunks waiting for this toxic (toxics.BufferedToxic).
func (*Delay) GetBufferSize() int { return chunkBuffer }

// Pipe delays the chunks of one direction of one connection until the connection closes or
// toxiproxy interrupts the toxic to change the chain. Unlike toxiproxy's guide for toxics, the
// wait itself is not interruptible: an interrupt waits for the chunk in hand, at most the delay,
// which spares every chunk a hand-off between goroutines on the measured path. When no timerfd
// can be made (the process ran out of file descriptors), the connection is dropped: its client
// sees a closed connection, never data passed without the delay.
func (t *Delay) Pipe(stub *toxics.ToxicStub) {
	tm, err := newTimer()
	if err != nil {
		drop(stub)
		return
	}
	defer tm.Close()
	delay := time.Duration(t.Nanos)
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if err := tm.sleepUntil(c.Timestamp.Add(delay)); err != nil {
				drop(stub)
				return
			}
			stub.Output <- c
		}
	}
}

// drop closes the stub's output, which closes the connection, and discards what still arrives
// until toxiproxy closes the input.
func drop(stub *toxics.ToxicStub) {
	stub.Close()
	for range stub.Input {
	}
}
