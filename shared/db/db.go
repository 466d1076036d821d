// Package db builds the pgx connection pool both functions use: a direct PostgreSQL URL for local
// runs and tests, or Cloud SQL through the Cloud SQL Go connector (cloud.google.com/go/cloudsqlconn)
// as the pool's dial function, as in GoogleCloudPlatform/golang-samples.
package db

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"cloud.google.com/go/cloudsqlconn"
	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
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
}

// ConfigFromEnv reads [Config] from the environment variables named on its fields.
func ConfigFromEnv() (Config, error) {
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
	return c, c.validate()
}

func (c Config) validate() error {
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
		cfg.ConnConfig.Tracer = otelpgx.NewTracer() // a span per statement; parameter values are never recorded
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
	cfg, err := pgxpool.ParseConfig("")
	if err != nil {
		d.Close()
		return nil, nil, fmt.Errorf("db: pool config: %w", err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Database = c.User, c.Name
	cfg.ConnConfig.Tracer = otelpgx.NewTracer() // a span per statement; parameter values are never recorded
	if !c.IAMAuth {
		cfg.ConnConfig.Password = c.Password
	}
	var dialOpts []cloudsqlconn.DialOption
	if c.PrivateIP {
		dialOpts = append(dialOpts, cloudsqlconn.WithPrivateIP())
	}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.Dial(ctx, c.InstanceConnectionName, dialOpts...)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		d.Close()
		return nil, nil, fmt.Errorf("db: pool: %w", err)
	}
	return pool, func() { pool.Close(); d.Close() }, nil
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
