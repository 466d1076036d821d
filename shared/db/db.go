// Package db builds the pgx connection pool the functions use: a direct PostgreSQL URL for local
// runs and tests, or Cloud SQL through the Cloud SQL Go connector (cloud.google.com/go/cloudsqlconn)
// as the pool's dial function, as in GoogleCloudPlatform/golang-samples.
package db

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"cloud.google.com/go/cloudsqlconn"
	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/shared/envconf"
)

// Config says where the database is. Exactly one of DatabaseURL and InstanceConnectionName is used;
// InstanceConnectionName wins when both are set.
type Config struct {
	// DatabaseURL is a PostgreSQL URL or keyword/value string (env DATABASE_URL). Pool settings
	// such as pool_max_conns may be given in it (pgxpool.ParseConfig).
	DatabaseURL string
	// InstanceConnectionName is "project:region:instance" (env INSTANCE_CONNECTION_NAME).
	InstanceConnectionName string
	// User and Name are the database user and database (env DB_USER, DB_NAME). With IAM
	// authentication User is the service account's name without ".gserviceaccount.com".
	User, Name string
	// Password is used only without IAM authentication (env DB_PASS, mounted from Secret Manager).
	Password string
	// IAMAuth turns on Cloud SQL IAM database authentication (env DB_IAM_AUTH=true).
	IAMAuth bool
	// PrivateIP dials the instance's private IP, from inside its VPC (env DB_PRIVATE_IP=true).
	PrivateIP bool
	// MaxConns is the pool's size, in connections per instance, on either path (env
	// DB_POOL_MAX_CONNS); it wins over a pool_max_conns in DatabaseURL. Zero keeps pgx's
	// default, max(4, CPUs), or DatabaseURL's pool_max_conns. Size it for the database, not for
	// the callers: a request waits for a free connection inside its budget, and more backends
	// than the database has cores only queue on the CPU (docs/performance.md). At most
	// [MaxPoolConns].
	MaxConns int
}

// MaxPoolConns bounds [Config.MaxConns]: PostgreSQL's largest max_connections (MAX_BACKENDS,
// 2^18-1); a pool beyond it could never open its connections.
const MaxPoolConns = 262_143

// CancelGrace is how long a query whose context ends may take to stop after PostgreSQL is asked
// to cancel it, before pgx gives up on the connection and closes it. A cancelled query on a live
// connection answers 57014 once the cancel request is through (a new connection: a fork on the
// server, a TLS handshake through the Cloud SQL connector); the connection then goes back to the
// pool instead of being dropped, and the server stops waiting on the query's locks at once.
const CancelGrace = 300 * time.Millisecond

// ConfigFromEnv reads [Config] from the environment variables named on its fields.
func ConfigFromEnv() (Config, error) {
	c, err := settingsFromEnv()
	if err != nil {
		return c, err
	}
	return c, c.validate()
}

// settingsFromEnv reads [Config] from the environment, unvalidated.
func settingsFromEnv() (Config, error) {
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
		if c.MaxConns, err = envconf.IntIn("DB_POOL_MAX_CONNS", 0, 1, MaxPoolConns); err != nil {
			return c, fmt.Errorf("db: %w", err)
		}
	}
	return c, nil
}

// ReadConfigFromEnv reads the read pool's [Config]: DATABASE_READ_URL, or the Cloud SQL read
// pool's connection name READ_INSTANCE_CONNECTION_NAME (which wins when both are set), with the
// primary's other settings ([ConfigFromEnv]: DB_USER, DB_NAME, DB_PASS, DB_IAM_AUTH,
// DB_PRIVATE_IP, DB_POOL_MAX_CONNS). ok is false, and c empty, when neither is set: there is no
// read pool. Errors: [ConfigFromEnv]'s.
func ReadConfigFromEnv() (c Config, ok bool, err error) {
	url, name := os.Getenv("DATABASE_READ_URL"), os.Getenv("READ_INSTANCE_CONNECTION_NAME")
	if url == "" && name == "" {
		return Config{}, false, nil
	}
	if c, err = settingsFromEnv(); err != nil {
		return c, true, err
	}
	c.DatabaseURL, c.InstanceConnectionName = url, name
	if err := c.validate(); err != nil {
		return c, true, fmt.Errorf("read pool: %w", err)
	}
	return c, true, nil
}

