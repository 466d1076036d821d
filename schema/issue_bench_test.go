package schema_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema"
)

// BenchmarkIssuanceBackendCPU is the database's cost of an issuance: the CPU time of the backend
// that runs the call (/proc/<pid>/schedstat, so the server must run on this machine), reported per
// member issued as <variant>-us/member. Each call issues coupons to members never seen before,
// one transaction per call, on a database that already holds 100,000 coupons and month rows of
// other members (analyzed, so that the plans are those of tables in use), through bodies of the
// rules created on two such databases, each on a session of its own:
//   - today and today-again: issue_coupons_batch_v3 on a database as it was before 00038 (its
//     body as 00033 wrote it, the formats' CHECKs as 00002's regular expressions;
//     beforeThisRelease): the body 00038 cuts, twice, an A/A control of the measure;
//   - checks: 00033's body on the migrated database (00038's CHECKs), as
//     issue_coupons_batch_v3_00033: what the CHECKs alone changed;
//
// and, on the migrated database too:
//   - 00011: issue_coupon as 00011 wrote it (the previous release's own body, with the rules as
//     they were then), created as issue_coupon_00011;
//   - 00027: issue_coupons_batch_v2 as 00027 wrote it, created as issue_coupons_batch_v2_00027;
//   - current and current-again: issue_coupons_batch_v3 as migrated, on two sessions, another
//     A/A control;
//   - scalar: issue_coupon_scalar_fixture (testdata/issue_one_scalar.sql), the current rules for
//     one member written as a single-member body, without the batch's arrays
//     (TestScalarFixtureAnswersAsBatchOfOne holds it to the batch's answers and rows);
//   - interface: the scalar body behind the batch's interface, arrays of one entry in and a table
//     out (issue_batch_interface_fixture), one member a call only;
//   - lean-set and lean-per-member: the leanest bodies of the rules for n members this project
//     wrote, set-based and one statement a member (testdata/issue_batch_lean.sql;
//     TestLeanFixturesAnswerAsTheBatch holds them and the interface to the batch).
//
// Each iteration calls every variant once, the first rotating, so that a change of the machine's
// load falls on all of them. Sub-benchmarks: one member a call on a campaign of 1 and of 16
// budget stripes (member ids "m<n>"), the same on 1 stripe with ids of a LINE user's shape
// ("U" and 32 hex digits), and 32 members a call (the batch bodies only) on 1 stripe. A round is
// a run on a fresh server:
//
//	for round in 1 2 3 4; do
//	  go test ./schema -run '^$' -bench BenchmarkIssuanceBackendCPU -benchtime 1000x -count 1
//	done
//
// The test server runs with fsync off (localpg); ns/op is the client's wall time for all the
// variants of an iteration, not the figure.
func BenchmarkIssuanceBackendCPU(b *testing.B) {
	ctx := context.Background()
	url, todayURL := pgtest.URL(b), pgtest.URL(b)
	owner, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer owner.Close(ctx)
	for _, def := range []string{
		oldBody(b, "00033_stripe_judged_at_lock.sql", "CREATE OR REPLACE FUNCTION issue_coupons_batch_v3(", "\n$function$;",
			"CREATE OR REPLACE FUNCTION public."+fnToday+"("),
		// 00011's body called campaign_inactive_reason's 4-argument form, which 00029 dropped: the
		// 5-argument form with no expiry is the same rule.
		strings.NewReplacer("paused_at, p_issued_at)", "paused_at, NULL, p_issued_at)", "paused_at, greatest(", "paused_at, NULL, greatest(").Replace(
			oldBody(b, "00011_after_issuance.sql", "CREATE FUNCTION issue_coupon(", "\n$$;", "CREATE FUNCTION issue_coupon_00011(")),
		oldBody(b, "00027_next_release.sql", "CREATE OR REPLACE FUNCTION public.issue_coupons_batch_v2(", "\n$function$;",
			"CREATE OR REPLACE FUNCTION public.issue_coupons_batch_v2_00027("),
		scalarFixture(b), interfaceFixture(b), leanFixture(b, "set"), leanFixture(b, "per_member"),
	} {
		if _, err := owner.Exec(ctx, def); err != nil {
			b.Fatal(err)
		}
	}
	today, err := pgx.Connect(ctx, todayURL)
	if err != nil {
		b.Fatal(err)
	}
	defer today.Close(ctx)
	if _, err := today.Exec(ctx, beforeThisRelease(b)); err != nil {
		b.Fatal(err)
	}
	for _, db := range []*pgx.Conn{owner, today} {
		fillBenchDB(ctx, b, db)
	}
	var member atomic.Int64
	call := func(b *testing.B, conn *pgx.Conn, fn, campaignID string, n int, idFmt string) {
		if fn == fnCurrent || fn == fnToday {
			ids, members, traces := make([]uuid.UUID, n), make([]string, n), make([]*string, n)
			for k := range n {
				ids[k], members[k] = uuid.New(), fmt.Sprintf(idFmt, member.Add(1))
			}
			var issued int
			if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE result = 'ISSUED') FROM `+fn+`($1, $2, $3, $4)`,
				campaignID, ids, members, traces).Scan(&issued); err != nil || issued != n {
				b.Fatalf("%s: %d of %d issued, %v", fn, issued, n, err)
			}
			return
		}
		if fn == "issue_coupon_00011" || fn == fnScalar {
			var res string
			args := []any{uuid.New(), campaignID, fmt.Sprintf(idFmt, member.Add(1)), time.Now()}
			if fn == fnScalar {
				args[0], args[1] = args[1], args[0]
			}
			if err := conn.QueryRow(ctx, `SELECT result FROM `+fn+`($1, $2, $3, $4, 30000, NULL)`, args...).Scan(&res); err != nil || res != "ISSUED" {
				b.Fatalf("%s: %s, %v", fn, res, err)
			}
			return
		}
		ids, members, at, traces := make([]uuid.UUID, n), make([]string, n), make([]time.Time, n), make([]*string, n)
		for k := range n {
			ids[k], members[k], at[k] = uuid.New(), fmt.Sprintf(idFmt, member.Add(1)), time.Now()
		}
		var issued int
		if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE result = 'ISSUED') FROM `+fn+`($1, $2, $3, $4, 30000, $5)`,
			campaignID, ids, members, at, traces).Scan(&issued); err != nil || issued != n {
			b.Fatalf("%s: %d of %d issued, %v", fn, issued, n, err)
		}
	}
	type variant struct {
		name, fn string
		one      bool // takes one member a call
		conn     *pgx.Conn
		pid      int
	}
	var variants []*variant
	for _, v := range []struct {
		name, fn string
		one      bool
		url      string
	}{
		{"00011", "issue_coupon_00011", true, url}, {"00027", "issue_coupons_batch_v2_00027", false, url},
		{"today", fnCurrent, false, todayURL}, {"today-again", fnCurrent, false, todayURL}, {"checks", fnToday, false, url},
		{"current", fnCurrent, false, url}, {"current-again", fnCurrent, false, url}, {"scalar", fnScalar, true, url}, {"interface", fnInterface, true, url},
		{"lean-set", fnLeanSet, false, url}, {"lean-per-member", fnLeanPerMember, false, url},
	} {
		conn, err := pgx.Connect(ctx, v.url)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(ctx)
		var pid int
		if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			b.Fatal(err)
		}
		variants = append(variants, &variant{v.name, v.fn, v.one, conn, pid})
	}
	for _, g := range []struct {
		name, campaignID string
		members          int
		idFmt            string // the members' ids
	}{
		{"one/stripes=1", "S1", 1, "m%d"},
		{"one/stripes=16", "S16", 1, "m%d"},
		{"one-line-id/stripes=1", "S1", 1, "U%032x"},
		{"batch32/stripes=1", "S1", 32, "m%d"},
	} {
		var vs []*variant
		for _, v := range variants {
			if g.members == 1 || !v.one {
				vs = append(vs, v)
			}
		}
		for _, v := range vs {
			call(b, v.conn, v.fn, g.campaignID, g.members, g.idFmt) // the session's plans, outside the count
		}
		b.Run(g.name, func(b *testing.B) {
			used := make([]time.Duration, len(vs))
			for i := range b.N {
				for j := range vs { // each variant in turn, the first rotating
					k := (i + j) % len(vs)
					before := backendCPU(b, vs[k].pid)
					call(b, vs[k].conn, vs[k].fn, g.campaignID, g.members, g.idFmt)
					used[k] += backendCPU(b, vs[k].pid) - before
				}
			}
			for k, v := range vs {
				b.ReportMetric(float64(used[k].Microseconds())/float64(b.N*g.members), v.name+"-us/member")
			}
		})
	}
}

