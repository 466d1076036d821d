// Command issue serves the IssueCoupon function through the functions framework on $PORT
// (default 8080), as Cloud Run runs it.
package main

import (
	"context"
	"log"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	"github.com/mops/coupon-api/functions/issue" // registers IssueCoupon
)

func main() {
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
