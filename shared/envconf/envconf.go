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
