package issuance_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/mops/coupon-api/shared/envconf"
	"github.com/mops/coupon-api/shared/issuance"
)

// TestConfigFromEnvRefusesZero: ISSUE_LOCK_TIMEOUT=0s (PostgreSQL's "wait forever"),
// ISSUE_BUDGET=0s and ISSUE_STATEMENT_TIMEOUT=0s, or below zero, are refused with the
// variable's name, never replaced by the defaults.
func TestConfigFromEnvRefusesZero(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"ISSUE_LOCK_TIMEOUT", "0s"}, {"ISSUE_BUDGET", "0s"}, {"ISSUE_STATEMENT_TIMEOUT", "0s"},
		{"ISSUE_LOCK_TIMEOUT", "-1s"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			_, err := issuance.ConfigFromEnv()
			if err == nil || !strings.Contains(err.Error(), tc.name) {
				t.Errorf("ConfigFromEnv: %v, want an error naming %s", err, tc.name)
			}
		})
	}
	cfg, err := issuance.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LockTimeout != issuance.DefaultLockTimeout || cfg.Budget != issuance.DefaultBudget ||
		cfg.StatementTimeout != issuance.DefaultStatementTimeout {
		t.Errorf("unset: %s, want the defaults", cfg)
	}
}

// TestConfigFromEnvNamesTheRange: a value beyond what the code and PostgreSQL hold is refused at
// start-up with the variable's name and its range: a batch beyond MaxBatchMax, a timeout below
// PostgreSQL's millisecond. The broken variant, unboundedConfigFromEnv, reads each setting
// without its bound, as before issue 29: the check must refuse it on every value.
func TestConfigFromEnvNamesTheRange(t *testing.T) {
	for _, broken := range []bool{false, true} {
		read := issuance.ConfigFromEnv
		if broken {
			read = unboundedConfigFromEnv
		}
		for _, tc := range []struct{ name, value, want string }{
			{"ISSUE_BATCH_MAX", "129", "1..128"},
			{"ISSUE_BUDGET", "10s", "840ms..3s"},
			{"ISSUE_LOCK_TIMEOUT", "500us", "1ms..3s"},
			{"ISSUE_STATEMENT_TIMEOUT", "1h", "1ms..3s"},
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

// unboundedConfigFromEnv is [issuance.ConfigFromEnv] with each setting parsed without its bound
// (envconf.Int and envconf.Duration in place of IntIn and DurationIn), as before issue 29.
func unboundedConfigFromEnv() (issuance.Config, error) {
	var c issuance.Config
	var errs [5]error
	errs[0] = issuance.RefuseMonthlyCapEnv()
	c.Budget, errs[1] = envconf.Duration("ISSUE_BUDGET", issuance.DefaultBudget)
	c.LockTimeout, errs[2] = envconf.Duration("ISSUE_LOCK_TIMEOUT", issuance.DefaultLockTimeout)
	c.StatementTimeout, errs[3] = envconf.Duration("ISSUE_STATEMENT_TIMEOUT", issuance.DefaultStatementTimeout)
	c.BatchMax, errs[4] = envconf.Int("ISSUE_BATCH_MAX", issuance.DefaultBatchMax)
	if err := errors.Join(errs[:]...); err != nil {
		return c, fmt.Errorf("issuance: %w", err)
	}
	c = c.WithDefaults()
	return c, c.Validate()
}

// TestConfigFromEnvRefusesMonthlyCap: IssueCoupon with MONTHLY_CAP_YEN still set, to any value
// (the default's, an empty one), is refused at start-up, naming the verb that sets the cap
// now: the database's cap binds every instance alike.
func TestConfigFromEnvRefusesMonthlyCap(t *testing.T) {
	for _, v := range []string{"2000", "1000000", ""} {
		t.Setenv("MONTHLY_CAP_YEN", v)
		_, err := issuance.ConfigFromEnv()
		if !errors.Is(err, issuance.ErrMonthlyCapEnv) || !strings.Contains(err.Error(), "couponctl rules set") {
			t.Errorf("MONTHLY_CAP_YEN=%q: %v, want ErrMonthlyCapEnv naming couponctl rules set", v, err)
		}
	}
}
