package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/schema"
)

func migrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply the schema/ migrations to DATABASE_URL",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			u, err := databaseURL()
			if err != nil {
				return err
			}
			applied, err := schema.MigrateURL(cmd.Context(), u)
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "schema is up to date")
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied migrations %v\n", applied)
			return nil
		},
	}
}