// fnCurrent is the issuance's body as migrated: the current interface, four arguments. fnToday
// is its body before 00038 (00033's text), under a name of its own.
const (
	fnCurrent = "issue_coupons_batch_v3"
	fnToday   = "issue_coupons_batch_v3_00033"
)

// beforeThisRelease is SQL that makes a migrated database what it was before 00038: the id and
// month formats of the tables the issuance writes as 00002's regular expressions, and the
// issuance's body as 00033 wrote it.
func beforeThisRelease(b *testing.B) string {
	b.Helper()
	var sql strings.Builder
	for _, table := range []string{"issued_coupons", "member_monthly_usage"} {
		fmt.Fprintf(&sql, "ALTER TABLE %s DROP CONSTRAINT month_format, DROP CONSTRAINT member_id_format,\n"+
			"  ADD CONSTRAINT month_format CHECK (%s) NOT VALID, ADD CONSTRAINT member_id_format CHECK (%s) NOT VALID;\n",
			table, regexMonth, regexMemberID)
	}
	sql.WriteString(oldBody(b, "00033_stripe_judged_at_lock.sql", "CREATE OR REPLACE FUNCTION issue_coupons_batch_v3(", "\n$function$;",
		"CREATE OR REPLACE FUNCTION public.issue_coupons_batch_v3("))
	return sql.String()
}

