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

	"github.com/mops/coupon-api/internal/lab/latencyproxy"
)

// pings is how many round trips each median is taken over.
const pings = 400

// BenchmarkAddedRoundTrip measures the proxy's own accuracy on loopback sockets: an echo server
// behind it, pings of 8 bytes one at a time, the median round trip with 0.5 ms and 1 ms added
// against the median through the same proxy adding nothing (added-µs), and the direct round
// trip beside it (direct-µs).
//
//	go test -run '^$' -bench AddedRoundTrip ./internal/lab/latencyproxy
func BenchmarkAddedRoundTrip(b *testing.B) {
	echo := startEcho(b)
	p, err := latencyproxy.Start(echo, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	for _, want := range []time.Duration{500 * time.Microsecond, time.Millisecond} {
		b.Run(want.String(), func(b *testing.B) {
			if err := p.SetRTT(0); err != nil {
				b.Fatal(err)
			}
			direct, base := medianRTT(b, echo, pings), medianRTT(b, p.Addr(), pings)
			if err := p.SetRTT(want); err != nil {
				b.Fatal(err)
			}
			conn := dial(b, p.Addr())
			var rtts []time.Duration
			for b.Loop() { // ns/op: one ping's round trip through the proxy adding want
				rtts = append(rtts, ping(b, conn))
			}
			slices.Sort(rtts)
			b.ReportMetric(float64((rtts[len(rtts)/2] - base).Microseconds()), "added-µs")
			b.ReportMetric(float64(direct.Microseconds()), "direct-µs")
		})
	}
}

// TestChunksComeBackInOrderNeverEarly: messages sent about 1 ms apart through a 20 ms round trip
// come back in order, none of them sooner than 20 ms after it was sent, less the most the timer
// is armed early (MaxWakeLate): each chunk is held for its own delay however many others are in
// flight. (How much later a loaded machine wakes the
// proxy is the benchmark's to measure, not a test's.)
func TestChunksComeBackInOrderNeverEarly(t *testing.T) {
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
	conn := dial(t, p.Addr())
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
	for i := range messages {
		if d := arrived[i].Sub(sent[i]); d < rtt-latencyproxy.MaxWakeLate {
			t.Errorf("message %d: back after %s, sooner than the %s round trip: its delay was cut short", i, d, rtt)
		}
	}
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
func startEcho(t testing.TB) string {
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

func dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr) // TCP_NODELAY is Go's default
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// medianRTT is the median round trip of n 8-byte pings, one at a time, on a new connection to
// addr, after 20 unmeasured ones.
func medianRTT(t testing.TB, addr string, n int) time.Duration {
	t.Helper()
	conn := dial(t, addr)
	rtts := make([]time.Duration, 0, n)
	for i := range n + 20 {
		if d := ping(t, conn); i >= 20 {
			rtts = append(rtts, d)
		}
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2]
}

// ping sends 8 bytes on conn and returns how long they took to come back.
func ping(t testing.TB, conn net.Conn) time.Duration {
	t.Helper()
	buf := make([]byte, 8)
	t0 := time.Now()
	if _, err := conn.Write(buf); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(conn, buf); err != nil {
		t.Fatal(err)
	}
	return time.Since(t0)
}