func (c Config) validate() error {
	if c.MaxConns < 0 || c.MaxConns > MaxPoolConns {
		return fmt.Errorf("db: pool size %d: must be 1..%d connections (0: pgx's default)", c.MaxConns, MaxPoolConns)
	}
	switch {
	case c.InstanceConnectionName != "":
		if c.User == "" || c.Name == "" {
			return errors.New("db: INSTANCE_CONNECTION_NAME needs DB_USER and DB_NAME")
		}
	case c.DatabaseURL == "":
		return errors.New("db: set DATABASE_URL, or INSTANCE_CONNECTION_NAME with DB_USER and DB_NAME")
	}
	return nil
}

// Open builds a pool (it connects lazily) and returns it with a function that closes the pool
// and, for Cloud SQL, the connector's dialer. Build it once per instance, never per request.
func Open(ctx context.Context, c Config) (*pgxpool.Pool, func(), error) {
	if err := c.validate(); err != nil {
		return nil, nil, err
	}
	if c.InstanceConnectionName == "" {
		cfg, err := pgxpool.ParseConfig(c.DatabaseURL)
		if err != nil {
			return nil, nil, fmt.Errorf("db: parse DATABASE_URL: %w", err)
		}
		c.tune(cfg)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("db: pool: %w", err)
		}
		return pool, pool.Close, nil
	}

	dialerOpts := []cloudsqlconn.Option{cloudsqlconn.WithLazyRefresh()} // lazy refresh: Cloud Run throttles CPU between requests
	if c.IAMAuth {
		dialerOpts = append(dialerOpts, cloudsqlconn.WithIAMAuthN())
	}
	d, err := cloudsqlconn.NewDialer(ctx, dialerOpts...)
	if err != nil {
		return nil, nil, fmt.Errorf("db: cloud sql dialer: %w", err)
	}
	var dialOpts []cloudsqlconn.DialOption
	if c.PrivateIP {
		dialOpts = append(dialOpts, cloudsqlconn.WithPrivateIP())
	}
	cfg, err := c.connectorPoolConfig(func(ctx context.Context) (net.Conn, error) {
		return d.Dial(ctx, c.InstanceConnectionName, dialOpts...)
	})
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		d.Close()
		return nil, nil, fmt.Errorf("db: pool: %w", err)
	}
	return pool, func() { pool.Close(); d.Close() }, nil
}

// connectorPoolConfig is the pool configuration of the Cloud SQL path: every connection is
// opened by dial (the connector's), as user on database, with the settings both paths share.
func (c Config) connectorPoolConfig(dial func(context.Context) (net.Conn, error)) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, fmt.Errorf("db: pool config: %w", err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Database = c.User, c.Name
	if !c.IAMAuth {
		cfg.ConnConfig.Password = c.Password
	}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) }
	c.tune(cfg)
	return cfg, nil
}

// tune applies what both paths share: the pool size, and cancel-then-wait when a query's
// context ends: pgx's default closes the connection at once (and sends the cancel request from
// a goroutine), so every caller who gives up, and every deadline, costs the pool a connection
// and the next request a new one: a new backend, a TLS handshake through the connector
// (TestCallerCancelStorm counts the connections kept).
func (c Config) tune(cfg *pgxpool.Config) {
	if c.MaxConns > 0 {
		cfg.MaxConns = int32(c.MaxConns)
	}
	cfg.ConnConfig.Tracer = otelpgx.NewTracer() // a span per statement; parameter values are never recorded
	cfg.ConnConfig.BuildContextWatcherHandler = func(pgConn *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pgConn, DeadlineDelay: CancelGrace}
	}
}

// Describe returns the effective settings of pool, opened from c, for the start-up log line:
// where it connects (never the password) and how many connections it may open.
func (c Config) Describe(pool *pgxpool.Pool) string {
	cc := pool.Config().ConnConfig
	where := fmt.Sprintf("host=%s port=%d", cc.Host, cc.Port)
	if c.InstanceConnectionName != "" {
		where = fmt.Sprintf("instance=%s iam_auth=%t private_ip=%t", c.InstanceConnectionName, c.IAMAuth, c.PrivateIP)
	}
	return fmt.Sprintf("%s database=%s user=%s pool_max_conns=%d", where, cc.Database, cc.User, pool.Config().MaxConns)
}

// OpenFromEnv is [ConfigFromEnv] then [Open].
func OpenFromEnv(ctx context.Context) (*pgxpool.Pool, func(), error) {
	c, err := ConfigFromEnv()
	if err != nil {
		return nil, nil, err
	}
	return Open(ctx, c)
}

// Querier is what read-and-report code needs from a connection: a *pgx.Conn, a *pgxpool.Pool
// or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
