//go:build !linux

package latencyproxy

import (
	"errors"
	"time"
)

// timer exists only on Linux (timerfd); elsewhere [Start] refuses to run, so that the packages
// that import this one still build.
type timer struct{}

func newTimer() (*timer, error) {
	return nil, errors.New("latencyproxy: needs Linux (timerfd_create(2))")
}

func (*timer) sleepUntil(time.Time) error { return errors.New("latencyproxy: needs Linux") }

func (*timer) Close() error { return nil }
