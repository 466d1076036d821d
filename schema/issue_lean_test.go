package schema_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Bodies of the rules beside the issuance's for BenchmarkIssuanceBackendCPU, each held to the
// batch's answers and rows (issue_coupons_batch_v2, the previous release's interface, which
// answers through issue_coupons_batch_v3) by TestLeanFixturesAnswerAsTheBatch.
const (
	fnInterface     = "issue_batch_interface_fixture"
	fnLeanSet       = "issue_batch_lean_set_fixture"
	fnLeanPerMember = "issue_batch_lean_per_member_fixture"
)

// leanFixture is the definition of fnLeanSet (kind "set") or fnLeanPerMember (kind
// "per_member"): testdata/issue_batch_lean.sql with the member phase of
// testdata/issue_batch_lean_<kind>.sql and the stripe loops of issue_coupons_batch_v3's current
// text (the campaign's amount and kind in the template's variables, where it reads them from its
// verdict v).
func leanFixture(t testing.TB, kind string) string {
	t.Helper()
	tmpl, err := template.ParseFiles("testdata/issue_batch_lean.sql")
	if err != nil {
		t.Fatal(err)
	}
	members, err := os.ReadFile("testdata/issue_batch_lean_" + kind + ".sql")
	if err != nil {
		t.Fatal(err)
	}
	current, err := os.ReadFile("current/issue_coupons_batch_v3.sql")
	if err != nil {
		t.Fatal(err)
	}
	const from, to = "    -- 4. R1 and the campaign's state", "    IF cardinality(v_left) > 0 THEN\n      -- Not placed"
	i := strings.Index(string(current), from)
	j := strings.Index(string(current), to)
	if i < 0 || j < i {
		t.Fatalf("current/issue_coupons_batch_v3.sql: no stripe loops between %q and %q", from, to)
	}
	stripes := strings.NewReplacer("v.discount_yen", "v_amount", "v.releases", "v_releases").Replace(string(current[i:j]))
	var def strings.Builder
	if err := tmpl.Execute(&def, struct{ Name, Members, Stripes string }{"issue_batch_lean_" + kind + "_fixture", string(members), stripes}); err != nil {
		t.Fatal(err)
	}
	return def.String()
}

// interfaceFixture is the definition of fnInterface: issue_coupon_scalar_fixture's body behind
// issue_coupons_batch_v2's interface (arrays of one entry in, checked as the batch checks their
// shape, and a table of one row out), so that what the interface alone costs a lone issuance is
// told from what the batch's body costs. It refuses any other number of entries.
func interfaceFixture(t testing.TB) string {
	t.Helper()
	def := scalarFixture(t)
	def = def[strings.Index(def, "CREATE FUNCTION"):]
	def = fnInterface + `(p_campaign_id text, p_coupon_ids uuid[], p_member_ids text[], p_issued_ats timestamptz[],
                      p_cap_yen integer, p_trace_parents text[])
RETURNS TABLE (i integer, result text, coupon text, amount integer, reason text, expires_at timestamptz,
               next_release_at timestamptz)
` + def[strings.Index(def, "LANGUAGE plpgsql"):]
	for _, r := range [][2]string{
		{"DECLARE\n", "DECLARE\n  p_coupon_id uuid := p_coupon_ids[1];\n  p_member_id text := p_member_ids[1];\n" +
			"  p_issued_at timestamptz := p_issued_ats[1];\n  p_trace_parent text := p_trace_parents[1];\n"},
		{"BEGIN\n", "BEGIN\n  IF NOT (cardinality(p_member_ids) = 1 AND arg_array_fits(p_member_ids, 1, false) AND arg_array_fits(p_coupon_ids, 1, false)\n" +
			"          AND arg_array_fits(p_issued_ats, 1, false) AND arg_array_fits(p_trace_parents, 1, true)) THEN\n" +
			"    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = '" + fnInterface + ": one member';\n  END IF;\n"},
		{"RETURN;", "i := 1; RETURN NEXT; RETURN;"},
		{"  expires_at := coupon_expiry(p_issued_at, v_days, v_until);\nEND", "  expires_at := coupon_expiry(p_issued_at, v_days, v_until);\n  i := 1; RETURN NEXT;\nEND"},
	} {
		if !strings.Contains(def, r[0]) {
			t.Fatalf("scalar fixture: no %q to put behind the batch's interface", r[0])
		}
		def = strings.ReplaceAll(def, r[0], r[1])
	}
	return "CREATE FUNCTION " + def
}

// leanPerMemberSkipsCap is fnLeanPerMember broken: its usage upsert adds past the cap, so a
// member's coupons can exceed R3 when its read raced a concurrent issuance, and its read
// refuses nothing for the cap.
func leanPerMemberSkipsCap(t testing.TB) string {
	t.Helper()
	def := leanFixture(t, "per_member")
	for _, r := range [][2]string{
		{"ELSIF v_amount > p_cap_yen OR (SELECT mu.used_yen", "ELSIF false AND (SELECT mu.used_yen"},
		{"\n     WHERE mu.used_yen + EXCLUDED.used_yen <= p_cap_yen;", ";"},
	} {
		if !strings.Contains(def, r[0]) {
			t.Fatalf("lean per-member fixture: no %q to break", r[0])
		}
		def = strings.ReplaceAll(def, r[0], r[1])
	}
	return def
}

