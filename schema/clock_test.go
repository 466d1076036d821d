package schema_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// One clock (issue 39, 00031_one_judge_one_clock.sql): the database reads the time from
// issue_now() alone, and every instant a role's function takes is finite and in range, so that
// the tables hold none a reader cannot show.

// clockCall matches a call of a clock of PostgreSQL's (PostgreSQL 15 docs, 9.9.5 "Current
// Date/Time").
const clockCall = `'(clock_timestamp|statement_timestamp|transaction_timestamp|timeofday|\mnow)\s*\(\s*\)|current_timestamp|localtimestamp|current_time\M'`

// sqlClockReaders lists what reads a clock of PostgreSQL's instead of issue_now(): the functions
// of schema public (issue_now() aside), its views, and its columns' defaults (goose's own table
// aside).
const sqlClockReaders = `
SELECT p.oid::regprocedure::text FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace AND p.proname <> 'issue_now'
   AND coalesce(p.prosrc, '') || coalesce(pg_get_function_sqlbody(p.oid), '') ~* ` + clockCall + `
UNION ALL
SELECT 'view ' || c.relname FROM pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('v', 'm') AND pg_get_viewdef(c.oid) ~* ` + clockCall + `
UNION ALL
SELECT 'default ' || c.relname || '.' || a.attname FROM pg_attrdef d
  JOIN pg_class c ON c.oid = d.adrelid
  JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
 WHERE c.relnamespace = 'public'::regnamespace AND c.relname <> 'goose_db_version' AND pg_get_expr(d.adbin, d.adrelid) ~* ` + clockCall + `
 ORDER BY 1`

// TestOnlyIssueNowReadsTheClock: no function but issue_now() reads a clock, nor any view or
// column default, so that a test that replaces issue_now() moves every judgement and stamp, and
// production has one clock. The check is shown to see a function that reads clock_timestamp()
// itself (the release rule before 00031), a view and a default that read now().
func TestOnlyIssueNowReadsTheClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, 1)
	if got := column(t, pool, sqlClockReaders); len(got) != 0 {
		t.Errorf("functions reading a clock of their own, not issue_now(): %v", got)
	}
	pgtest.BreakFunction(t, pool, "campaign_release_add", [2]string{"v_now := issue_now();", "v_now := clock_timestamp();"})
	if _, err := pool.Exec(ctx, `CREATE FUNCTION a_stamp() RETURNS timestamptz LANGUAGE sql RETURN now();
		CREATE VIEW a_view AS SELECT clock_timestamp() AS at;
		ALTER TABLE coupon_changes ALTER COLUMN changed_at SET DEFAULT now()`); err != nil {
		t.Fatal(err)
	}
	want := "a_stamp()|campaign_release_add(text,timestamp with time zone,integer,text)|default coupon_changes.changed_at|view a_view"
	if got := column(t, pool, sqlClockReaders); strings.Join(got, "|") != want {
		t.Errorf("the check found %v, want %s", got, want)
	}
}

// sqlInstantTakers lists the functions that a role of the schema may execute and that take an
// instant (timestamptz or timestamptz[]), with their argument types: all but the immutable ones,
// pure arithmetic on instants (coupon_expiry, campaign_inactive_reason) that reads and writes no
// table.
const sqlInstantTakers = `
SELECT p.oid::regprocedure::text, p.proname, array(SELECT format_type(a, NULL) FROM unnest(p.proargtypes) a)
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace AND p.provolatile <> 'i'
   AND ('timestamptz'::regtype = ANY (p.proargtypes) OR '_timestamptz'::regtype = ANY (p.proargtypes))
   AND EXISTS (SELECT FROM unnest(ARRAY['coupon_issue', 'coupon_relay', 'coupon_admin', 'coupon_console']) r
                WHERE has_function_privilege(r, p.oid, 'EXECUTE'))
 ORDER BY 1`

