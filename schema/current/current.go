// Package current holds the current definition of every function of the schema, one file per
// function, as pg_get_functiondef prints it on a database migrated to the newest migration: what
// the database runs, in one place, whichever migration created or last replaced it.
//
// A function's file is NAME.sql (issue_coupon.sql), or, when NAME is overloaded, NAME followed by
// its argument types (see [FileName]). Its first two lines are comments naming the function and
// the migration that last changed its definition; then come its contract, its COMMENT ON
// FUNCTION as obj_description reads it, one comment line per line; the rest is the definition.
// Every function has a contract: what it does, its arguments and their units, what it answers,
// its errors (SQLSTATE and when), and where its rule comes from. A migration that creates a
// function gives it one; [WithoutContract] names the functions that lack it. The files are
// generated, never edited: after adding a migration that creates, replaces, alters, comments on
// or drops a function, rewrite them with
//
//	go generate ./schema/current
//
// (equally `go run ./cmd/couponctl schema current` from the repository's root), which migrates
// an empty database on a throwaway PostgreSQL one migration at a time and writes what it finds.
// TestFilesAreCurrent fails until they are rewritten.
package current

//go:generate go run ../../cmd/couponctl schema current --dir .

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/pressly/goose/v3"

	"github.com/mops/coupon-api/schema"
)

// Regenerate is the command that rewrites the files, run from the repository's root.
const Regenerate = "go generate ./schema/current"

// embedded is this directory; the pattern is "*", not "*.sql", so that the package still
// builds, and the generator still runs, when no file has been generated yet.
//
//go:embed *
var embedded embed.FS

// Files returns the directory of the generated files, as of this build; they are its *.sql.
func Files() fs.FS { return embedded }

// definitionStart begins every definition pg_get_functiondef prints.
const definitionStart = "CREATE OR REPLACE FUNCTION "

// contractPrefix begins each line of a function's contract in its file ("--" alone for an empty
// line).
const contractPrefix = "-- "

// Definition returns the current definition of the function name (unqualified, as in
// "issue_coupon"; with its argument types as regprocedure prints them when it is overloaded:
// "issue_coupon(uuid,text,text,timestamp with time zone,integer,text)") and the file it is in. The definition is a CREATE OR REPLACE FUNCTION
// statement that recreates the function as a migrated database has it. It fails when no file,
// or more than one, holds a function of that name.
func Definition(name string) (def, file string, err error) {
	names, err := fs.Glob(embedded, "*.sql")
	if err != nil {
		return "", "", err
	}
	var found []string
	for _, n := range names {
		b, err := fs.ReadFile(embedded, n)
		if err != nil {
			return "", "", err
		}
		sig, _, body, err := split(b)
		if err != nil {
			return "", "", fmt.Errorf("schema/current: %s: %w", n, err)
		}
		if sig == name || strings.HasPrefix(sig, name+"(") {
			def, file = body, n
			found = append(found, n)
		}
	}
	switch len(found) {
	case 0:
		return "", "", fmt.Errorf("schema/current: no function %s (after a new migration: %s)", name, Regenerate)
	case 1:
		return def, file, nil
	}
	return "", "", fmt.Errorf("schema/current: %s is overloaded (%s): name its argument types", name, strings.Join(found, ", "))
}

// headerRE matches a file's first line, which names the function by its signature.
var headerRE = regexp.MustCompile(`\A-- (\S+\(.*\)): `)

