// Command relay serves the RelayOutbox function through the functions framework on $PORT
// (default 8080), as Cloud Run runs it. Deploy it with a request timeout above the relay's run
// budget (RELAY_RUN_BUDGET, 50 s by default; cloudbuild.yaml sets 120 s).
package main

import (
	"log"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	_ "github.com/mops/coupon-api/functions/relay" // registers RelayOutbox
)

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if err := funcframework.Start(port); err != nil {
		log.Fatalf("funcframework.Start: %v", err)
	}
}
