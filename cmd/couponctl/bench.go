package main

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/hotbench"
	"github.com/mops/coupon-api/internal/isolationlab"
	"github.com/mops/coupon-api/internal/silverweek"
	"github.com/mops/coupon-api/shared/envconf"
	"github.com/mops/coupon-api/shared/issuance"
)

func benchCmd() *cobra.Command {
	var (
		clients  []int
		duration time.Duration
		pgbench  string
		format   string
	)
	c := &cobra.Command{
		Use:   "bench",
		Short: "One hot campaign on one PostgreSQL: IssueCoupon over HTTP (1 and 16 stripes) against pgbench (the design write-up's transaction, the bare one-row UPDATE)",
		Long: `bench measures one hot campaign four ways on one durable PostgreSQL, at each --clients count,
each cell for --duration:

  pgbench: bare one-row UPDATE     the ceiling of one hot row (internal/hotbench/pgbench/bare-update.sql)
  pgbench: the write-up's transaction  the design write-up's issuance transaction (docs/design.md), nine round trips
                                   (internal/hotbench/pgbench/seed.sql)
  IssueCoupon, 1 stripe            the product over HTTP: the functions framework on loopback, as
                                   ` + "`couponctl demo`" + ` serves it, pool of max(--clients) connections
  IssueCoupon, 16 stripes          the same on a campaign of 16 budget stripes

Every request is a new member of a campaign with room for all, so every answer should be ISSUED.
After each cell the rules are checked from the tables (package reconcile) and the cell's coupons
counted against its ISSUED answers or pgbench transactions. The table gives throughput, p50/p99
latency and each cell's ratio to the same client count's pgbench cells. Progress goes to stderr.

Database: DATABASE_URL (its user must be allowed to CREATE DATABASE: bench works in a database
of its own, dropped at the end), or a throwaway durable PostgreSQL (fsync and synchronous_commit
on) when unset. Needs pgbench (Debian: postgresql-15). A benchmark, not a test: the machine
decides the figures; compare them only within one table.`,
		Example: `  couponctl bench
  couponctl bench --clients 32 --duration 5s --format markdown`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !slices.Contains(hotbench.Formats, format) {
				return fmt.Errorf("--format %q: want one of %s", format, strings.Join(hotbench.Formats, ", "))
			}
			if len(clients) == 0 || slices.Min(clients) < 1 {
				return fmt.Errorf("--clients: give one or more client counts, each at least 1")
			}
			if duration < time.Second {
				return fmt.Errorf("--duration %s: want at least 1s (pgbench runs whole seconds)", duration)
			}
			if err := hotbench.CheckPgbench(pgbench); err != nil {
				return err
			}
			return runBench(cmd, clients, duration, pgbench, format)
		},
	}
	f := c.Flags()
	f.IntSliceVar(&clients, "clients", []int{8, 32, 64}, "concurrent clients of each cell")
	f.DurationVar(&duration, "duration", 10*time.Second, "length of each cell (whole seconds)")
	f.StringVar(&pgbench, "pgbench", hotbench.DefaultPgbench, "the pgbench binary")
	f.StringVar(&format, "format", "text", "table format: "+strings.Join(hotbench.Formats, ", "))
	return c
}

func runBench(cmd *cobra.Command, clients []int, duration time.Duration, pgbench, format string) error {
	ctx := cmd.Context()
	errOut := cmd.ErrOrStderr()
	capYen, err := envconf.Int("MONTHLY_CAP_YEN", issuance.DefaultMonthlyCapYen)
	if err != nil {
		return err
	}
	serverURL, stop, err := databaseOrThrowaway(ctx, cmd)
	if err != nil {
		return err
	}
	defer stop()
	fresh, err := isolationlab.OnServer(serverURL)
	if err != nil {
		return err
	}
	dbURL, drop, err := fresh(ctx)
	if err != nil {
		return err
	}
	defer drop()
	top := slices.Max(clients)
	baseURL, err := serveFunctions(ctx, dbURL, top)
	if err != nil {
		return err
	}
	fmt.Fprintf(errOut, "IssueCoupon on %s/IssueCoupon (pool of %d); %d cells of %s\n", baseURL, top, len(clients)*len(hotbench.Variants), duration)
	if err := writeMachine(ctx, cmd, dbURL); err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: top}, Timeout: issuance.AppTimeout}
	send := httpIssuer(client, baseURL+"/IssueCoupon")
	rs, err := hotbench.Run(ctx, hotbench.Config{
		DBURL: dbURL, Pgbench: pgbench, Clients: clients, Duration: duration, CapYen: capYen, Progress: errOut,
		Issue: func(ctx context.Context, memberID, campaignID string) (string, error) {
			return send(ctx, silverweek.Request{MemberID: memberID, CampaignID: campaignID})
		},
	})
	if err != nil {
		return err
	}
	return hotbench.WriteTable(cmd.OutOrStdout(), format, rs)
}

// writeMachine prints what the figures were measured on: date, cores, Go and the PostgreSQL
// server's version and durability settings.
func writeMachine(ctx context.Context, cmd *cobra.Command, dbURL string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var version, fsync, syncCommit string
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
current_setting('synchronous_commit')`).Scan(&version, &fsync, &syncCommit); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s, %d cores, %s, PostgreSQL %s (fsync %s, synchronous_commit %s)\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.Version(), version, fsync, syncCommit)
	return nil
}
