package issuance_test

import (
	"strconv"
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

// TestConfigFromEnvNamesTheRange: a value beyond what the code and PostgreSQL hold is refused at
// start-up with the variable's name and its range: a cap beyond int4 (3,000,000,000), or one
// whose sum with a coupon would overflow it (2^31-1), a batch beyond MaxBatchMax, a timeout
// below PostgreSQL's millisecond. The largest cap is taken.
func TestConfigFromEnvNamesTheRange(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"MONTHLY_CAP_YEN", "3000000000", "1..1000000000"},
		{"MONTHLY_CAP_YEN", "2147483647", "1..1000000000"},
		{"MONTHLY_CAP_YEN", "1000000001", "1..1000000000"},
		{"MONTHLY_CAP_YEN", "99999999999999999999", "64 bits"},
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
	t.Setenv("MONTHLY_CAP_YEN", strconv.Itoa(issuance.MaxMonthlyCapYen))
	if cfg, err := issuance.ConfigFromEnv(); err != nil || cfg.MonthlyCapYen != issuance.MaxMonthlyCapYen {
		t.Errorf("MONTHLY_CAP_YEN=%d: %v %v, want it taken", issuance.MaxMonthlyCapYen, cfg.MonthlyCapYen, err)
	}
}
