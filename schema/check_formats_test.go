package schema_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// The formats 00002 stated as regular expressions, on issued_coupons and member_monthly_usage.
const (
	regexMonth    = `month ~ '^\d{4}-(0[1-9]|1[0-2])$'`
	regexMemberID = `member_id ~ '^[!-~]{1,128}$'`
)

// formatInputs are edge inputs of a month and of a member id, as SQL of one text column: every
// ASCII character alone, inside an id and at each place of a month; non-ASCII letters and digits
// ('１', full width); the lengths 0, 1, 128 and 129; a month's shapes one character off.
// monthInputs adds every 'YYYY-MM' of the years 0000 to 9999 and the months 00 to 13.
const (
	formatInputs = `
SELECT chr(c) FROM generate_series(1, 127) c
UNION ALL SELECT 'a' || chr(c) || 'b' FROM generate_series(1, 127) c
UNION ALL SELECT overlay('2026-01' placing chr(c) from p for 1) FROM generate_series(1, 127) c, generate_series(1, 7) p
UNION ALL SELECT unnest(ARRAY['', 'x', repeat('x', 128), repeat('x', 129), repeat('~', 128), repeat('!', 129), 'é', '１', 'm１',
  'ｍ1', 'a b', E'a\nb', E'ab\n', '2026-1', '2026-001', '02026-01', ' 2026-01', '2026-01 ', E'2026-01\n', '２０２６-01', '2026-０１',
  '2026-0１', '202６-01', '2026/01', '+026-01', '-026-01', '2026-00', '2026-13', '2026-1a', 'abcd-ef', '0000-01', '9999-12'])`
	monthInputs = formatInputs + `
UNION ALL SELECT lpad(y::text, 4, '0') || '-' || lpad(m::text, 2, '0') FROM generate_series(0, 9999) y, generate_series(0, 13) m`
)

// formatDiffs evaluates the check expressions plain and regex (each naming its column, month or
// member_id) over inputs and returns the inputs they answer differently, at most ten, and
// how many inputs each accepts.
func formatDiffs(t *testing.T, db *pgxpool.Pool, column, plain, regex, inputs string) (diffs []string, plainOK, regexOK int) {
	t.Helper()
	rows, err := db.Query(context.Background(), fmt.Sprintf(`
SELECT %[1]s, (%[2]s) IS TRUE, (%[3]s) IS TRUE, count(*) OVER (PARTITION BY (%[2]s) IS TRUE), count(*) OVER (PARTITION BY (%[3]s) IS TRUE)
  FROM (%[4]s) AS i(%[1]s)
 ORDER BY (%[2]s) IS TRUE = (%[3]s) IS TRUE, %[1]s`, column, plain, regex, inputs))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var in string
		var p, r bool
		var pn, rn int
		if err := rows.Scan(&in, &p, &r, &pn, &rn); err != nil {
			t.Fatal(err)
		}
		if p {
			plainOK = pn
		}
		if r {
			regexOK = rn
		}
		if p != r && len(diffs) < 10 {
			diffs = append(diffs, fmt.Sprintf("%q: plain %v, regex %v", in, p, r))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return diffs, plainOK, regexOK
}

// literal is a quoted SQL string literal, as pg_get_expr prints one.
var literal = regexp.MustCompile(`'(?:[^']|'')*'`)

// TestPlainChecksAcceptWhatTheRegexesAccepted holds 00038's month and member id CHECKs of the
// tables the issuance writes (calls of month_format_ok and member_id_format_ok, no regular
// expression in them) to 00002's regular expressions over monthInputs, on the migrated database:
// each accepts exactly what the regex accepted. Its broken variants, the functions' expressions
// taking month 00 and 129 characters, are told apart.
func TestPlainChecksAcceptWhatTheRegexesAccepted(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 2)
	for _, table := range []string{"issued_coupons", "member_monthly_usage"} {
		for _, c := range []struct{ constraint, column, regex, inputs, bound, broken string }{
			{"month_format", "month", regexMonth, monthInputs, "BETWEEN '01' AND '12'", "BETWEEN '00' AND '12'"},
			{"member_id_format", "member_id", regexMemberID, formatInputs, "BETWEEN 1 AND 128", "BETWEEN 1 AND 129"},
		} {
			t.Run(table+"/"+c.constraint, func(t *testing.T) {
				var plain, body string
				if err := db.QueryRow(context.Background(), `
SELECT pg_get_expr(c.conbin, c.conrelid), coalesce(string_agg(p.prosrc, E'\n'), '')
  FROM pg_constraint c
  LEFT JOIN pg_depend d ON d.classid = 'pg_constraint'::regclass AND d.objid = c.oid AND d.refclassid = 'pg_proc'::regclass
  LEFT JOIN pg_proc p ON p.oid = d.refobjid
 WHERE c.conrelid = $1::regclass AND c.conname = $2
 GROUP BY c.conbin, c.conrelid`, table, c.constraint).Scan(&plain, &body); err != nil {
					t.Fatal(err)
				}
				if code := literal.ReplaceAllString(plain+body, "''"); strings.Contains(code, "~") || strings.Contains(strings.ToLower(code), "similar") {
					t.Errorf("%s.%s is a regular expression still: %s\n%s", table, c.constraint, plain, body)
				}
				diffs, plainOK, regexOK := formatDiffs(t, db, c.column, plain, c.regex, c.inputs)
				if len(diffs) > 0 {
					t.Errorf("%s.%s answers other than 00002's regex:\n%s", table, c.constraint, strings.Join(diffs, "\n"))
				}
				if plainOK == 0 || regexOK == 0 || plainOK != regexOK {
					t.Errorf("accepted: plain %d, regex %d; want the same, above 0", plainOK, regexOK)
				}
				// The broken variant: the function's expression, inline, with its bound moved.
				i, j := strings.Index(body, "RETURN "), strings.LastIndex(body, ";")
				if i < 0 || j < i || !strings.Contains(body, c.bound) {
					t.Fatalf("no RETURN expression with %s in %s", c.bound, body)
				}
				broken := strings.NewReplacer("p_"+c.column, c.column, c.bound, c.broken).Replace(body[i+len("RETURN ") : j])
				if diffs, _, _ := formatDiffs(t, db, c.column, broken, c.regex, c.inputs); len(diffs) == 0 {
					t.Errorf("the broken check %s passes", broken)
				}
			})
		}
	}
}
