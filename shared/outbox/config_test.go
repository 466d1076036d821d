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
