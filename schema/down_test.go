package schema_test

import (
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/mops/coupon-api/schema"
)

// refusal is the Down block of a migration that is not undone in place, the same in every file;
// docs/deploy.md, "Releases", says why.
const refusal = "-- +goose Down\n" +
	`DO $$ BEGIN RAISE EXCEPTION 'not undone in place: roll back the revision instead (docs/deploy.md, "Releases")'; END $$;` + "\n"

// createRE matches a function or procedure created, which copies its body; bodyRE what only a
// body, or a block of code, needs: dollar quoting, a statement goose must be told not to split.
var (
	createRE = regexp.MustCompile(`(?i)\bCREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE)\b`)
	bodyRE   = regexp.MustCompile(`(?i)\$[a-z_0-9]*\$|\+goose StatementBegin`)
)

// downProblems returns one line for each migration in fsys whose Down block (from its
// "-- +goose Down" line to the end of the file) is neither the refusal, byte for byte, nor an
// undo of DDL that copies no body: plain statements, with no CREATE FUNCTION or PROCEDURE
// (createRE), no dollar quote and no StatementBegin (bodyRE). A migration without a Down block is
// named too.
func downProblems(t *testing.T, fsys fs.FS) []string {
	t.Helper()
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			t.Fatal(err)
		}
		_, down, ok := strings.Cut(string(b), "\n-- +goose Down\n")
		down = "-- +goose Down\n" + down
		switch {
		case !ok:
			out = append(out, n+": no Down block")
		case down == refusal:
		case createRE.MatchString(down):
			out = append(out, fmt.Sprintf("%s: its Down block copies a body back (%s): want the refusal", n, createRE.FindString(down)))
		case strings.Contains(down, "RAISE EXCEPTION"):
			out = append(out, n+": a refusal in words of its own: want the refusal of docs/deploy.md, \"Releases\"")
		case bodyRE.MatchString(down):
			out = append(out, fmt.Sprintf("%s: its Down block holds %q, not plain statements of DDL: want the refusal", n, bodyRE.FindString(down)))
		}
	}
	return out
}

// TestDownBlocks: every migration's Down block is the refusal or an undo of DDL that copies no
// body (downProblems). The subtest runs the same check on fixtures: a Down that copies a
// function's body back and one that refuses in words of its own are named, the refusal and a
// DROP are not.
func TestDownBlocks(t *testing.T) {
	t.Parallel()
	for _, p := range downProblems(t, schema.Migrations()) {
		t.Error(p)
	}
	t.Run("fixtures", func(t *testing.T) {
		up := "-- +goose Up\nCREATE FUNCTION f() RETURNS int LANGUAGE sql RETURN 1;\n\n"
		fixtures := fstest.MapFS{
			"00001_refuses.sql": {Data: []byte(up + refusal)},
			"00002_drops.sql":   {Data: []byte(up + "-- +goose Down\nDROP FUNCTION f();\n")},
			"00003_copies_a_body.sql": {Data: []byte(up + "-- +goose Down\n-- +goose StatementBegin\n" +
				"CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 0; END $$;\n-- +goose StatementEnd\n")},
			"00004_own_words.sql": {Data: []byte(up + "-- +goose Down\n" +
				"DO $$ BEGIN RAISE EXCEPTION '00004 is not undone in place: roll back the revision instead (docs/deploy.md)'; END $$;\n")},
			"00005_sql_body.sql": {Data: []byte(up + "-- +goose Down\nCREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql RETURN 0;\n")},
			"00006_no_down.sql":  {Data: []byte(up)},
		}
		problems := downProblems(t, fixtures)
		var named []string
		for _, p := range problems {
			named = append(named, p[:strings.Index(p, ":")])
		}
		want := []string{"00003_copies_a_body.sql", "00004_own_words.sql", "00005_sql_body.sql", "00006_no_down.sql"}
		if !slices.Equal(named, want) {
			t.Errorf("the check named %q, want %q:\n%s", named, want, strings.Join(problems, "\n"))
		}
	})
}
