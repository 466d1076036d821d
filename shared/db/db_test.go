package db

import (
	"context"
	"net"
	"strings"
	"testing"
)

// TestPoolMaxConns: DB_POOL_MAX_CONNS sizes the pool on both paths, the Cloud SQL connector's
// included, and wins over DATABASE_URL's pool_max_conns; zero, negative or non-numeric values,
// and pools beyond PostgreSQL's largest max_connections, are refused with the variable's name.
func TestPoolMaxConns(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@127.0.0.1:1/coupons?pool_max_conns=3")
	for _, bad := range []string{"0", "-4", "many", "1.5", "262144", "4294967296"} {
		t.Setenv("DB_POOL_MAX_CONNS", bad)
		if _, err := ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), "DB_POOL_MAX_CONNS") {
			t.Errorf("DB_POOL_MAX_CONNS=%s: %v, want an error naming it", bad, err)
		}
	}

	t.Setenv("DB_POOL_MAX_CONNS", "9")
	c, err := ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	pool, closePool, err := Open(context.Background(), c) // connects lazily: no server needed
	if err != nil {
		t.Fatal(err)
	}
	defer closePool()
	if got := pool.Config().MaxConns; got != 9 {
		t.Errorf("DATABASE_URL path: pool of %d, want 9 (DB_POOL_MAX_CONNS over the URL's 3)", got)
	}
	if !strings.Contains(c.Describe(pool), "pool_max_conns=9") {
		t.Errorf("Describe = %q, want the effective pool size", c.Describe(pool))
	}

	c = Config{InstanceConnectionName: "p:r:i", User: "u", Name: "coupons", MaxConns: 12}
	cfg, err := c.connectorPoolConfig(func(context.Context) (net.Conn, error) { return nil, net.ErrClosed })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxConns != 12 || cfg.ConnConfig.BuildContextWatcherHandler == nil {
		t.Errorf("Cloud SQL path: pool of %d (want 12), context handler set %t", cfg.MaxConns,
			cfg.ConnConfig.BuildContextWatcherHandler != nil)
	}

	t.Setenv("DB_POOL_MAX_CONNS", "")
	if c, err := ConfigFromEnv(); err != nil || c.MaxConns != 0 {
		t.Errorf("unset: %+v %v, want MaxConns 0 (pgx's default or the URL's)", c, err)
	}
}