// split returns the signature a file's header names, the contract after the header's two lines
// (empty when it has none) and the definition after the contract.
func split(b []byte) (sig, contract, def string, err error) {
	m := headerRE.FindSubmatch(b)
	lines := strings.SplitAfter(string(b), "\n")
	if m == nil || len(lines) < 3 {
		return "", "", "", errors.New("not a generated file: no header")
	}
	var c []string
	for i, l := range lines[2:] {
		l = strings.TrimSuffix(l, "\n")
		switch {
		case strings.HasPrefix(l, definitionStart):
			return string(m[1]), strings.Join(c, "\n"), strings.Join(lines[2+i:], ""), nil
		case l == strings.TrimSpace(contractPrefix):
			c = append(c, "")
		case strings.HasPrefix(l, contractPrefix):
			c = append(c, strings.TrimPrefix(l, contractPrefix))
		default:
			return "", "", "", fmt.Errorf("not a generated file: line %d is neither the contract's nor %s", 3+i, definitionStart)
		}
	}
	return "", "", "", errors.New("not a generated file: no " + definitionStart)
}

// WithoutContract returns the files of fsys (a directory of generated files, as [Files]) whose
// function has no contract, sorted: a migration created it without a COMMENT ON FUNCTION, or
// removed its comment.
func WithoutContract(fsys fs.FS) ([]string, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		_, contract, _, err := split(b)
		if err != nil {
			return nil, fmt.Errorf("schema/current: %s: %w", n, err)
		}
		if strings.TrimSpace(contract) == "" {
			out = append(out, n)
		}
	}
	return out, nil
}

// function is one function of schema public as a migrated database has it.
type function struct {
	name      string // proname
	signature string // name(argument types), as regprocedure prints it
	args      string // the argument types alone, comma-separated
	def       string // pg_get_functiondef
	contract  string // obj_description: its COMMENT ON FUNCTION, empty when it has none
	version   int64  // the migration that last changed def
	source    string // that migration's file name
}

// functionsQuery lists every function of schema public but those of extensions: its signature,
// pg_get_functiondef's text and its comment, sorted by signature.
const functionsQuery = `
SELECT p.proname, p.oid::regprocedure::text, oidvectortypes(p.proargtypes), pg_get_functiondef(p.oid),
       coalesce(obj_description(p.oid, 'pg_proc'), '')
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace
   AND p.prokind IN ('f', 'p')
   AND NOT EXISTS (SELECT FROM pg_depend d
                    WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
 ORDER BY 2`

