package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/lab/hotbench"
)

// TestBenchReadPoolRefusesBadInput: --read-pool needs --dry-runs, is not taken beside --standby,
// and adds a replica to bench's throwaway server only; each refusal names the flag.
func TestBenchReadPoolRefusesBadInput(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--read-pool"}, "add --dry-runs"},
		{[]string{"bench", "--read-pool", "--dry-runs", "--standby", "1ms"}, "not with --standby"},
	} {
		if _, err := couponctl(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want it to mention %q", c.args, err, c.want)
		}
	}
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
	if _, err := couponctl("bench", "--read-pool", "--dry-runs"); err == nil || !strings.Contains(err.Error(), "unset DATABASE_URL") {
		t.Errorf("--read-pool with DATABASE_URL: err %v, want it refused", err)
	}
}

// TestBenchReadPool runs `couponctl bench --dry-runs --read-pool` for a second a turn: it
// exits 0, the rules hold, it writes the read pool's table, and the streaming replica answered
// the dry runs (their X-Read-Pool-Lag-Ms), at least one, as the last line counts them. Its
// throwaway server and its function log go to a TMPDIR of the test's, removed after it.
func TestBenchReadPool(t *testing.T) {
	if testing.Short() {
		t.Skip("a bench run: about a minute")
	}
	code, out, errOut := couponctlBin(t, []string{"DATABASE_URL=", "TMPDIR=" + childTMPDIR(t)}, "bench", "--clients", "4", "--duration", "1s", "--dry-runs", "--read-pool")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, hotbench.ReadPoolTable) || strings.Contains(out, "broke") {
		t.Errorf("no read pool table, or a rule broke:\n%s", out)
	}
	m := regexp.MustCompile(`the replica answered (\d+) of (\d+) dry runs`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no count of the replica's answers:\n%s", out)
	}
	replica, _ := strconv.Atoi(m[1])
	if replica == 0 {
		t.Errorf("the replica answered none of %s dry runs:\n%s", m[2], out)
	}
	t.Logf("%s", m[0])
}