// argumentFor is an argument of type typ that passes the checks before the instants' (an id of
// the right shape, one entry an array), as SQL text.
var argumentFor = map[string]string{
	"text": "'x'", "integer": "1", "bigint": "1", "boolean": "false", "uuid": "gen_random_uuid()", "interval": "'1 minute'",
	"text[]": "ARRAY['x']", "uuid[]": "ARRAY[gen_random_uuid()]", "integer[]": "ARRAY[1]",
	"jsonb": "'{}'",
}

// instantRefusals calls every function sqlInstantTakers lists, as the owner, with each instant
// argument in turn one far out of range (infinity, -infinity, the year 2300, 1999; the others
// now), and returns each call that was not refused with 22023, and how many calls were made.
func instantRefusals(t *testing.T, pool *pgxpool.Pool) (wrong []string, calls int) {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, sqlInstantTakers)
	if err != nil {
		t.Fatal(err)
	}
	type fn struct {
		sig, name string
		args      []string
	}
	var fns []fn
	for rows.Next() {
		var f fn
		if err := rows.Scan(&f.sig, &f.name, &f.args); err != nil {
			t.Fatal(err)
		}
		fns = append(fns, f)
	}
	if err := rows.Err(); err != nil || len(fns) == 0 {
		t.Fatalf("no function takes an instant (%v)", err)
	}
	for _, f := range fns {
		for k, typ := range f.args {
			if typ != "timestamp with time zone" && typ != "timestamp with time zone[]" {
				continue
			}
			for _, bad := range []string{"infinity", "-infinity", "2300-01-01 00:00+09", "1999-12-31 23:59+09"} {
				args := make([]string, len(f.args))
				for j, ty := range f.args {
					switch {
					case j == k && ty == "timestamp with time zone":
						args[j] = fmt.Sprintf("'%s'::timestamptz", bad)
					case j == k:
						args[j] = fmt.Sprintf("ARRAY['%s'::timestamptz]", bad)
					case ty == "timestamp with time zone":
						args[j] = "now()"
					case ty == "timestamp with time zone[]":
						args[j] = "ARRAY[now()]"
					default:
						args[j] = argumentFor[ty]
					}
				}
				call := fmt.Sprintf("SELECT * FROM %s(%s)", f.name, strings.Join(args, ", "))
				calls++
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				_, err = tx.Exec(ctx, call)
				_ = tx.Rollback(ctx)
				if sqlStateOf(err) != pgerrcode.InvalidParameterValue {
					wrong = append(wrong, fmt.Sprintf("%s: %v, want 22023", call, err))
				}
			}
		}
	}
	return wrong, calls
}

// TestInstantArgumentsInRange: every function a role may call that takes an instant refuses one
// that is infinite or outside 2000-01-01 .. 2200-01-01 (22023), whichever argument it is in,
// before it writes or judges anything. Shown red on the broken variant, campaign_release_add
// without its instant_check (as before 00031): its release at infinity is taken.
func TestInstantArgumentsInRange(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, 1)
	if _, err := pool.Exec(context.Background(), `SELECT campaign_create('x', 1, 100, 1, NULL, NULL, NULL, NULL, 'a campaign for the calls',
		ARRAY[now() + interval '1 hour'], ARRAY[1], false)`); err != nil {
		t.Fatal(err)
	}
	wrong, calls := instantRefusals(t, pool)
	for _, w := range wrong {
		t.Error(w)
	}
	t.Logf("%d calls with an instant out of range, each refused", calls)
	pgtest.BreakFunction(t, pool, "campaign_release_add", [2]string{"  PERFORM instant_check('campaign_release_add', 'p_at', p_at);\n", ""})
	wrong, _ = instantRefusals(t, pool)
	if len(wrong) == 0 || !strings.Contains(strings.Join(wrong, "\n"), "campaign_release_add('x', 'infinity'") {
		t.Errorf("the broken variant: %q, want the release at infinity taken", wrong)
	}
}

