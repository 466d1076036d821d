package latencyproxy

import (
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// timer is a Linux timerfd on CLOCK_MONOTONIC (timerfd_create(2)), opened non-blocking so that
// os.NewFile registers it with the runtime's netpoller: a read parks the goroutine, not a thread,
// and the netpoller wakes it when the timer expires, with the kernel's high-resolution timer's
// precision instead of epoll_wait's milliseconds.
type timer struct {
	fd int      // for timerfd_settime; valid while f is open (f owns it)
	f  *os.File // never call f.Fd(): it would switch the descriptor to blocking mode
}

func newTimer() (*timer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("latencyproxy: timerfd_create: %w", err)
	}
	return &timer{fd: fd, f: os.NewFile(uintptr(fd), "timerfd")}, nil
}

// wakeLate is how late a goroutine runs again after its timer expired, learned from the timers'
// wake-ups, in nanoseconds: the thread's wake-up and the netpoller's hand-off tens of
// microseconds per wake (the package test logs the proxy's figures), more when the CPUs are
// busy. sleepUntil arms its timer that much early, so that on average it returns at
// its deadline. An exponentially weighted mean over all timers, each wake weighing
// 1/[wakeLateWeight], each clamped to [maxWakeLate].
var wakeLate atomic.Int64

const (
	wakeLateWeight = 8
	// maxWakeLate bounds one wake's lateness as learned: a wake delayed by preemption (a
	// millisecond or more on a busy machine) would otherwise make the next waits end early.
	maxWakeLate = 200 * time.Microsecond
)

// sleepUntil returns at deadline, or at once if it has passed. The timer is armed
// [wakeLate] before it (see there); setting it resets its expiration count, so an expiry left
// unread never ends a later sleep early.
func (t *timer) sleepUntil(deadline time.Time) error {
	armed := deadline.Add(-time.Duration(wakeLate.Load()))
	d := time.Until(armed)
	if d <= 0 {
		return nil
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	if err := unix.TimerfdSettime(t.fd, 0, &spec, nil); err != nil {
		return fmt.Errorf("latencyproxy: timerfd_settime: %w", err)
	}
	var expirations [8]byte // a read returns the expiry count, a uint64, once the timer expired
	if _, err := t.f.Read(expirations[:]); err != nil {
		return fmt.Errorf("latencyproxy: timerfd read: %w", err)
	}
	late := min(time.Since(armed), maxWakeLate)
	old := wakeLate.Load()
	wakeLate.Store(old + (late.Nanoseconds()-old)/wakeLateWeight)
	return nil
}

func (t *timer) Close() error { return t.f.Close() }