// batchCases are calls of several members, each answered and written alike by every body that
// takes batches.
var batchCases = []scalarCase{
	// m3 holds a coupon, one of the budget's three; m2 is at the cap; m1 is given twice: m1 and
	// m4 take the last two, m5 finds none.
	{"group/mixed", "ISSUED MONTHLY_CAP ISSUED ALREADY_ISSUED ALREADY_ISSUED ISSUED BUDGET_EXCEEDED",
		plain(1000, 3000, 2, `INSERT INTO member_monthly_usage (member_id, month, used_yen) VALUES ('%[2]sm2', `+sqlTwinMonth+`, 1500)`),
		[]twinStep{issue("m3"), group("m2", "m1", "m1", "m3", "m4", "m5")}},
	{"group/audience", "ISSUED NOT_ELIGIBLE ISSUED", kinds(10000, 1, "NULL", "NULL", true,
		`INSERT INTO campaign_audience (campaign_id, member_id) VALUES ('%[1]s', '%[2]sm1'), ('%[1]s', '%[2]sm3')`),
		[]twinStep{group("m3", "m2", "m1")}},
	{"group/release-spent/stripes=4", "ISSUED BUDGET_EXCEEDED BUDGET_EXCEEDED", kinds(8000, 4,
		"ARRAY['%[3]s'::timestamptz - interval '1 hour', '%[3]s'::timestamptz + interval '1 hour']", "'{1,4}'", false),
		[]twinStep{group("m1", "m2", "m3")}},
	{"group/voided", "ISSUED COUPON_VOIDED ISSUED", plain(1000, 10000, 1), []twinStep{issue("m1"),
		run(`SELECT count(*) FROM issued_coupons c, coupon_void(c.coupon_id, 'test', false) WHERE c.campaign_id = '%[1]s'`), group("m1", "m2")}},
	{"group/refused/member-id", "22023", plain(1000, 10000, 1), []twinStep{group("m1", "m 2")}},
	{"group/unknown-campaign", "UNKNOWN_CAMPAIGN UNKNOWN_CAMPAIGN", "", []twinStep{group("m1", "m2")}},
}

// TestLeanFixturesAnswerAsTheBatch holds the bodies BenchmarkIssuanceBackendCPU measures beside the
// batch to its answers and rows: the interface fixture in every case of one member
// (scalarCases), the two lean bodies in those and in calls of several members (batchCases). The
// lean per-member body broken to skip R3 is told apart in both.
func TestLeanFixturesAnswerAsTheBatch(t *testing.T) {
	t.Parallel()
	cases := append(append([]scalarCase(nil), scalarCases...), batchCases...)
	for _, f := range []struct {
		fn    string
		def   func(testing.TB) string
		cases []scalarCase
	}{
		{fnInterface, interfaceFixture, scalarCases},
		{fnLeanSet, func(t testing.TB) string { return leanFixture(t, "set") }, cases},
		{fnLeanPerMember, func(t testing.TB) string { return leanFixture(t, "per_member") }, cases},
	} {
		t.Run(f.fn, func(t *testing.T) {
			t.Parallel()
			if diff := twins(t, f.def(t), f.fn, f.cases); len(diff) > 0 {
				t.Errorf("%s differs from the batch:\n%s", f.fn, strings.Join(diff, "\n"))
			}
		})
	}
	t.Run("broken-skips-cap", func(t *testing.T) {
		t.Parallel()
		diff := twins(t, leanPerMemberSkipsCap(t), fnLeanPerMember, cases)
		for _, want := range []string{"monthly-cap/usage", "monthly-cap/coupon-above-cap", "group/mixed"} {
			found := false
			for _, d := range diff {
				found = found || strings.HasPrefix(d, want+":")
			}
			if !found {
				t.Errorf("the lean per-member body skipping R3 passes %s; differences:\n%s", want, strings.Join(diff, "\n"))
			}
		}
	})
}

// issueGroup issues one call of fn (issue_coupons_batch_v2's arguments) to members (suffixes of
// prefix), each with a new coupon id named "step<j>.<k>" in coupons, and returns the answers in
// entry order. A refusal is one answer, its SQLSTATE.
func issueGroup(ctx context.Context, db *pgxpool.Pool, fn, campaignID string, j int, prefix string, members []string, coupons map[string]string) []oneAnswer {
	ids, names, at := make([]uuid.UUID, len(members)), make([]string, len(members)), make([]time.Time, len(members))
	for k, m := range members {
		ids[k], names[k], at[k] = uuid.New(), prefix+m, time.Now()
		coupons[ids[k].String()] = fmt.Sprintf("step%d.%d", j, k)
	}
	rows, err := db.Query(ctx, `SELECT result, coupon, amount, reason, expires_at, next_release_at
  FROM `+fn+`($1, $2, $3, $4, 30000, $5) ORDER BY i`, campaignID, ids, names, at, make([]*string, len(members)))
	if err != nil {
		return []oneAnswer{{SQLState: code(err)}}
	}
	defer rows.Close()
	var answers []oneAnswer
	for rows.Next() {
		var a oneAnswer
		var coupon, reason *string
		if err := rows.Scan(&a.Result, &coupon, &a.Amount, &reason, &a.ExpiresAt, &a.NextRelease); err != nil {
			return []oneAnswer{{SQLState: code(err)}}
		}
		if coupon != nil {
			a.Coupon = *coupon
			if name, ok := coupons[a.Coupon]; ok {
				a.Coupon = name
			}
		}
		if reason != nil {
			a.Reason = *reason
		}
		answers = append(answers, a)
	}
	if err := rows.Err(); err != nil {
		return []oneAnswer{{SQLState: code(err)}}
	}
	return answers
}
