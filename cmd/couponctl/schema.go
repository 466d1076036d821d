package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/testkit/localpg"
	"github.com/mops/coupon-api/schema/current"
)

func schemaCmd() *cobra.Command {
	return groupCmd("schema", "Files generated from the schema's migrations", schemaCurrentCmd())
}

func schemaCurrentCmd() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "current [--dir schema/current]",
		Short: "Rewrite schema/current: every function's contract and definition as a migrated database has them",
		Long: `Rewrite schema/current, one file per function of the schema: its contract (its COMMENT
ON FUNCTION) and its definition as pg_get_functiondef prints it on a database migrated to the
newest migration, headed by the migration that last changed the definition. Run it after adding
a migration that creates, replaces, alters, comments on or drops a function; "go test
./schema/current" fails until the files are rewritten. The same command is "go generate
./schema/current".

It migrates an empty database on a throwaway PostgreSQL, one migration at a time (DATABASE_URL
is not used), writes each file whose text changed, removes the files of functions that no longer
exist, and prints the names it wrote or removed. It exits 1, after writing, when a function has
no contract, naming it: give it a COMMENT ON FUNCTION in a migration.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if st, err := os.Stat(dir); err != nil || !st.IsDir() {
				return flagError("--dir %s is not a directory (run from the repository's root, or give --dir)", dir)
			}
			srv, err := localpg.Start(cmd.Context(), localpg.Options{})
			if err != nil {
				return err
			}
			defer func() { _ = srv.Stop() }()
			files, err := current.Render(cmd.Context(), srv.URL())
			if err != nil {
				return err
			}
			changed, err := current.Write(dir, files)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if abs, err := filepath.Abs(dir); err == nil {
				dir = abs // go generate runs it with --dir .
			}
			if len(changed) == 0 {
				fmt.Fprintf(out, "%s: %d functions, every file current (%s)\n", dir, len(files), srv.Version())
			} else {
				fmt.Fprintf(out, "%s: %d functions, rewrote %s (%s)\n", dir, len(files), strings.Join(changed, ", "), srv.Version())
			}
			missing, err := current.WithoutContract(os.DirFS(dir))
			if err != nil {
				return err
			}
			if len(missing) > 0 {
				return fmt.Errorf("%s: %d functions without a contract (COMMENT ON FUNCTION, given in a migration): %s",
					dir, len(missing), strings.Join(missing, ", "))
			}
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", "schema/current", "the directory of the files")
	return c
}
