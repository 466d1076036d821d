package issuance_test

import (
	"errors"
	"strings"
	"testing"

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
// PostgreSQL's millisecond.
func TestConfigFromEnvNamesTheRange(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"ISSUE_BATCH_MAX", "129", "1..128"},
		{"ISSUE_BUDGET", "10s", "840ms..3s"},
		{"ISSUE_LOCK_TIMEOUT", "500us", "1ms..3s"},
		{"ISSUE_STATEMENT_TIMEOUT", "1h", "1ms..3s"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			_, err := issuance.ConfigFromEnv()
			if err == nil || !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ConfigFromEnv: %v, want an error naming %s and %s", err, tc.name, tc.want)
			}
		})
	}
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