// fillBenchDB creates the benchmark's campaigns on db, S1 and S16 of 1 and 16 stripes, and
// 100,000 coupons and month rows of other members, analyzed.
func fillBenchDB(ctx context.Context, b *testing.B, db *pgx.Conn) {
	b.Helper()
	for _, stripes := range []int{1, 16} {
		c := campaign.Campaign{ID: "S" + strconv.Itoa(stripes), DiscountYen: 1, BudgetYen: 1 << 30, Stripes: stripes}
		if err := campaign.Create(ctx, db, c); err != nil {
			b.Fatal(err)
		}
	}
	if err := campaign.Create(ctx, db, campaign.Campaign{ID: "FILL", DiscountYen: 1, BudgetYen: 1 << 30}); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(ctx, `
INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at)
SELECT gen_random_uuid(), 'FILL', 'f' || g, to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 1, now() FROM generate_series(1, 100000) g;
INSERT INTO member_monthly_usage (member_id, month, used_yen)
SELECT 'f' || g, to_char(now() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 1 FROM generate_series(1, 100000) g;
ANALYZE`); err != nil {
		b.Fatal(err)
	}
}

// oldBody is the function definition of migration file that starts at from and ends with to
// (included), its head replaced by as: an earlier body of a function under a name of its own.
func oldBody(b *testing.B, file, from, to, as string) string {
	b.Helper()
	text, err := fs.ReadFile(schema.Migrations(), file)
	if err != nil {
		b.Fatal(err)
	}
	s := string(text)
	i := strings.Index(s, from)
	j := strings.Index(s[max(i, 0):], to)
	if i < 0 || j < 0 {
		b.Fatalf("%s: no %q ... %q", file, from, to)
	}
	return as + s[i+len(from):i+j+len(to)]
}

// backendCPU is the CPU time backend pid has run: the first field of /proc/<pid>/schedstat, in
// nanoseconds. It skips b when the server's processes are not on this machine.
func backendCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	text, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		b.Skipf("the backend's CPU time: %v (the server must run on this machine)", err)
	}
	ns, err := strconv.ParseInt(strings.Fields(string(text))[0], 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(ns)
}
