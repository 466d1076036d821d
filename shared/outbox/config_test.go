package outbox_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/shared/envconf"
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
// at start-up with the variable's name and its range. The broken variant,
// unboundedConfigFromEnv, reads each setting without its bound, as before issue 29: the check
// must refuse it on every value.
func TestConfigFromEnvNamesTheRange(t *testing.T) {
	t.Setenv("LINE_CHANNEL_ACCESS_TOKEN", "token")
	for _, broken := range []bool{false, true} {
		read := outbox.ConfigFromEnv
		if broken {
			read = unboundedConfigFromEnv
		}
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
			t.Run(fmt.Sprintf("broken=%v/%s=%s", broken, tc.name, tc.value), func(t *testing.T) {
				t.Setenv(tc.name, tc.value)
				_, err := read()
				refused := err != nil && strings.Contains(err.Error(), tc.name) && strings.Contains(err.Error(), tc.want)
				switch {
				case broken && refused:
					t.Errorf("the broken variant passed: %v", err)
				case broken:
					t.Logf("the broken variant: %v, not an error naming %s and %s", err, tc.name, tc.want)
				case !refused:
					t.Errorf("ConfigFromEnv: %v, want an error naming %s and %s", err, tc.name, tc.want)
				}
			})
		}
	}
}

// unboundedConfigFromEnv is [outbox.ConfigFromEnv] with each setting parsed without its bound
// (envconf.Int and envconf.Duration in place of IntIn and DurationIn), as before issue 29.
func unboundedConfigFromEnv() (outbox.Config, error) {
	c := outbox.Config{
		ChannelAccessToken: os.Getenv("LINE_CHANNEL_ACCESS_TOKEN"),
		BaseURL:            os.Getenv("LINE_API_BASE_URL"),
	}
	var errs []error
	intVar := func(p *int, name string, def int) {
		var err error
		*p, err = envconf.Int(name, def)
		errs = append(errs, err)
	}
	durationVar := func(p *time.Duration, name string, def time.Duration) {
		var err error
		*p, err = envconf.Duration(name, def)
		errs = append(errs, err)
	}
	var rate int
	intVar(&c.BatchSize, "RELAY_BATCH_SIZE", outbox.DefaultBatchSize)
	intVar(&c.Parallelism, "RELAY_PARALLELISM", outbox.DefaultParallelism)
	intVar(&rate, "RELAY_RATE_LIMIT", outbox.DefaultRateLimit)
	c.RateLimit = float64(rate)
	intVar(&c.MaxAttempts, "RELAY_MAX_ATTEMPTS", outbox.DefaultMaxAttempts)
	intVar(&c.BreakerFailures, "RELAY_BREAKER_FAILURES", outbox.DefaultBreakerFailures)
	durationVar(&c.PushTimeout, "RELAY_PUSH_TIMEOUT", outbox.DefaultPushTimeout)
	durationVar(&c.BatchTimeout, "RELAY_BATCH_TIMEOUT", outbox.DefaultBatchTimeout)
	durationVar(&c.MarkTimeout, "RELAY_MARK_TIMEOUT", outbox.DefaultMarkTimeout)
	durationVar(&c.Lease, "RELAY_LEASE", outbox.DefaultLease)
	durationVar(&c.RunBudget, "RELAY_RUN_BUDGET", outbox.DefaultRunBudget)
	durationVar(&c.RetryBase, "RELAY_RETRY_BASE", outbox.DefaultRetryBase)
	durationVar(&c.RetryCap, "RELAY_RETRY_CAP", outbox.DefaultRetryCap)
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("outbox: %w", err)
	}
	c = c.WithDefaults()
	return c, c.Validate()
}
