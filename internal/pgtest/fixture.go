package pgtest

import (
	"context"
	"io/fs"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mops/coupon-api/schema"
)

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// BreakFunction replaces function name, in the database db connects to as its owner, with a
// broken variant of its newest definition in schema/migrations: the definition with each pair of
// replacements applied, old by new, every occurrence. It is how a test keeps the broken form of a
// fix as a fixture, derived from the production definition, and shows that it catches it. It
// fails t when the definition or an old text is not found, so a fixture that no longer applies
// says so.
func BreakFunction(t testing.TB, db Execer, name string, replacements ...[2]string) {
	t.Helper()
	def, file := newestDefinition(t, name)
	if !strings.HasPrefix(def, "CREATE OR REPLACE FUNCTION") {
		def = strings.Replace(def, "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
	}
	for _, r := range replacements {
		if !strings.Contains(def, r[0]) {
			t.Fatalf("pgtest: break %s: %q is not in its definition in %s", name, r[0], file)
		}
		def = strings.ReplaceAll(def, r[0], r[1])
	}
	if _, err := db.Exec(context.Background(), def); err != nil {
		t.Fatalf("pgtest: break %s: %v", name, err)
	}
}

// newestDefinition is the CREATE [OR REPLACE] FUNCTION statement of name in the newest migration that has
// one, and that migration's file name.
func newestDefinition(t testing.TB, name string) (string, string) {
	t.Helper()
	files, err := fs.Glob(schema.Migrations(), "*.sql")
	if err != nil {
		t.Fatalf("pgtest: break %s: %v", name, err)
	}
	re := regexp.MustCompile(`(?s)-- \+goose StatementBegin\n(CREATE (?:OR REPLACE )?FUNCTION ` + regexp.QuoteMeta(name) + `\(.*?)-- \+goose StatementEnd`)
	for i := len(files) - 1; i >= 0; i-- { // goose's order: the names sort by version
		src, err := fs.ReadFile(schema.Migrations(), files[i])
		if err != nil {
			t.Fatalf("pgtest: break %s: %v", name, err)
		}
		if m := re.FindSubmatch(src); m != nil {
			return string(m[1]), files[i]
		}
	}
	t.Fatalf("pgtest: break %s: no migration has CREATE FUNCTION %s", name, name)
	return "", ""
}
