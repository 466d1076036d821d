package main

import "testing"

// TestLogLevel: each shape of line the demo's log file holds is counted at its level, and the
// counts add up to the lines.
func TestLogLevel(t *testing.T) {
	t.Parallel()
	lines := map[string]string{
		`{"severity":"WARNING","message":"outbox: push failed"}`:                                              "WARN",
		`{"severity":"ERROR","message":"RelayOutbox: run failed"}`:                                            "ERROR",
		`{"severity":"INFO","message":"IssueCoupon"}`:                                                         "INFO",
		`{"severity":"CRITICAL","message":"x"}`:                                                               "ERROR",
		`{"time":"2026-09-21T10:00:00Z","level":"WARN","msg":"x"}`:                                            "WARN",
		`{"level":"ERROR+2","msg":"x"}`:                                                                       "ERROR",
		`2026/12/01 15:46:41 WARN outbox: push failed coupon_id=0364fecf attempt=1 err="LINE push: HTTP 429"`: "WARN",
		`2026/12/01 15:46:40 INFO IssueCoupon campaign=SW-C result=ISSUED`:                                    "INFO",
		`2026/12/01 15:46:40 ERROR RelayOutbox: run failed err="x"`:                                           "ERROR",
		`2026/12/01 15:46:40 DEBUG x`:                                                                         "DEBUG",
		`time=2026-12-01T15:46:40.000Z level=WARN msg="outbox: push failed"`:                                  "WARN",
		`Serving function: "IssueCoupon"`:                                                                     "",
		`2026/12/01 15:46:40 http: TLS handshake error from 127.0.0.1:1: EOF`:                                 "",
		`2026/12/01 15:46:40 INFORMATION about WARN things`:                                                   "",
	}
	var all []string
	for line, want := range lines {
		if got := logLevel(line); got != want {
			t.Errorf("logLevel(%q) = %q, want %q", line, got, want)
		}
		all = append(all, line)
	}
	if got, want := countLevels(all), "4 ERROR, 4 WARN, 2 INFO, 1 DEBUG, 3 without a level"; got != want {
		t.Errorf("countLevels = %q, want %q", got, want)
	}
}
