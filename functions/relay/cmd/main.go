// Command relay serves the RelayOutbox function through the functions framework on $PORT
// (default 8080), as Cloud Run runs it. Deploy it with a request timeout above the relay's run
// budget (RELAY_RUN_BUDGET, 50 s by default; cloudbuild.yaml sets 120 s).
package main

import (
	"context"
	"log"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	"github.com/mops/coupon-api/functions/relay" // registers RelayOutbox
)

func main() {
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
