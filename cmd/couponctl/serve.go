package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/functions/relay"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/lifecycle"
	"github.com/mops/coupon-api/shared/outbox"
	"github.com/mops/coupon-api/shared/telemetry"
)

// servable are the functions couponctl serves, by FUNCTION_TARGET: each reads and validates its
// own settings, builds its handler on the shared pool, and says what it runs with.
var servable = map[string]func(*pgxpool.Pool) (http.Handler, string, error){
	"IssueCoupon": func(pool *pgxpool.Pool) (http.Handler, string, error) {
		cfg, err := issuance.ConfigFromEnv()
		if err != nil {
			return nil, "", err
		}
		h, err := issue.NewHandler(pool, cfg)
		if err != nil {
			return nil, "", err
		}
		return issue.Instrument(h), cfg.String(), issue.RegisterGauges(pool)
	},
	"RelayOutbox": func(pool *pgxpool.Pool) (http.Handler, string, error) {
		cfg, err := outbox.ConfigFromEnv()
		if err != nil {
			return nil, "", err
		}
		h, err := relay.NewHandler(pool, cfg)
		if err != nil {
			return nil, "", err
		}
		return relay.Instrument(h), "", relay.RegisterGauges(pool)
	},
}

// defaultListen is the address serve binds unless --listen says otherwise: loopback only, since
// it checks no caller (deployed, Cloud Run IAM does that before the function runs).
const defaultListen = "127.0.0.1"

func serveCmd() *cobra.Command {
	var listen string
	c := &cobra.Command{
		Use:   "serve",
		Short: "Serve FUNCTION_TARGET on PORT, as deployed",
		Long: `Serve a function as its deployable main does on Cloud Run.

FUNCTION_TARGET names the function (IssueCoupon or RelayOutbox); unset, every function is
served at /<Name>. PORT defaults to 8080.

serve has no authentication: deployed, Cloud Run lets in only callers with a Google-signed ID
token of an account holding roles/run.invoker, but serve checks no token, and anyone who can
reach its port can issue coupons and run the relay. So it listens on 127.0.0.1 (this machine
only) unless --listen names another address: --listen 0.0.0.0 (or ::) serves every interface,
as the deployed mains do inside Cloud Run; do that only where the network is yours.

Before serving, each function reads and validates its
configuration (MONTHLY_CAP_YEN, ISSUE_BUDGET, LINE_CHANNEL_ACCESS_TOKEN, RELAY_RETRY_BASE, ...),
the database is checked (reachable with DATABASE_URL's credentials, migrated: otherwise run
couponctl migrate), the effective settings are printed once, and serve exits 1 with the
reason if anything is wrong. DB_POOL_MAX_CONNS sizes the one pool the functions share.

Telemetry follows the OTEL_* environment (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, ...;
nothing is exported when neither is set). Ctrl-C or SIGTERM stops it as Cloud Run does: no new
requests, those in flight get 5 s to finish, then telemetry is flushed and the pool closed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if listen == "" {
				return fmt.Errorf("--listen: give an address: %s (this machine only), or 0.0.0.0 or :: (every interface)", defaultListen)
			}
			targets, err := serveTargets(os.Getenv("FUNCTION_TARGET"))
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			shutdownTelemetry, err := telemetry.Setup(ctx)
			if err != nil {
				return err
			}
			flush := lifecycle.TelemetryFlush(shutdownTelemetry)
			pool, closePool, dbSettings, err := lifecycle.OpenDB(ctx)
			if err != nil {
				return err
			}
			mux := http.NewServeMux()
			for _, name := range targets {
				h, settings, err := servable[name](pool)
				if err != nil {
					_ = closePool.Close(ctx)
					return fmt.Errorf("%s refuses its configuration: %w", name, err)
				}
				path := "/" + name
				if len(targets) == 1 {
					path = "/"
				}
				mux.Handle(path, h)
				if settings != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", name, settings)
				}
			}
			addr := net.JoinHostPort(listen, lifecycle.Port())
			where := "every interface: no authentication, anyone who reaches the port may call"
			if ip := net.ParseIP(listen); listen == "localhost" || (ip != nil && ip.IsLoopback()) {
				where = "this machine only; --listen 0.0.0.0 for every interface"
			} else if ip == nil || !ip.IsUnspecified() {
				where = "no authentication: anyone who reaches the address may call"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "db: %s\nserving %s on %s (%s; Ctrl-C stops)\n",
				dbSettings, strings.Join(targets, ", "), addr, where)
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			return lifecycle.Serve(ctx, lifecycle.Server{Addr: addr, Handler: mux,
				Closers: []lifecycle.Closer{flush, closePool}, Log: log})
		},
	}
	c.Flags().StringVar(&listen, "listen", defaultListen, "the address to listen on, at PORT: 127.0.0.1 is this machine only; "+
		"0.0.0.0 or :: every interface (serve has no authentication)")
	return c
}

// serveTargets is the function FUNCTION_TARGET names, or every servable one when it is empty.
func serveTargets(target string) ([]string, error) {
	if target != "" {
		if _, ok := servable[target]; !ok {
			return nil, fmt.Errorf("FUNCTION_TARGET=%q: want IssueCoupon or RelayOutbox", target)
		}
		return []string{target}, nil
	}
	var all []string
	for name := range servable {
		all = append(all, name)
	}
	sort.Strings(all)
	return all, nil
}