// TestTablesHoldInstantsInRange: the campaign tables refuse an instant out of range, whoever
// writes it (23514, instants_in_range); and a database that an earlier release let hold one
// (campaign_create took 'infinity' before 00031) is moved into range by the migration: an end or
// an expiry at infinity becomes none, a start at -infinity none, a release at -infinity the
// range's first instant, and campaign show and list read every campaign after it.
func TestTablesHoldInstantsInRange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, db, p := migratedTo(t, 30)
	for _, q := range []string{
		`SELECT campaign_create('ENDLESS', 100, 1000, 1, '-infinity', 'infinity', NULL, NULL, 'before 00031')`,
		`SELECT campaign_create('EXPIRES', 100, 1000, 1, NULL, NULL, NULL, 'infinity', 'before 00031')`,
		`SELECT campaign_create('RELEASED', 100, 1000, 1, NULL, NULL, NULL, NULL, 'before 00031', ARRAY['-infinity'::timestamptz], ARRAY[5], false)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	list, err := campaign.List(ctx, pool)
	if err != nil {
		t.Fatalf("campaign list after the migration: %v", err)
	}
	for _, s := range list {
		got := fmt.Sprintf("%s %s %v %v %v", s.ID, s.State, s.StartsAt, s.EndsAt, s.CouponsExpireAt)
		want := fmt.Sprintf("%s %s <nil> <nil> <nil>", s.ID, campaign.StateActive)
		if got != want {
			t.Errorf("after the migration: %s, want %s", got, want)
		}
	}
	if s, err := campaign.Show(ctx, pool, "RELEASED"); err != nil || len(s.Schedule) != 1 ||
		!s.Schedule[0].At.Equal(time.Date(2000, 1, 1, 0, 0, 0, 0, time.FixedZone("JST", 9*3600))) || s.RemainingCoupons != 5 {
		t.Errorf("RELEASED after the migration: %+v %v, want its release at 2000-01-01 00:00 JST, 5 coupons open", s.Schedule, err)
	}
	for _, q := range []string{
		`UPDATE campaign_budgets SET ends_at = 'infinity' WHERE campaign_id = 'ENDLESS'`,
		`UPDATE campaign_budgets SET starts_at = '1999-12-31 23:59:59+09' WHERE campaign_id = 'ENDLESS'`,
		`UPDATE campaign_releases SET at = 'infinity'`,
	} {
		if _, err := pool.Exec(ctx, q); sqlStateOf(err) != pgerrcode.CheckViolation {
			t.Errorf("%s: %v, want 23514 (instants_in_range)", q, err)
		}
	}
}

// column is the first column of query's rows, as text.
func column(t *testing.T, pool *pgxpool.Pool, query string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), query)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCreateRefusesAPassedExpiry: campaign_create refuses a fixed coupon expiry at or before the
// database's clock (CI422: every coupon would be issued expired), judged by that clock, as
// campaign_change_validity does, and takes one a microsecond after it. The broken variant, the
// check left to couponctl's clock (campaign_create without it, as before 00031), creates a
// campaign already expired.
func TestCreateRefusesAPassedExpiry(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t, 1)
			at := time.Date(2026, 12, 24, 18, 0, 0, 0, time.FixedZone("JST", 9*3600))
			pgtest.SetClock(t, pool, at)
			if broken {
				pgtest.BreakFunction(t, pool, `campaign_create(text,integer,integer,integer,timestamp with time zone,timestamp with time zone,integer,timestamp with time zone,text)`,
					[2]string{"ELSIF p_expire_at <= issue_now() THEN", "ELSIF false THEN"})
			}
			create := `SELECT campaign_create($1, 100, 1000, 1, NULL, NULL, NULL, $2, 'expiry')`
			_, errAt := pool.Exec(ctx, create, "AT", at)
			_, errAfter := pool.Exec(ctx, create, "AFTER", at.Add(time.Microsecond))
			var wrong []string
			if sqlStateOf(errAt) != "CI422" || !strings.Contains(errAt.Error(), "would be issued expired") {
				wrong = append(wrong, fmt.Sprintf("an expiry at the database's clock: %v, want CI422", errAt))
			}
			if errAfter != nil {
				wrong = append(wrong, fmt.Sprintf("an expiry a microsecond after it: %v, want it taken", errAfter))
			}
			pgtest.Verdict(t, broken, wrong)
		})
	}
}
