// Package envconf reads typed settings from environment variables, with defaults, and errors
// that name the variable and, for a bounded setting, its range.
package envconf

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Int returns the integer in env name, or def when it is unset or empty.
func Int(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%s=%q: an integer beyond %d bits", name, v, strconv.IntSize)
	} else if err != nil {
		return 0, fmt.Errorf("%s=%q: not an integer", name, v)
	}
	return n, nil
}

// Duration returns the duration in env name (Go syntax: "2.5s", "300ms"), or def when it is
// unset or empty.
func Duration(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: not a duration such as 2.5s or 300ms", name, v)
	}
	return d, nil
}

// Bool returns the boolean in env name (strconv.ParseBool), or false when it is unset or empty.
func Bool(name string) (bool, error) {
	v := os.Getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: not a boolean", name, v)
	}
	return b, nil
}

// IntIn is [Int] for a setting bounded to lo..hi: it refuses a value outside the range, naming
// it. An explicit value is judged as given, never taken for "unset": MONTHLY_CAP_YEN=0 fails at
// start-up rather than quietly becoming the default.
func IntIn(name string, def, lo, hi int) (int, error) {
	n, err := Int(name, def)
	if err != nil {
		return 0, fmt.Errorf("%w: must be in %d..%d", err, lo, hi)
	}
	if n < lo || n > hi {
		unset := fmt.Sprintf("the default %d", def)
		if def < lo { // a default that is not a value: the caller's own (DB_POOL_MAX_CONNS: pgx's)
			unset = "the default"
		}
		return 0, fmt.Errorf("%s=%q: must be in %d..%d (unset it for %s)", name, os.Getenv(name), lo, hi, unset)
	}
	return n, nil
}

// DurationIn is [Duration] for a setting bounded to lo..hi: it refuses a value outside the
// range, naming it. An explicit zero is judged as given, never taken for "unset": PostgreSQL,
// for one, reads lock_timeout=0 as "wait forever".
func DurationIn(name string, def, lo, hi time.Duration) (time.Duration, error) {
	d, err := Duration(name, def)
	if err != nil {
		return 0, fmt.Errorf("%w: must be in %s..%s", err, lo, hi)
	}
	if d < lo || d > hi {
		return 0, fmt.Errorf("%s=%q: must be in %s..%s (unset it for the default %s)", name, os.Getenv(name), lo, hi, def)
	}
	return d, nil
}
