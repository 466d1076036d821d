package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/functions/issue" // registers IssueCoupon
	"github.com/mops/coupon-api/functions/relay" // registers RelayOutbox
	"github.com/mops/coupon-api/shared/telemetry"
)

// preflights are the functions couponctl serves, by FUNCTION_TARGET, each with the check that
// builds its configuration and pool before serving.
var preflights = map[string]func(context.Context) error{
	"IssueCoupon": issue.Preflight,
	"RelayOutbox": relay.Preflight,
}

func serveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Serve FUNCTION_TARGET on PORT through the functions framework, as deployed",
		Long: `Serve a function through the functions framework, as Cloud Run does.

FUNCTION_TARGET names the function (IssueCoupon or RelayOutbox); unset, every function is
served at /<Name>. PORT defaults to 8080. Each served function reads and validates its
configuration (DATABASE_URL, MONTHLY_CAP_YEN, ISSUE_BUDGET, LINE_CHANNEL_ACCESS_TOKEN,
RELAY_RETRY_BASE, ...) before serving starts, and serve exits 1 if one refuses it.
Telemetry follows the OTEL_* environment (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, ...;
nothing is exported when neither is set) and is flushed on exit. Ctrl-C or SIGTERM stops it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			port := os.Getenv("PORT")
			if port == "" {
				port = "8080"
			}
			shutdownTelemetry, err := telemetry.Setup(cmd.Context())
			if err != nil {
				return err
			}
			defer flushTelemetry(cmd, shutdownTelemetry)
			target := os.Getenv("FUNCTION_TARGET")
			targets := []string{target}
			if target == "" {
				targets = nil
				for name := range preflights {
					targets = append(targets, name)
				}
				sort.Strings(targets)
			}
			for _, name := range targets {
				preflight, ok := preflights[name]
				if !ok {
					return fmt.Errorf("FUNCTION_TARGET=%q: want IssueCoupon or RelayOutbox", name)
				}
				if err := preflight(cmd.Context()); err != nil {
					return fmt.Errorf("%s refuses its configuration: %w", name, err)
				}
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "serving %s on :%s (Ctrl-C stops)\n", strings.Join(targets, ", "), port)
			served := make(chan error, 1)
			go func() { served <- funcframework.Start(port) }()
			select {
			case err := <-served:
				return err
			case <-cmd.Context().Done():
				fmt.Fprintln(cmd.ErrOrStderr(), "stopped")
				return nil
			}
		},
	}
}
