package schema_test

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// scalarFixture is the definition of issue_coupon_scalar_fixture (testdata/issue_one_scalar.sql):
// issue_coupons_batch_v2's rules for one member written as a single-member body, the
// "scalar" variant of BenchmarkIssuanceBackendCPU.
func scalarFixture(t testing.TB) string {
	t.Helper()
	text, err := os.ReadFile("testdata/issue_one_scalar.sql")
	if err != nil {
		t.Fatal(err)
	}
	return string(text)
}

// scalarSkipsCap is scalarFixture broken: it reads no member's usage and adds to it past the cap,
// so R3 is never applied.
func scalarSkipsCap(t testing.TB) string {
	t.Helper()
	def := scalarFixture(t)
	for _, r := range [][2]string{
		{"IF v_amount > p_cap_yen OR v_used + v_amount > p_cap_yen THEN", "IF false THEN"},
		{"\n   WHERE mu.used_yen + EXCLUDED.used_yen <= p_cap_yen;", ";"},
	} {
		if !strings.Contains(def, r[0]) {
			t.Fatalf("scalar fixture: no %q to break", r[0])
		}
		def = strings.ReplaceAll(def, r[0], r[1])
	}
	return def
}

// twinStep is one step of a scalarCase on one twin: an issuance to member (a suffix; each twin
// has members of its own, as R3 is per member across campaigns), one call for the members of
// group (a batch; only between bodies that take batches), or, when sql is set, that statement
// run as the owner, %[1]s the twin's campaign id, %[2]s its member prefix and %[3]s an instant to
// the second that both twins share (instants the answers name must be equal).
type twinStep struct {
	member, trace, sql string
	group              []string
}

// scalarCase is a campaign made by create (the same %[1]s/%[2]s placeholders; "" for no
// campaign) and steps issuing on it.
type scalarCase struct {
	name string
	// want is the batch of one's results (or SQLSTATEs), one per issuance: the path the case
	// takes.
	want, create string
	steps        []twinStep
}

// oneAnswer is an issuance's answer with the coupon named by the step that sent its id.
type oneAnswer struct {
	Result, Coupon, Reason string
	Amount                 *int32
	ExpiresAt, NextRelease *time.Time
	SQLState               string
}

// twinRows is what a twin wrote: coupons, month rows and outbox rows with members as suffixes
// and coupons as step names, and its stripes' totals.
type twinRows struct {
	Coupons, Usage, Outbox []string
	Stripes                string
}

const (
	sqlTwinPlain = `SELECT count(*) FROM campaign_create('%[1]s', %[3]d, %[4]d, %[5]d, NULL, NULL, NULL, NULL, 'test')`
	// The releases are made a day later and moved back: campaign_create refuses one that has
	// passed (00034), and a case's first release may be an hour ago.
	sqlTwinKinds = `SELECT count(*) FROM campaign_create('%[1]s', 1000, %[4]d, %[5]d, NULL, NULL, NULL, NULL, 'test',
  ARRAY(SELECT a + interval '1 day' FROM unnest(%[6]s::timestamptz[]) WITH ORDINALITY AS r(a, o) ORDER BY o), %[7]s, %[8]t);
UPDATE campaign_releases SET at = at - interval '1 day' WHERE campaign_id = '%[1]s'`
	sqlTwinMonth = `to_char(clock_timestamp() AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM')`
)

// plain is a campaign of discount yen coupons and budget yen over stripes, then the statements.
func plain(discount, budget, stripes int, then ...string) string {
	return strings.Join(append([]string{fmt.Sprintf(sqlTwinPlain, "%[1]s", "%[2]s", discount, budget, stripes)}, then...), ";\n")
}

// kinds is a campaign of 1,000 yen coupons with releases (SQL arrays) and audience-only.
func kinds(budget, stripes int, releaseAt, releaseCoupons string, audience bool, then ...string) string {
	return strings.Join(append([]string{fmt.Sprintf(sqlTwinKinds, "%[1]s", "%[2]s", 0, budget, stripes, releaseAt, releaseCoupons, audience)}, then...), ";\n")
}

func issue(member string) twinStep     { return twinStep{member: member} }
func run(sql string) twinStep          { return twinStep{sql: sql} }
func group(members ...string) twinStep { return twinStep{group: members} }

