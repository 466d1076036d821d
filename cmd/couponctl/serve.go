package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/functions/relay"
	"github.com/mops/coupon-api/shared/lifecycle"
	"github.com/mops/coupon-api/shared/telemetry"
)

// servable are the functions couponctl serve serves, by FUNCTION_TARGET: each starts on the
// pool serve opened and says what it runs with.
var servable = map[string]func(context.Context, *lifecycle.DB) (http.Handler, string, error){
	"IssueCoupon": func(ctx context.Context, d *lifecycle.DB) (http.Handler, string, error) {
		h, settings, err := issue.Start(ctx, opened(d))
		if err != nil {
			return nil, "", err
		}
		return issue.Instrument(h), settings, nil
	},
	"RelayOutbox": func(ctx context.Context, d *lifecycle.DB) (http.Handler, string, error) {
		h, err := relay.Start(ctx, opened(d))
		if err != nil {
			return nil, "", err
		}
		return relay.Instrument(h), "", nil
	},
}

// opened is the open function of a function's Start that hands it d, already open.
func opened(d *lifecycle.DB) func(context.Context) (*lifecycle.DB, error) {
	return func(context.Context) (*lifecycle.DB, error) { return d, nil }
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
		RunE: func(cmd *cobra.Command, _ []string) error { return serve(cmd, listen) },
	}
	c.Flags().StringVar(&listen, "listen", defaultListen, "the address to listen on, at PORT: 127.0.0.1 is this machine only; "+
		"0.0.0.0 or :: every interface (serve has no authentication)")
	return c
}

// serve serves FUNCTION_TARGET, or every servable function, on listen at PORT until cmd's
// context ends or SIGTERM.
func serve(cmd *cobra.Command, listen string) error {
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
	d, err := lifecycle.OpenDB(ctx)
	if err != nil {
		return err
	}
	mux, err := serveMux(cmd, d, targets)
	if err != nil {
		_ = d.Closer.Close(ctx)
		return err
	}
	addr := net.JoinHostPort(listen, lifecycle.Port())
	fmt.Fprintf(cmd.ErrOrStderr(), "db: %s\nserving %s on %s (%s; Ctrl-C stops)\n",
		d.Settings, strings.Join(targets, ", "), addr, reach(listen))
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
	return lifecycle.Serve(ctx, lifecycle.Server{Addr: addr, Handler: mux,
		Closers: []lifecycle.Closer{lifecycle.TelemetryFlush(shutdownTelemetry), d.Closer}, Log: log})
}

// serveMux starts targets on d: one at /, or each at /<Name>. It prints each one's settings.
func serveMux(cmd *cobra.Command, d *lifecycle.DB, targets []string) (*http.ServeMux, error) {
	mux := http.NewServeMux()
	for _, name := range targets {
		h, settings, err := servable[name](cmd.Context(), d)
		if err != nil {
			return nil, fmt.Errorf("%s refuses its configuration: %w", name, err)
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
	return mux, nil
}

// reach says who can call serve listening on listen.
func reach(listen string) string {
	if ip := net.ParseIP(listen); listen == "localhost" || (ip != nil && ip.IsLoopback()) {
		return "this machine only; --listen 0.0.0.0 for every interface"
	} else if ip == nil || !ip.IsUnspecified() {
		return "no authentication: anyone who reaches the address may call"
	}
	return "every interface: no authentication, anyone who reaches the port may call"
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