// Render migrates the empty database at databaseURL one migration at a time and returns the
// files this package holds, by file name: every function of schema public with its contract and
// its definition after the newest migration, and the migration that last changed the definition. The result
// depends only on the migrations and the PostgreSQL major version, so reruns give clean diffs.
func Render(ctx context.Context, databaseURL string) (map[string][]byte, error) {
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return nil, fmt.Errorf("schema/current: open: %w", err)
	}
	defer db.Close()
	var applied int64
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'goose_db_version'`).Scan(&applied); err != nil {
		return nil, fmt.Errorf("schema/current: %w", err)
	}
	if applied != 0 {
		return nil, errors.New("schema/current: the database is not empty (it has goose_db_version): render needs an empty one")
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, schema.Migrations())
	if err != nil {
		return nil, fmt.Errorf("schema/current: load migrations: %w", err)
	}
	fns := map[string]*function{}
	for {
		r, err := p.UpByOne(ctx)
		if errors.Is(err, goose.ErrNoNextVersion) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("schema/current: migrate: %w", err)
		}
		if fns, err = snapshot(ctx, db, fns, r.Source.Version, filepath.Base(r.Source.Path)); err != nil {
			return nil, err
		}
	}
	return files(fns), nil
}

// snapshot reads every function after migration version (file source) and returns them, each
// with the migration that last changed its definition: source for one that is new or whose
// definition differs from before's (a comment changes no definition).
func snapshot(ctx context.Context, db *sql.DB, before map[string]*function, version int64, source string) (map[string]*function, error) {
	rows, err := db.QueryContext(ctx, functionsQuery)
	if err != nil {
		return nil, fmt.Errorf("schema/current: list functions: %w", err)
	}
	defer rows.Close()
	now := map[string]*function{}
	for rows.Next() {
		f := &function{version: version, source: source}
		if err := rows.Scan(&f.name, &f.signature, &f.args, &f.def, &f.contract); err != nil {
			return nil, fmt.Errorf("schema/current: list functions: %w", err)
		}
		if old, ok := before[f.signature]; ok && old.def == f.def {
			f.version, f.source = old.version, old.source
		}
		now[f.signature] = f
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("schema/current: list functions: %w", err)
	}
	return now, nil
}

// files lays the functions out as files, by file name.
func files(fns map[string]*function) map[string][]byte {
	overloads := map[string]int{}
	for _, f := range fns {
		overloads[f.name]++
	}
	out := make(map[string][]byte, len(fns))
	for _, f := range fns {
		var b bytes.Buffer
		fmt.Fprintf(&b, "-- %s: last changed by migration %05d (schema/migrations/%s).\n", f.signature, f.version, f.source)
		fmt.Fprintf(&b, "-- Generated by `%s` from a migrated database (obj_description, pg_get_functiondef); do not edit.\n", Regenerate)
		if c := strings.TrimSpace(f.contract); c != "" {
			for _, l := range strings.Split(c, "\n") {
				b.WriteString(strings.TrimRight(contractPrefix+l, " \t") + "\n")
			}
		}
		b.WriteString(f.def)
		if !strings.HasSuffix(f.def, "\n") {
			b.WriteString("\n")
		}
		out[FileName(f.name, f.args, overloads[f.name] > 1)] = b.Bytes()
	}
	return out
}

// FileName is the file of function name with argument types args (as oidvectortypes prints
// them: "uuid, text, timestamp with time zone[]"): name.sql, or, when the name is overloaded,
// name followed by each type, spaces as underscores and [] as _array, joined by "__"
// (coupon_void__uuid__text__boolean.sql).
func FileName(name, args string, overloaded bool) string {
	if !overloaded {
		return name + ".sql"
	}
	parts := []string{name}
	for _, a := range strings.Split(args, ", ") {
		if a == "" {
			continue
		}
		a = strings.ReplaceAll(a, "[]", "_array")
		parts = append(parts, strings.ReplaceAll(a, " ", "_"))
	}
	return strings.Join(parts, "__") + ".sql"
}

// Diff compares the files want (from [Render]) with the files in have, and returns one line
// per difference, sorted: a file missing, a file that should not be there, a file whose text
// differs (with the first line that differs). It is empty when they are equal.
func Diff(want map[string][]byte, have fs.FS) ([]string, error) {
	names, err := fs.Glob(have, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, n := range names {
		seen[n] = true
		got, err := fs.ReadFile(have, n)
		if err != nil {
			return nil, err
		}
		w, ok := want[n]
		switch {
		case !ok:
			out = append(out, n+": extra: no such function in a migrated database")
		case !bytes.Equal(got, w):
			out = append(out, n+": differs: "+firstDifference(w, got))
		}
	}
	for n := range want {
		if !seen[n] {
			out = append(out, n+": missing")
		}
	}
	sort.Strings(out)
	return out, nil
}

// firstDifference names the first line at which got differs from want.
func firstDifference(want, got []byte) string {
	w, g := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d is %q, a migrated database has %q", i+1, gl, wl)
		}
	}
	return "same lines"
}

// Write makes dir hold exactly the files: it writes each one whose text changed and removes
// any other *.sql file. It returns the names it wrote or removed, sorted.
func Write(dir string, files map[string][]byte) ([]string, error) {
	old, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil {
		return nil, err
	}
	var changed []string
	for _, p := range old {
		if _, ok := files[filepath.Base(p)]; !ok {
			if err := os.Remove(p); err != nil {
				return changed, err
			}
			changed = append(changed, filepath.Base(p)+" (removed)")
		}
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(dir, n)
		if b, err := os.ReadFile(p); err == nil && bytes.Equal(b, files[n]) {
			continue
		}
		if err := os.WriteFile(p, files[n], 0o644); err != nil {
			return changed, err
		}
		changed = append(changed, n)
	}
	sort.Strings(changed)
	return changed, nil
}