// scalarCases are the answers of a batch of one that issue_coupon_scalar_fixture must give alike.
var scalarCases = []scalarCase{
	{"issued", "ISSUED", plain(1000, 10000, 1), []twinStep{issue("m1")}},
	{"issued/stripes=4,valid-days,trace", "ISSUED ISSUED", plain(1000, 10000, 4, `UPDATE campaign_budgets SET coupon_valid_days = 7 WHERE campaign_id = '%[1]s'`),
		[]twinStep{{member: "m1", trace: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, issue("m2")}},
	{"issued/expire-at", "ISSUED", plain(1000, 10000, 1, `UPDATE campaign_budgets SET coupons_expire_at = '%[3]s'::timestamptz + interval '3 days' WHERE campaign_id = '%[1]s'`),
		[]twinStep{issue("m1")}},
	{"already-issued", "ISSUED ALREADY_ISSUED", plain(1000, 10000, 1), []twinStep{issue("m1"), issue("m1")}},
	{"voided", "ISSUED COUPON_VOIDED", plain(1000, 10000, 1), []twinStep{issue("m1"),
		run(`SELECT count(*) FROM issued_coupons c, coupon_void(c.coupon_id, 'test', false) WHERE c.campaign_id = '%[1]s'`), issue("m1")}},
	{"voided/reissue-allowed", "ISSUED ISSUED", plain(1000, 10000, 1), []twinStep{issue("m1"),
		run(`SELECT count(*) FROM issued_coupons c, coupon_void(c.coupon_id, 'test', true) WHERE c.campaign_id = '%[1]s'`), issue("m1")}},
	{"monthly-cap/usage", "MONTHLY_CAP ISSUED", plain(1000, 10000, 1, `INSERT INTO member_monthly_usage (member_id, month, used_yen) VALUES ('%[2]sm1', `+sqlTwinMonth+`, 1500)`),
		[]twinStep{issue("m1"), issue("m2")}},
	{"monthly-cap/coupon-above-cap", "MONTHLY_CAP", plain(2500, 10000, 1), []twinStep{issue("m1")}},
	{"budget-exceeded", "ISSUED BUDGET_EXCEEDED", plain(1000, 1000, 1), []twinStep{issue("m1"), issue("m2")}},
	{"not-started", "CAMPAIGN_NOT_ACTIVE", plain(1000, 10000, 1, `UPDATE campaign_budgets SET starts_at = clock_timestamp() + interval '1 hour' WHERE campaign_id = '%[1]s'`),
		[]twinStep{issue("m1")}},
	{"ended", "CAMPAIGN_NOT_ACTIVE", plain(1000, 10000, 1, `UPDATE campaign_budgets SET ends_at = clock_timestamp() - interval '1 hour' WHERE campaign_id = '%[1]s'`),
		[]twinStep{issue("m1")}},
	{"paused", "CAMPAIGN_NOT_ACTIVE", plain(1000, 10000, 1, `UPDATE campaign_budgets SET paused_at = clock_timestamp() WHERE campaign_id = '%[1]s'`),
		[]twinStep{issue("m1")}},
	{"expiry-passed", "CAMPAIGN_NOT_ACTIVE", plain(1000, 10000, 1, `UPDATE campaign_budgets SET coupons_expire_at = clock_timestamp() - interval '1 minute' WHERE campaign_id = '%[1]s'`),
		[]twinStep{issue("m1")}},
	{"audience", "ISSUED NOT_ELIGIBLE", kinds(10000, 1, "NULL", "NULL", true, `INSERT INTO campaign_audience (campaign_id, member_id) VALUES ('%[1]s', '%[2]sm1')`),
		[]twinStep{issue("m1"), issue("m2")}},
	{"audience/paused", "CAMPAIGN_NOT_ACTIVE NOT_ELIGIBLE", kinds(10000, 1, "NULL", "NULL", true, `INSERT INTO campaign_audience (campaign_id, member_id) VALUES ('%[1]s', '%[2]sm1')`,
		`UPDATE campaign_budgets SET paused_at = clock_timestamp() WHERE campaign_id = '%[1]s'`),
		[]twinStep{issue("m1"), issue("m2")}},
	{"release-not-open", "CAMPAIGN_NOT_ACTIVE", kinds(2000, 1, "ARRAY['%[3]s'::timestamptz + interval '1 hour']", "'{2}'", false),
		[]twinStep{issue("m1")}},
	{"release-spent", "ISSUED BUDGET_EXCEEDED", kinds(3000, 1,
		"ARRAY['%[3]s'::timestamptz - interval '1 hour', '%[3]s'::timestamptz + interval '1 hour']", "'{1,2}'", false),
		[]twinStep{issue("m1"), issue("m2")}},
	{"release-spent/stripes=4", "ISSUED BUDGET_EXCEEDED", kinds(8000, 4,
		"ARRAY['%[3]s'::timestamptz - interval '1 hour', '%[3]s'::timestamptz + interval '1 hour']", "'{1,4}'", false),
		[]twinStep{issue("m1"), issue("m2")}},
	{"not-placed/retry", "RETRY", plain(1000, 2000, 2, `UPDATE campaign_budgets SET issued_yen = budget_yen WHERE campaign_id = '%[1]s' AND stripe = 0`,
		`UPDATE campaign_budgets SET paused_at = clock_timestamp() WHERE campaign_id = '%[1]s' AND stripe = 1`),
		[]twinStep{issue("m1")}},
	{"unknown-campaign", "UNKNOWN_CAMPAIGN", "", []twinStep{issue("m1")}},
	{"refused/member-id", "22023", plain(1000, 10000, 1), []twinStep{issue("m 1")}},
	{"refused/trace", "22023", plain(1000, 10000, 1), []twinStep{{member: "m1", trace: "00-xyz"}}},
}

// TestScalarFixtureAnswersAsBatchOfOne holds the scalar variant of BenchmarkIssuanceBackendCPU
// to the rules: for each case, a batch of one (issue_coupons_batch_v2) on one twin campaign and
// issue_coupon_scalar_fixture on the other give the same answers, every field, and write the same
// rows. The fixture broken to skip R3 (scalarSkipsCap) is told apart.
func TestScalarFixtureAnswersAsBatchOfOne(t *testing.T) {
	t.Parallel()
	t.Run("fixture", func(t *testing.T) {
		t.Parallel()
		if diff := twins(t, scalarFixture(t), fnScalar, scalarCases); len(diff) > 0 {
			t.Errorf("the scalar fixture differs from a batch of one:\n%s", strings.Join(diff, "\n"))
		}
	})
	t.Run("broken-skips-cap", func(t *testing.T) {
		t.Parallel()
		diff := twins(t, scalarSkipsCap(t), fnScalar, scalarCases)
		for _, want := range []string{"monthly-cap/usage", "monthly-cap/coupon-above-cap"} {
			found := false
			for _, d := range diff {
				found = found || strings.HasPrefix(d, want+":")
			}
			if !found {
				t.Errorf("the fixture skipping R3 passes %s; differences:\n%s", want, strings.Join(diff, "\n"))
			}
		}
	})
}

// fnScalar is issue_coupon_scalar_fixture, the one body of these twins that takes one member as
// scalars.
const fnScalar = "issue_coupon_scalar_fixture"

// twins creates def, a body of the rules named fn, on a migrated database of its own, runs every
// case on twins, issue_coupons_batch_v2 on one and fn on the other, and returns the differences,
// one line each, prefixed with the case's name. The twins issue milliseconds apart, each at the
// database's clock: a case run across a Tokyo midnight would differ on its coupons' validity
// days and month.
func twins(t *testing.T, def, fn string, cases []scalarCase) []string {
	t.Helper()
	ctx := context.Background()
	db := openPool(t, pgtest.URL(t))
	if _, err := db.Exec(ctx, def); err != nil {
		t.Fatal(err)
	}
	var diff []string
	for k, c := range cases {
		var got [2][]oneAnswer
		var rows [2]twinRows
		instant := time.Now().Truncate(time.Second).Format(time.RFC3339)
		for twin, fn := range []string{"issue_coupons_batch_v2", fn} {
			campaignID, prefix := fmt.Sprintf("T%d_%c", k, "bf"[twin]), fmt.Sprintf("%c%d-", "bf"[twin], k)
			if c.create != "" {
				exec(t, db, fmt.Sprintf(c.create, campaignID, prefix, instant))
			}
			coupons := map[string]string{}
			for j, s := range c.steps {
				if s.sql != "" {
					exec(t, db, fmt.Sprintf(s.sql, campaignID, prefix, instant))
					continue
				}
				if s.group != nil {
					got[twin] = append(got[twin], issueGroup(ctx, db, fn, campaignID, j, prefix, s.group, coupons)...)
					continue
				}
				id := uuid.New()
				coupons[id.String()] = fmt.Sprintf("step%d", j)
				a := issueOne(ctx, db, fn, campaignID, id, prefix+s.member, s.trace)
				if name, ok := coupons[a.Coupon]; ok {
					a.Coupon = name
				}
				got[twin] = append(got[twin], a)
			}
			rows[twin] = twinRowsOf(t, db, campaignID, prefix, coupons)
		}
		var results []string
		for _, a := range got[0] {
			results = append(results, a.Result+a.SQLState)
		}
		if strings.Join(results, " ") != c.want {
			t.Errorf("%s: the batch answers %v, want %s: the case no longer takes its path", c.name, results, c.want)
		}
		for j := range max(len(got[0]), len(got[1])) {
			if j >= len(got[0]) || j >= len(got[1]) || !reflect.DeepEqual(got[0][j], got[1][j]) {
				diff = append(diff, fmt.Sprintf("%s: answer %d: batch %s, %s %s", c.name, j, show(got[0], j), fn, show(got[1], j)))
			}
		}
		if !reflect.DeepEqual(rows[0], rows[1]) {
			diff = append(diff, fmt.Sprintf("%s: rows: batch %+v, %s %+v", c.name, rows[0], fn, rows[1]))
		}
	}
	return diff
}

func exec(t *testing.T, db *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func show(a []oneAnswer, j int) string {
	if j >= len(a) {
		return "none"
	}
	return fmt.Sprintf("%+v (amount %v, expires %v, next release %v)", a[j], deref(a[j].Amount), deref(a[j].ExpiresAt), deref(a[j].NextRelease))
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// issueOne issues coupon id to member through fn, a function with issue_coupons_batch_v2's
// arguments given one entry, or fnScalar. A refusal is answered as its SQLSTATE.
func issueOne(ctx context.Context, db *pgxpool.Pool, fn, campaignID string, id uuid.UUID, member, trace string) oneAnswer {
	sql := `SELECT result, coupon, amount, reason, expires_at, next_release_at
  FROM ` + fn + `($1, ARRAY[$2::uuid], ARRAY[$3::text], ARRAY[$4::timestamptz], 30000, ARRAY[$5::text])`
	if fn == fnScalar {
		sql = `SELECT result, coupon, amount, reason, expires_at, next_release_at
  FROM issue_coupon_scalar_fixture($1, $2, $3, $4, 30000, $5)`
	}
	var a oneAnswer
	var coupon, reason *string
	var tr *string
	if trace != "" {
		tr = &trace
	}
	if err := db.QueryRow(ctx, sql, campaignID, id, member, time.Now(), tr).Scan(&a.Result, &coupon, &a.Amount, &reason, &a.ExpiresAt, &a.NextRelease); err != nil {
		return oneAnswer{SQLState: code(err)}
	}
	if coupon != nil {
		a.Coupon = *coupon
	}
	if reason != nil {
		a.Reason = *reason
	}
	return a
}

// twinRowsOf reads what the steps wrote on campaignID and its members (prefix): coupons named by
// the step that sent them (other ids by themselves).
func twinRowsOf(t *testing.T, db *pgxpool.Pool, campaignID, prefix string, coupons map[string]string) twinRows {
	t.Helper()
	ctx := context.Background()
	name := func(id string) string {
		if n, ok := coupons[id]; ok {
			return n
		}
		return id
	}
	var r twinRows
	for _, q := range []struct {
		into *[]string
		sql  string
	}{
		{&r.Coupons, `SELECT c.coupon_id::text, format('%s %s %s voided=%s reissue=%s expires=%s', substr(c.member_id, length($2) + 1), c.month, c.amount_yen,
		   c.voided_at IS NOT NULL, c.reissue_allowed, c.expires_at)
		   FROM issued_coupons c WHERE c.campaign_id = $1 ORDER BY c.issued_at`},
		{&r.Outbox, `SELECT x.coupon_id::text, format('%s trace=%s at-issue=%s', substr(x.member_id, length($2) + 1), x.trace_parent, x.created_at = c.issued_at)
		   FROM notification_outbox x JOIN issued_coupons c USING (coupon_id) WHERE c.campaign_id = $1 ORDER BY c.issued_at`},
		{&r.Usage, `SELECT '', format('%s %s %s', substr(mu.member_id, length($2) + 1), mu.month, mu.used_yen)
		   FROM member_monthly_usage mu WHERE $1::text IS NOT NULL AND mu.member_id LIKE $2 || '%' ORDER BY mu.member_id, mu.month`},
	} {
		rows, err := db.Query(ctx, q.sql, campaignID, prefix)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, s string
			if err := rows.Scan(&id, &s); err != nil {
				t.Fatal(err)
			}
			*q.into = append(*q.into, strings.TrimSpace(name(id)+" "+s))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The stripe a lone issuance takes is chosen at random: its totals, and each stripe's bound.
	if err := db.QueryRow(ctx, `SELECT format('stripes=%s issued=%s within=%s', count(*), sum(issued_yen), bool_and(issued_yen <= budget_yen))
	   FROM campaign_budgets WHERE campaign_id = $1`, campaignID).Scan(&r.Stripes); err != nil {
		t.Fatal(err)
	}
	return r
}
