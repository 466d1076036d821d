package main

import (
	"strings"
	"testing"
)

// TestBenchAndScenarioRefuseBadInput: bad flags of `bench` and `sim --scenario` are refused with
// a message naming the flag, before any database is touched.
func TestBenchAndScenarioRefuseBadInput(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--clients", "0"}, "--clients"},
		{[]string{"bench", "--duration", "500ms"}, "--duration"},
		{[]string{"bench", "--format", "csv"}, "--format"},
		{[]string{"bench", "--rtt", "-1ms"}, "--rtt"},
		{[]string{"bench", "--rtt", "0,fast"}, "--rtt"},
		{[]string{"bench", "--rtt", "0.5ms,500us"}, "given twice"},
		{[]string{"bench", "--pgbench", "/nonexistent/pgbench", "--clients", "1"}, "pgbench not found"},
		{[]string{"bench", "--standby", "-1ms"}, "--standby"},
		{[]string{"bench", "--standby", "1ms"}, "unset DATABASE_URL"}, // a user's server gets no standby from bench
		{[]string{"sim", "--scenario", "cyber-monday"}, "--scenario"},
		{[]string{"sim", "--scenario", "black-friday", "--tap-gap", "1s"}, "--tap-gap"},
		{[]string{"sim", "--scenario", "black-friday", "--bf-instances", "1"}, "instances >= 2"},
		{[]string{"sim", "--scenario", "black-friday", "--strategies", "before"}, "unknown black-friday strategy"},
	} {
		_, err := couponctl(c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want it to mention %q", c.args, err, c.want)
		}
	}
}
