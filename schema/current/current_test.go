package current_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema/current"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestFilesAreCurrent renders the files from an empty database migrated one migration at a time
// and compares them with the committed ones: every function of schema public has its file, no
// file names a function the database lacks, and each text equals pg_get_functiondef's. The
// subtests feed the same comparison the committed files with one edited by hand, one missing and
// one extra, and check that each is reported: the comparison can fail.
func TestFilesAreCurrent(t *testing.T) {
	want, err := current.Render(context.Background(), pgtest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatal("a migrated database has no function")
	}
	diff, err := current.Diff(want, current.Files())
	if err != nil {
		t.Fatal(err)
	}
	if len(diff) > 0 {
		t.Errorf("schema/current is not what a migrated database runs; rewrite it with `%s` "+
			"(or `go run ./cmd/couponctl schema current` from the repository's root):\n%s",
			current.Regenerate, strings.Join(diff, "\n"))
	}

	committed := mapFS(want)
	const name = "issue_coupon.sql"
	if committed[name] == nil {
		t.Fatalf("no %s among %d files", name, len(want))
	}
	edited, missing, extra := clone(committed), clone(committed), clone(committed)
	edited[name] = &fstest.MapFile{Data: []byte(strings.Replace(string(want[name]), "SECURITY DEFINER", "SECURITY INVOKER", 1))}
	delete(missing, name)
	extra["issue_coupon_v2.sql"] = &fstest.MapFile{Data: want[name]}
	for _, c := range []struct {
		name string
		fs   fstest.MapFS
		want string
	}{
		{"edited by hand", edited, name + ": differs: line "},
		{"missing", missing, name + ": missing"},
		{"extra", extra, "issue_coupon_v2.sql: extra"},
	} {
		t.Run(c.name, func(t *testing.T) {
			diff, err := current.Diff(want, c.fs)
			if err != nil {
				t.Fatal(err)
			}
			if len(diff) != 1 || !strings.HasPrefix(diff[0], c.want) {
				t.Errorf("Diff = %q, want one line starting %q", diff, c.want)
			}
		})
	}
}

// TestEveryFunctionHasAContract: every function of the schema has a contract, its COMMENT ON
// FUNCTION, in its file above its definition (TestFilesAreCurrent holds the files to what a
// migrated database has). The subtest runs the same check on two files, issue_clock.sql as
// committed and issue_coupon.sql rendered as for a function without a comment, its header then
// its definition: the check names issue_coupon.sql, and it alone.
func TestEveryFunctionHasAContract(t *testing.T) {
	missing, err := current.WithoutContract(current.Files())
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Errorf("%d functions without a contract: give each a COMMENT ON FUNCTION in a migration (what it does, "+
			"its arguments and their units, what it answers, its errors, where its rule comes from), then `%s`:\n%s",
			len(missing), current.Regenerate, strings.Join(missing, "\n"))
	}
	t.Run("a contract taken out", func(t *testing.T) {
		const name, kept = "issue_coupon.sql", "issue_clock.sql"
		fixture := fstest.MapFS{}
		for _, n := range []string{name, kept} {
			b, err := fs.ReadFile(current.Files(), n)
			if err != nil {
				t.Fatal(err)
			}
			fixture[n] = &fstest.MapFile{Data: b}
		}
		def, _, err := current.Definition("issue_coupon")
		if err != nil {
			t.Fatal(err)
		}
		header := strings.SplitAfterN(string(fixture[name].Data), "\n", 3)
		fixture[name] = &fstest.MapFile{Data: []byte(header[0] + header[1] + def)}
		got, err := current.WithoutContract(fixture)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{name}; !slices.Equal(got, want) {
			t.Errorf("WithoutContract = %q, want %q", got, want)
		}
	})
}

// TestWriteAndRerun: a second render, on another empty database, gives the same bytes (reruns
// give clean diffs), and Write makes a directory hold exactly the rendered files: it rewrites a
// file edited by hand, removes a stray one, leaves the rest alone, and a second Write changes
// nothing.
func TestWriteAndRerun(t *testing.T) {
	ctx := context.Background()
	want, err := current.Render(ctx, pgtest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	again, err := current.Render(ctx, pgtest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if diff, err := current.Diff(want, mapFS(again)); err != nil || len(diff) > 0 {
		t.Fatalf("two renders differ: %q %v", diff, err)
	}

	dir := t.TempDir()
	if _, err := current.Write(dir, want); err != nil {
		t.Fatal(err)
	}
	const edited, stray = "issue_coupon.sql", "dropped_function.sql"
	if err := os.WriteFile(filepath.Join(dir, edited), []byte("-- edited by hand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, stray), []byte("-- a function no migration has\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	changed, err := current.Write(dir, want)
	if err != nil {
		t.Fatal(err)
	}
	if got, exp := strings.Join(changed, ", "), stray+" (removed), "+edited; got != exp {
		t.Errorf("Write changed %q, want %q", got, exp)
	}
	if diff, err := current.Diff(want, os.DirFS(dir)); err != nil || len(diff) > 0 {
		t.Errorf("after Write the directory differs: %q %v", diff, err)
	}
	if changed, err := current.Write(dir, want); err != nil || len(changed) > 0 {
		t.Errorf("a second Write changed %q (%v), want nothing", changed, err)
	}
}

func mapFS(files map[string][]byte) fstest.MapFS {
	out := fstest.MapFS{}
	for name, b := range files {
		out[name] = &fstest.MapFile{Data: b}
	}
	return out
}

func clone(m fstest.MapFS) fstest.MapFS {
	out := fstest.MapFS{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestDefinitionRecreatesTheFunction runs each file's definition on a migrated database (a
// clone of the template every test starts from) and checks that pg_get_functiondef prints the
// same text after as before: what [current.Definition] returns, and pgtest.BreakFunction breaks,
// is the function the database runs.
func TestDefinitionRecreatesTheFunction(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT CASE WHEN count(*) OVER (PARTITION BY proname) > 1 THEN oid::regprocedure::text ELSE proname::text END,
		       oid::regprocedure::text, pg_get_functiondef(oid)
		  FROM pg_proc WHERE pronamespace = 'public'::regnamespace AND prokind IN ('f', 'p') ORDER BY 2`)
	if err != nil {
		t.Fatal(err)
	}
	before, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Name, Signature, Def string }])
	if err != nil {
		t.Fatal(err)
	}
	if len(before) == 0 {
		t.Fatal("a migrated database has no function")
	}
	for _, f := range before {
		def, file, err := current.Definition(f.Name)
		if err != nil {
			t.Errorf("%s: %v", f.Name, err)
			continue
		}
		if def != f.Def {
			t.Errorf("%s: the definition in %s is not pg_get_functiondef's (rewrite with `%s`)", f.Name, file, current.Regenerate)
			continue
		}
		if _, err := conn.Exec(ctx, def); err != nil {
			t.Errorf("%s: run the definition in %s: %v", f.Name, file, err)
			continue
		}
		var after string
		if err := conn.QueryRow(ctx, `SELECT pg_get_functiondef($1::regprocedure)`, f.Signature).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if after != f.Def {
			t.Errorf("%s: after running %s, pg_get_functiondef differs from before", f.Name, file)
		}
	}
}
