package main

import (
	"errors"
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
		{[]string{"bench", "--clients", "8,32,8"}, "8 given twice"},
		{[]string{"bench", "--instances", "1", "--clients", "8,8"}, "8 given twice"},
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

// TestBenchRefusesModesThatDoNotCombine: flags of another mode than the one bench runs
// (--history, --instances or the default cells) are usage errors naming them, not ignored.
func TestBenchRefusesModesThatDoNotCombine(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--instances", "2", "--history", "100"}, "--history does not go with --instances"},
		{[]string{"bench", "--history", "10", "--format", "bogus", "--rtt", "5ms", "--sold-out", "--instances", "3"}, "--format"},
		{[]string{"bench", "--history", "10", "--rtt", "5ms", "--sold-out", "--instances", "3"}, "--rtt, --sold-out, --instances"},
		{[]string{"bench", "--instances", "1", "--dry-runs"}, "--instances does not go with --dry-runs"},
		{[]string{"bench", "--instances", "1", "--rtt", "1ms"}, "--instances does not go with --rtt"},
		{[]string{"bench", "--instances", "1", "--read-pool"}, "--read-pool"},
		{[]string{"bench", "--instances", "1", "--format", "csv"}, "--format"},
		{[]string{"bench", "--loads", "hot-1"}, "--loads: only with --instances"},
		{[]string{"bench", "--turns", "2"}, "--turns: only with --history"},
		{[]string{"bench", "--history", "10", "--keep-history"}, "set DATABASE_URL"},
	} {
		_, err := couponctl(c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want it to mention %q", c.args, err, c.want)
		}
		var usage usageError
		if !errors.As(err, &usage) {
			t.Errorf("%v: err %v is not a usage error (exit 2)", c.args, err)
		}
	}
}
