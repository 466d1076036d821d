package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/functions/redeem"
	"github.com/mops/coupon-api/functions/relay"
	"github.com/mops/coupon-api/shared/lifecycle"
	"github.com/mops/coupon-api/shared/telemetry"
)

// servable are the functions couponctl serves, in the order it starts them.
var servable = []*lifecycle.Function{issue.Function, relay.Function, redeem.Function}

// defaultListen is the address serve binds unless --listen says otherwise: loopback only, since
// it checks no caller (deployed, Cloud Run IAM does that before the function runs).
const defaultListen = "127.0.0.1"

func serveCmd() *cobra.Command {
	var listen string
	c := &cobra.Command{
		Use:   "serve",
		Short: "Serve FUNCTION_TARGET on PORT at the functions framework's paths, as deployed",
		Long: `Serve the functions as their deployable mains do on Cloud Run (shared/lifecycle), at the
functions framework's paths: the same start-up check, the same bounds on a request's headers
and body, the same drain on SIGTERM.

FUNCTION_TARGET names the function (IssueCoupon, RelayOutbox or RedeemCoupon), served at /;
unset, all three are served, at /IssueCoupon, /RelayOutbox and /RedeemCoupon, and any other
path answers 404 with a JSON INVALID_REQUEST. PORT defaults to 8080.

serve has no authentication: deployed, Cloud Run lets in only callers with a Google-signed ID
token of an account holding roles/run.invoker, but serve checks no token, and anyone who can
reach its port can issue coupons, redeem them and run the relay. So it listens on 127.0.0.1 (this machine
only) unless --listen names another address: --listen 0.0.0.0 (or ::) serves every interface,
as the deployed mains do inside Cloud Run; do that only where the network is yours.

Before serving, each function reads and validates its configuration (ISSUE_BUDGET,
LINE_CHANNEL_ACCESS_TOKEN, RELAY_RETRY_BASE, ...; MONTHLY_CAP_YEN set at all is refused, as R3's
cap is the database's: couponctl rules set) and opens its own pool of
DB_POOL_MAX_CONNS connections, the database is checked (reachable with DATABASE_URL's
credentials, migrated: otherwise run couponctl migrate), the effective settings are printed
once, and serve exits 1 with the reason if anything is wrong.

Telemetry follows the OTEL_* environment (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, ...;
nothing is exported when neither is set). A request's headers get 3 s to arrive, and its body
3 s more; an answer decided by the headers alone (405, 415, 413 by Content-Length) is sent at
once and closes the connection, the body unread. Ctrl-C or SIGTERM stops it as Cloud Run does:
new requests are refused with 503, those in flight get 5 s to finish, then the connections
left are closed, telemetry is flushed, the pools are closed, and serve exits 0.`,
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
		return usageError{fmt.Errorf("--listen: give an address: %s (this machine only), or 0.0.0.0 or :: (every interface)", defaultListen)}
	}
	if _, port, err := net.SplitHostPort(listen); err == nil {
		return usageError{fmt.Errorf("--listen %s: give the host alone; the port is PORT's (PORT=%s couponctl serve --listen %s)",
			listen, port, strings.Trim(strings.TrimSuffix(listen, ":"+port), "[]"))}
	}
	fns, err := serveTargets(os.Getenv("FUNCTION_TARGET"))
	if err != nil {
		return err
	}
	port, err := lifecycle.Port()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	shutdownTelemetry, err := telemetry.Setup(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "couponctl serve: %s on %s once started (%s; Ctrl-C stops)\n",
		paths(fns), net.JoinHostPort(listen, port), reach(listen))
	return lifecycle.Serve(ctx, lifecycle.Server{Host: listen, Port: port, Functions: fns,
		NotFound: http.HandlerFunc(notFound),
		Closers:  []lifecycle.Closer{lifecycle.TelemetryFlush(shutdownTelemetry)},
		Log:      slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))})
}

// paths says where each of fns is served: at / when it is the only one, else at /<Name>.
func paths(fns []*lifecycle.Function) string {
	if len(fns) == 1 {
		return fns[0].Name() + " at /"
	}
	var s []string
	for _, f := range fns {
		s = append(s, f.Name()+" at /"+f.Name())
	}
	return strings.Join(s, ", ")
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
func serveTargets(target string) ([]*lifecycle.Function, error) {
	if target == "" {
		return servable, nil
	}
	for _, f := range servable {
		if f.Name() == target {
			return []*lifecycle.Function{f}, nil
		}
	}
	return nil, fmt.Errorf("FUNCTION_TARGET=%q: want IssueCoupon, RelayOutbox or RedeemCoupon, or unset for all three", target)
}

// notFound answers, with FUNCTION_TARGET unset, a path that names no function: 404
// INVALID_REQUEST in the functions' JSON, saying where they are, rather than Go's plain "404
// page not found".
func notFound(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusNotFound)
	_ = json.NewEncoder(w).Encode(struct {
		Result  string `json:"result"`
		Message string `json:"message"`
	}{"INVALID_REQUEST", fmt.Sprintf("no function at %s: %s", r.URL.Path, paths(servable))})
}

// localServer is the functions served in this process by [serveLocal].
type localServer struct {
	url  string // http://127.0.0.1:PORT
	stop context.CancelFunc
	done chan error
}

// serveLocal serves fns (of [servable]) in this process on a free loopback port as serve does
// with FUNCTION_TARGET unset, each function configured by the environment, and returns once it
// accepts connections. Close it to drain the functions and close their pools.
func serveLocal(ctx context.Context, log *slog.Logger, fns ...*lifecycle.Function) (*localServer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	os.Unsetenv("FUNCTION_TARGET")
	sctx, stop := context.WithCancel(ctx)
	s := &localServer{url: "http://" + addr, stop: stop, done: make(chan error, 1)}
	go func() {
		s.done <- lifecycle.Serve(sctx, lifecycle.Server{Host: "127.0.0.1", Port: port, Functions: fns,
			NotFound: http.HandlerFunc(notFound), Log: log})
	}()
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return s, nil
		}
		select {
		case err := <-s.done:
			stop()
			return nil, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// close drains the functions and closes their pools.
func (s *localServer) close() error {
	s.stop()
	return <-s.done
}
