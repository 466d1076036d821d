// Package sharded is TestMainShards's fixture: tests run by pgtest.MainShards, each of which
// says where it ran.
package sharded

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainShards(m, []string{"TestLong", "TestGone"}) }

// where logs the test's process, server and TMPDIR, and fails the test named in
// SHARDED_FIXTURE_FAIL.
func where(t *testing.T) {
	t.Setenv("DATABASE_URL", pgtest.URL(t)) // t.Setenv: a test that cannot call t.Parallel
	conn, err := pgx.Connect(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var port int
	if err := conn.QueryRow(context.Background(), `SELECT inet_server_port()`).Scan(&port); err != nil {
		t.Fatal(err)
	}
	t.Logf("where: pid=%d server=%d tmpdir=%s rundir=%s", os.Getpid(), port, os.TempDir(), pgtest.RunDir())
	if strings.Contains(os.Getenv("SHARDED_FIXTURE_FAIL"), t.Name()) {
		t.Error("failed on purpose")
	}
}

func TestA(t *testing.T)    { where(t) }
func TestB(t *testing.T)    { where(t) }
func TestLong(t *testing.T) { where(t) }

func TestWithSubtests(t *testing.T) {
	for _, s := range []string{"x", "y"} {
		t.Run(s, func(t *testing.T) {
			t.Parallel()
			t.Logf("subtest %s", s)
		})
	}
	where(t)
}
