// Command relay serves the RelayOutbox function through the functions framework on $PORT
// (default 8080), as Cloud Run runs it. Deploy it with a request timeout above the relay's run
// budget (RELAY_RUN_BUDGET, 50 s by default; cloudbuild.yaml sets 120 s).
package main

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	"github.com/mops/coupon-api/functions/relay" // registers RelayOutbox
	"github.com/mops/coupon-api/shared/telemetry"
)

// flushTimeout bounds the telemetry flush on SIGTERM, inside the 10 s Cloud Run gives an
// instance before SIGKILL.
const flushTimeout = 5 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	shutdownTelemetry, err := telemetry.Setup(ctx)
	if err != nil {
		log.Fatalf("RelayOutbox: refusing to start: %v", err)
	}
	go func() {
		<-ctx.Done() // flush the queued spans and metrics, then exit
		flushCtx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if err := shutdownTelemetry(flushCtx); err != nil {
			log.Printf("RelayOutbox: telemetry flush: %v", err)
		}
		os.Exit(0)
	}()
	if err := relay.Preflight(context.Background()); err != nil {
		log.Fatalf("RelayOutbox: refusing to start: %v", err)
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if err := funcframework.Start(port); err != nil {
		log.Fatalf("funcframework.Start: %v", err)
	}
}
