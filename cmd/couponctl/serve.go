package main

import (
	"fmt"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/spf13/cobra"

	_ "github.com/mops/coupon-api/functions/issue" // registers IssueCoupon
	_ "github.com/mops/coupon-api/functions/relay" // registers RelayOutbox
)

func serveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Serve FUNCTION_TARGET on PORT through the functions framework, as deployed",
		Long: `Serve a function through the functions framework, as Cloud Run does.

FUNCTION_TARGET names the function (IssueCoupon or RelayOutbox); unset, every function is
served at /<Name>. PORT defaults to 8080. The function reads its own configuration (DATABASE_URL,
MONTHLY_CAP_YEN, ISSUE_BUDGET, LINE_CHANNEL_ACCESS_TOKEN, RELAY_RETRY_BASE, ...) on its first request.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			port := os.Getenv("PORT")
			if port == "" {
				port = "8080"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "serving %q on :%s\n", os.Getenv("FUNCTION_TARGET"), port)
			return funcframework.Start(port)
		},
	}
}
