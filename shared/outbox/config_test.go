package outbox_test

import (
	"strings"
	"testing"

	"github.com/mops/coupon-api/shared/outbox"
)

// TestConfigFromEnvNewSettings reads the breaker setting, and refuses a retry
// cap that would let a row's retries outlast LINE's retry-key window.
func TestConfigFromEnvNewSettings(t *testing.T) {
	t.Setenv("LINE_CHANNEL_ACCESS_TOKEN", "t")
	t.Setenv("RELAY_BREAKER_FAILURES", "4")
	c, err := outbox.ConfigFromEnv()
	if err != nil || c.BreakerFailures != 4 {
		t.Errorf("ConfigFromEnv: %+v, %v; want 4 failures", c, err)
	}
	t.Setenv("RELAY_RETRY_CAP", "23h")
	if _, err := outbox.ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), "retry-key window") {
		t.Errorf("retry cap 23h: %v, want refused", err)
	}
}

// TestConfigFromEnvRefusesZero: an explicit 0 is refused, never taken for "unset", except for
// the retry waits, where 0s means "retry on the next run".
func TestConfigFromEnvRefusesZero(t *testing.T) {
	t.Setenv("LINE_CHANNEL_ACCESS_TOKEN", "token")
	for _, name := range []string{"RELAY_BATCH_SIZE", "RELAY_PARALLELISM", "RELAY_RATE_LIMIT", "RELAY_MAX_ATTEMPTS",
		"RELAY_BREAKER_FAILURES", "RELAY_PUSH_TIMEOUT", "RELAY_BATCH_TIMEOUT", "RELAY_MARK_TIMEOUT", "RELAY_LEASE", "RELAY_RUN_BUDGET"} {
		t.Run(name, func(t *testing.T) {
			value := "0"
			if strings.HasSuffix(name, "TIMEOUT") || name == "RELAY_LEASE" || name == "RELAY_RUN_BUDGET" {
				value = "0s"
			}
			t.Setenv(name, value)
			if _, err := outbox.ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%s: %v, want refused naming it", name, value, err)
			}
		})
	}
	t.Setenv("RELAY_RETRY_BASE", "0s")
	t.Setenv("RELAY_RETRY_CAP", "0s")
	if c, err := outbox.ConfigFromEnv(); err != nil || c.RetryBase != 0 || c.RetryCap != 0 {
		t.Errorf("RELAY_RETRY_BASE=0s RELAY_RETRY_CAP=0s: %+v, %v; want both 0 (retry on the next run)", c, err)
	}
}

// TestConfigFromEnvNamesTheRange: a value beyond what the relay and PostgreSQL hold is refused
// at start-up with the variable's name and its range.
func TestConfigFromEnvNamesTheRange(t *testing.T) {
	t.Setenv("LINE_CHANNEL_ACCESS_TOKEN", "token")
	for _, tc := range []struct{ name, value, want string }{
		{"RELAY_BATCH_SIZE", "1000000", "1..1000"},
		{"RELAY_PARALLELISM", "100000", "1..200"},
		{"RELAY_RATE_LIMIT", "3000", "1..2000"},
		{"RELAY_MAX_ATTEMPTS", "3000000000", "1..100"},
		{"RELAY_BREAKER_FAILURES", "1001", "1..1000"},
		{"RELAY_PUSH_TIMEOUT", "500us", "1ms..1h0m0s"},
		{"RELAY_RUN_BUDGET", "2h", "1ms..1h0m0s"},
		{"RELAY_LEASE", "48h", "1ms..23h0m0s"},
		{"RELAY_RETRY_BASE", "-1s", "0s..23h0m0s"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			if _, err := outbox.ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ConfigFromEnv: %v, want an error naming %s and %s", err, tc.name, tc.want)
			}
		})
	}
}
