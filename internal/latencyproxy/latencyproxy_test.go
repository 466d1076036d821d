package latencyproxy_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/latencyproxy"
)

// pings is how many round trips each median is taken over.
const pings = 400

// tolerance is how far the median added round trip may be from the one asked for.
const tolerance = 250 * time.Microsecond

// tries is how many times a measurement is made before its figure counts as wrong. A loaded
// machine (a CI runner at a load average of 19 on 2 cores) wakes the proxy, the echo server and
// the pinging test late by more than the tolerance, at random: a measurement is taken again
// rather than failed, and a proxy that misses the figure every time, as one that serves its
// delays one after another or adds a Go timer's late wake-up to each, still fails.
const tries = 3

// TestAddedRoundTrip measures the proxy's own accuracy on loopback sockets: an echo server behind
// it, pings of 8 bytes one at a time, and the median round trip with 0.5 ms and 1 ms added
// against the median through the same proxy adding nothing. It logs every figure, the
// direct round trip and the proxy's own cost included.
func TestAddedRoundTrip(t *testing.T) {
	echo := startEcho(t)
	p, err := latencyproxy.Start(echo, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	for _, want := range []time.Duration{500 * time.Microsecond, time.Millisecond} {
		var misses []time.Duration
		for range tries {
			if err := p.SetRTT(0); err != nil {
				t.Fatal(err)
			}
			direct := medianRTT(t, echo)
			base := medianRTT(t, p.Addr())
			if err := p.SetRTT(want); err != nil {
				t.Fatal(err)
			}
			got := medianRTT(t, p.Addr())
			added := got - base
			t.Logf("rtt %s: median round trip of %d pings direct %s, through the proxy adding 0: %s, adding %s: %s, added %s (error %+d µs)",
				want, pings, direct, base, want, got, added, (added - want).Microseconds())
			if added >= want-tolerance && added <= want+tolerance {
				break
			}
			if misses = append(misses, added); len(misses) == tries {
				t.Errorf("rtt %s: added %v in %d measurements, want within %s of it", want, misses, tries, tolerance)
			}
		}
	}
}

// TestBackToBackChunksWaitTogether: messages sent about 1 ms apart through a 20 ms round trip
// come back in order, each 20 ms after it was sent or somewhat later (a busy machine wakes the
// proxy late), never 1.5 x 20 ms: delays served one after another would bring the last one back
// about 10 x 10 ms after it was sent.
func TestBackToBackChunksWaitTogether(t *testing.T) {
	const (
		rtt      = 20 * time.Millisecond
		messages = 10
		gap      = time.Millisecond // a Go timer's resolution: the sender parks, as a real client does
	)
	p, err := latencyproxy.Start(startEcho(t), rtt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	var late []string
	for try := range tries {
		if late = backToBack(t, p.Addr(), rtt, messages, gap); len(late) == 0 {
			return
		}
		t.Logf("measurement %d of %d: %v", try+1, tries, late)
	}
	for _, l := range late {
		t.Error(l)
	}
}

// backToBack sends messages 8-byte messages gap apart on a new connection to addr, a proxy at
// rtt, fails t for a message out of order or back too early, and returns those 1.5 x rtt late.
func backToBack(t *testing.T, addr string, rtt time.Duration, messages int, gap time.Duration) (late []string) {
	t.Helper()
	conn := dial(t, addr)
	sent := make([]time.Time, messages)
	received := make(chan error, 1)
	arrived := make([]time.Time, messages) // written by the reader, read after it reported
	go func() {
		buf := make([]byte, 8)
		for i := range messages {
			if _, err := io.ReadFull(conn, buf); err != nil {
				received <- err
				return
			}
			if n := binary.BigEndian.Uint64(buf); n != uint64(i) {
				received <- fmt.Errorf("message %d came back as message %d", n, i)
				return
			}
			arrived[i] = time.Now()
		}
		received <- nil
	}()
	for i := range messages {
		sent[i] = time.Now()
		if _, err := conn.Write(binary.BigEndian.AppendUint64(nil, uint64(i))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(gap)
	}
	if err := <-received; err != nil {
		t.Fatal(err)
	}
	back := make([]time.Duration, messages)
	for i := range back {
		back[i] = arrived[i].Sub(sent[i])
	}
	t.Logf("round trips of %d messages sent %s apart (the last %s after the first) at rtt %s: %v",
		messages, gap, sent[messages-1].Sub(sent[0]), rtt, back)
	for i, d := range back {
		switch {
		case d < rtt-tolerance: // never the machine's load: the delay was cut short
			t.Errorf("message %d: back after %s, want %s or a little more", i, d, rtt)
		case d >= rtt*3/2:
			late = append(late, fmt.Sprintf("message %d: back after %s, want %s or a little more", i, d, rtt))
		}
	}
	return late
}

// TestRefusesNegativeRTT: a negative round trip is an error, at start and later.
func TestRefusesNegativeRTT(t *testing.T) {
	echo := startEcho(t)
	if _, err := latencyproxy.Start(echo, -time.Millisecond); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("Start(-1ms): err %v, want it refused as negative", err)
	}
	p, err := latencyproxy.Start(echo, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.SetRTT(-time.Nanosecond); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("SetRTT(-1ns): err %v, want it refused as negative", err)
	}
}

// startEcho serves an echo on a free loopback port until t ends and returns its address.
func startEcho(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr) // TCP_NODELAY is Go's default
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// medianRTT is the median round trip of [pings] 8-byte pings, one at a time, on a new connection
// to addr, after 20 unmeasured ones.
func medianRTT(t *testing.T, addr string) time.Duration {
	t.Helper()
	conn := dial(t, addr)
	buf := make([]byte, 8)
	rtts := make([]time.Duration, 0, pings)
	for i := range pings + 20 {
		t0 := time.Now()
		if _, err := conn.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Fatal(err)
		}
		if i >= 20 {
			rtts = append(rtts, time.Since(t0))
		}
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2]
}
