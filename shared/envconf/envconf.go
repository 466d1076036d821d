// Package envconf reads typed settings from environment variables, with defaults, and errors
// that name the variable.
package envconf

import (
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
	if err != nil {
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

// PositiveInt is [Int] for a setting where zero or less has no meaning: it refuses an explicit
// value below 1 instead of taking it for "unset", so MONTHLY_CAP_YEN=0 fails at start-up rather
// than quietly becoming the default.
func PositiveInt(name string, def int) (int, error) {
	n, err := Int(name, def)
	if err == nil && n < 1 {
		return 0, fmt.Errorf("%s=%q: must be at least 1 (unset it for the default)", name, os.Getenv(name))
	}
	return n, err
}

// PositiveDuration is [Duration] for a setting where zero or less has no meaning: it refuses an
// explicit value at or below zero instead of taking it for "unset". PostgreSQL, for one, reads
// lock_timeout=0 as "wait forever".
func PositiveDuration(name string, def time.Duration) (time.Duration, error) {
	d, err := Duration(name, def)
	if err == nil && d <= 0 {
		return 0, fmt.Errorf("%s=%q: must be above zero (unset it for the default %s)", name, os.Getenv(name), def)
	}
	return d, err
}
