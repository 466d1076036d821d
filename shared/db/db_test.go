package db

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/mops/coupon-api/shared/envconf"
)

// TestPoolMaxConns: DB_POOL_MAX_CONNS sizes the pool on both paths, the Cloud SQL connector's
// included, and wins over DATABASE_URL's pool_max_conns; zero, negative or non-numeric values,
// and pools beyond PostgreSQL's largest max_connections, are refused with the variable's name.
// The broken variant of the refusal, unboundedConfigFromEnv, parses DB_POOL_MAX_CONNS without
// its bound, as before issue 29: the same check must refuse it.
func TestPoolMaxConns(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@127.0.0.1:1/coupons?pool_max_conns=3")
	for _, broken := range []bool{false, true} {
		read := ConfigFromEnv
		if broken {
			read = unboundedConfigFromEnv
		}
		var wrong []string
		for _, bad := range []string{"0", "-4", "many", "1.5", "262144", "4294967296"} {
			t.Setenv("DB_POOL_MAX_CONNS", bad)
			if _, err := read(); err == nil || !strings.Contains(err.Error(), "DB_POOL_MAX_CONNS") {
				wrong = append(wrong, fmt.Sprintf("DB_POOL_MAX_CONNS=%s: %v, want an error naming it", bad, err))
			}
		}
		switch {
		case broken && len(wrong) == 0:
			t.Error("the broken variant passed: the test would not see a pool beyond its range taken")
		case broken:
			t.Logf("the broken variant: %v", wrong)
		default:
			for _, w := range wrong {
				t.Error(w)
			}
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

// unboundedConfigFromEnv is [ConfigFromEnv] with DB_POOL_MAX_CONNS parsed without its bound
// (envconf.Int in place of IntIn), as before issue 29.
func unboundedConfigFromEnv() (Config, error) {
	c := Config{
		DatabaseURL:            os.Getenv("DATABASE_URL"),
		InstanceConnectionName: os.Getenv("INSTANCE_CONNECTION_NAME"),
		User:                   os.Getenv("DB_USER"),
		Name:                   os.Getenv("DB_NAME"),
		Password:               os.Getenv("DB_PASS"),
	}
	var err error
	if c.IAMAuth, err = envconf.Bool("DB_IAM_AUTH"); err != nil {
		return c, err
	}
	if c.PrivateIP, err = envconf.Bool("DB_PRIVATE_IP"); err != nil {
		return c, err
	}
	if os.Getenv("DB_POOL_MAX_CONNS") != "" {
		if c.MaxConns, err = envconf.Int("DB_POOL_MAX_CONNS", 0); err != nil {
			return c, fmt.Errorf("db: %w", err)
		}
	}
	return c, c.validate()
}

// TestReadConfigFromEnv: without DATABASE_READ_URL and READ_INSTANCE_CONNECTION_NAME there is no
// read pool; with either, the read pool takes it and the primary's other settings (user,
// database, IAM, pool size), never the primary's address; a read pool through the connector
// without DB_USER is refused as the primary's is.
func TestReadConfigFromEnv(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@primary:5432/coupons")
	t.Setenv("INSTANCE_CONNECTION_NAME", "")
	t.Setenv("DATABASE_READ_URL", "")
	t.Setenv("READ_INSTANCE_CONNECTION_NAME", "")
	t.Setenv("DB_POOL_MAX_CONNS", "5")
	if c, ok, err := ReadConfigFromEnv(); ok || err != nil || c != (Config{}) {
		t.Errorf("no read pool set: %+v, %t, %v; want none", c, ok, err)
	}
	t.Setenv("DATABASE_READ_URL", "postgres://u@standby:5432/coupons")
	c, ok, err := ReadConfigFromEnv()
	if !ok || err != nil || c.DatabaseURL != "postgres://u@standby:5432/coupons" || c.MaxConns != 5 || c.InstanceConnectionName != "" {
		t.Errorf("DATABASE_READ_URL: %+v, %t, %v; want the standby's URL, 5 connections", c, ok, err)
	}
	t.Setenv("READ_INSTANCE_CONNECTION_NAME", "p:asia-northeast1:coupon-db-read")
	t.Setenv("DB_USER", "coupon-issue@p.iam")
	t.Setenv("DB_NAME", "coupons")
	t.Setenv("DB_IAM_AUTH", "true")
	c, ok, err = ReadConfigFromEnv()
	if !ok || err != nil || c.InstanceConnectionName != "p:asia-northeast1:coupon-db-read" || !c.IAMAuth || c.User != "coupon-issue@p.iam" {
		t.Errorf("READ_INSTANCE_CONNECTION_NAME: %+v, %t, %v; want the read pool's name with the primary's user and IAM", c, ok, err)
	}
	t.Setenv("DB_USER", "")
	if _, ok, err := ReadConfigFromEnv(); !ok || err == nil {
		t.Errorf("READ_INSTANCE_CONNECTION_NAME without DB_USER: %t, %v; want an error", ok, err)
	}
}
