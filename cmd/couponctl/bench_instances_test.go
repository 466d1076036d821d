package main

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/mops/coupon-api/internal/lab/hotbench"
)

// TestInstancesBenchIsTheDeploysShape: the instances cells give each instance the pool
// deploy/issue.env.yaml gives IssueCoupon, and Cloud Run's shape is the clients deploy-issue's
// --concurrency lets each instance take.
func TestInstancesBenchIsTheDeploysShape(t *testing.T) {
	var env map[string]string
	readYAML(t, "../../deploy/issue.env.yaml", &env)
	if got := env["DB_POOL_MAX_CONNS"]; got != strconv.Itoa(deployPoolConns) {
		t.Errorf("deploy/issue.env.yaml DB_POOL_MAX_CONNS %q, bench's instances have %d", got, deployPoolConns)
	}
	type step struct {
		ID   string   `yaml:"id"`
		Args []string `yaml:"args"`
	}
	var build struct {
		Steps []step `yaml:"steps"`
	}
	readYAML(t, "../../cloudbuild.yaml", &build)
	i := slices.IndexFunc(build.Steps, func(s step) bool { return s.ID == "deploy-issue" })
	if i < 0 {
		t.Fatal("cloudbuild.yaml: no deploy-issue step")
	}
	if want := "--concurrency=" + strconv.Itoa(deployConcurrency); !slices.Contains(build.Steps[i].Args, want) {
		t.Errorf("cloudbuild.yaml deploy-issue: no %s in %v", want, build.Steps[i].Args)
	}
	cells := instancesCells([]int{1, 8}, []int{32, 128})
	want := []hotbench.Shape{{Instances: 1, Clients: 32}, {Instances: 1, Clients: 128}, {Instances: 1, Clients: deployConcurrency},
		{Instances: 8, Clients: 32}, {Instances: 8, Clients: 128}}
	if deployConcurrency*8 != 128 {
		want = append(want, hotbench.Shape{Instances: 8, Clients: 8 * deployConcurrency})
	}
	if !slices.Equal(cells, want) {
		t.Errorf("cells %v, want %v", cells, want)
	}
}

// TestInstancesBenchRefusesBadInput: bad --instances, --loads and --serve-exe are usage errors
// naming the flag, before any database is touched.
func TestInstancesBenchRefusesBadInput(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--instances", "0"}, "--instances"},
		{[]string{"bench", "--instances", "2", "--loads", "warm"}, "--loads"},
		{[]string{"bench", "--instances", "1", "--duration", "0s"}, "--duration"},
		{[]string{"bench", "--instances", "1", "--duration", "300ms"}, "--duration"},
		{[]string{"bench", "--instances", "2", "--serve-exe", "/nonexistent/couponctl"}, "--serve-exe"},
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

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
