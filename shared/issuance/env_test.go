package issuance_test

import (
	"strings"
	"testing"

	"github.com/mops/coupon-api/shared/issuance"
)

// TestConfigFromEnvRefusesZero: ISSUE_LOCK_TIMEOUT=0s (PostgreSQL's "wait forever"),
// ISSUE_BUDGET=0s, ISSUE_STATEMENT_TIMEOUT=0s and MONTHLY_CAP_YEN=0, or below zero, are refused
// with the variable's name, never replaced by the defaults.
func TestConfigFromEnvRefusesZero(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"ISSUE_LOCK_TIMEOUT", "0s"}, {"ISSUE_BUDGET", "0s"}, {"ISSUE_STATEMENT_TIMEOUT", "0s"},
		{"MONTHLY_CAP_YEN", "0"}, {"ISSUE_LOCK_TIMEOUT", "-1s"}, {"MONTHLY_CAP_YEN", "-2000"},
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
		cfg.MonthlyCapYen != issuance.DefaultMonthlyCapYen || cfg.StatementTimeout != issuance.DefaultStatementTimeout {
		t.Errorf("unset: %s, want the defaults", cfg)
	}
}
