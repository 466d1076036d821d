// Command issue serves the IssueCoupon function through the functions framework on $PORT
// (default 8080), as Cloud Run runs it.
package main

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	"github.com/mops/coupon-api/functions/issue" // registers IssueCoupon
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
		log.Fatalf("IssueCoupon: refusing to start: %v", err)
	}
	go func() {
		<-ctx.Done() // flush the queued spans and metrics, then exit
		flushCtx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if err := shutdownTelemetry(flushCtx); err != nil {
			log.Printf("IssueCoupon: telemetry flush: %v", err)
		}
		os.Exit(0)
	}()
	if err := issue.Preflight(context.Background()); err != nil {
		log.Fatalf("IssueCoupon: refusing to start: %v", err)
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if err := funcframework.Start(port); err != nil {
		log.Fatalf("funcframework.Start: %v", err)
	}
}
