package schema_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/ids"
	"github.com/mops/coupon-api/shared/issuance"
)

// The SECURITY DEFINER functions judge their own arguments (issue 30, item 2; migration 00021):
// each is called here as the role that may call it, with the arguments a compromised caller can
// forge, and each forgery is refused (22023, or CI422 for the rules' verb) or answered without a
// write, the tables counted before and after. The broken variant is the issuance with the
// argument check of 00015 (cardinalities and NULLs only) in place of 00021's: against it the
// forgeries marked wrote write, as they did on main before 00021. Since 00031 the issuance's body
// (issue_coupons_batch_v3) takes no issue time and no cap, so a forged time or cap has nothing
// to reach even unchecked: the previous release's wrapper still refuses a forged time (22023).

// check00015 is the issuance's argument check before 00021, which trusted the caller's array
// bounds and ids, on the arguments issue_coupons_batch_v3 takes.
const check00015 = `  IF p_campaign_id IS NULL OR n IS NULL
     OR cardinality(p_coupon_ids) IS DISTINCT FROM n OR cardinality(p_trace_parents) IS DISTINCT FROM n
     OR array_position(p_member_ids, NULL) IS NOT NULL OR array_position(p_coupon_ids, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
      MESSAGE = 'issue_coupons_batch: one id, coupon id and trace per member';
  END IF;
`

// checks00021 is the check 00021 put in its place, as issue_coupons_batch_v3 makes it since
// 00038 (in its body, issuance_args_check_v3 called for the message of a fault).
const checks00021 = `  -- The arguments, as issuance_args_check_v3 checks them; it is called only when one fails, for
  -- its message (22023).
  IF NOT coalesce(length(p_campaign_id) BETWEEN 1 AND 64 AND p_campaign_id !~ '[^A-Za-z0-9_-]'
                  AND n BETWEEN 1 AND issuance_batch_max() AND arg_array_fits(p_member_ids, n, false)
                  AND arg_array_fits(p_coupon_ids, n, false) AND arg_array_fits(p_trace_parents, n, true), false) THEN
    PERFORM issuance_args_check_v3('issue_coupons_batch_v3', p_campaign_id, p_coupon_ids, p_member_ids, p_trace_parents);
  END IF;
  FOR k IN 1 .. n LOOP
    IF NOT coalesce(length(p_member_ids[k]) BETWEEN 1 AND 128 AND p_member_ids[k] !~ '[^!-~]'
                    AND array_position(p_coupon_ids, p_coupon_ids[k], k + 1) IS NULL
                    AND (p_trace_parents[k] IS NULL
                         OR length(p_trace_parents[k]) = 55 AND substr(p_trace_parents[k], 36, 1) = '-'
                            AND substr(p_trace_parents[k], 53, 1) = '-' AND p_trace_parents[k] ~ '^00-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+$'), false) THEN
      PERFORM issuance_args_check_v3('issue_coupons_batch_v3', p_campaign_id, p_coupon_ids, p_member_ids, p_trace_parents);
    END IF;
  END LOOP;
`

// wrapperChecks are the previous release's wrapper's checks (issue_coupons_batch_v2 and
// grant_coupons_batch_v2): the arguments, and the issue time against the database's clock.
func wrapperChecks(fn string) [2]string {
	return [2]string{fmt.Sprintf(`  PERFORM issuance_args_check('%[1]s', p_campaign_id, p_coupon_ids, p_member_ids, p_issued_at, p_trace_parents);
  PERFORM issue_clock('%[1]s', p_issued_at);
`, fn), ""}
}

// forgery is one call with forged arguments.
type forgery struct {
	name string
	// args are the call's arguments, SQL text: issue_coupons_batch's and grant_coupons_batch's
	// when batch, else issue_coupon's and grant_coupon's.
	args string
	// batch says whether args are a batch's (else a single call's).
	batch bool
	// refused says the call must fail with 22023; otherwise it must answer without a write
	// (MONTHLY_CAP for a forged cap).
	refused bool
	// wrote says the call wrote rows before 00021: the broken variant must let it write. The
	// others failed then too, on a constraint (an error, not 22023) or the old check, or, a
	// forged issue time in the future or a forged cap, have had nothing to reach since 00031
	// (the body takes neither): the campaign's own state and R3's cap refuse them unchecked.
	wrote bool
}

const (
	two      = `ARRAY[gen_random_uuid(), gen_random_uuid()]`
	twoTimes = `ARRAY[now(), now()]`
	twoNulls = `ARRAY[NULL, NULL]::text[]`
)

var forgeries = []forgery{
	{name: "members counted from 0 (issue 30: '[0:1]={b8,sink}')", batch: true, refused: true, wrote: true,
		args: `'B8', ` + two + `, '[0:1]={b8,sink}'::text[], ` + twoTimes + `, 2000, ` + twoNulls},
	{name: "coupon ids counted from 0", batch: true, refused: true,
		args: `'B8', '[0:1]={8d1e2c55-7f43-4d8e-9a51-0c7d6f1b2a01,8d1e2c55-7f43-4d8e-9a51-0c7d6f1b2a02}'::uuid[], ARRAY['m1', 'sink'], ` + twoTimes + `, 2000, ` + twoNulls},
	{name: "issue times counted from 0", batch: true, refused: true, wrote: true,
		args: `'B8', ` + two + `, ARRAY['m1', 'sink'], ('[0:1]={"' || now() - interval '40 days' || '","' || now() || '"}')::timestamptz[], 2000, ` + twoNulls},
	{name: "members as a two-dimensional array", batch: true, refused: true,
		args: `'B8', ` + two + `, '{{m1},{m2}}'::text[], ` + twoTimes + `, 2000, ` + twoNulls},
	{name: "unequal lengths", batch: true, refused: true,
		args: `'B8', ARRAY[gen_random_uuid()], ARRAY['m1', 'm2'], ` + twoTimes + `, 2000, ` + twoNulls},
	{name: "a NULL member", batch: true, refused: true,
		args: `'B8', ` + two + `, ARRAY['m1', NULL], ` + twoTimes + `, 2000, ` + twoNulls},
	{name: "no member", batch: true, refused: true,
		args: `'B8', '{}'::uuid[], '{}'::text[], '{}'::timestamptz[], 2000, '{}'::text[]`},
	{name: "129 members, past the batch maximum", batch: true, refused: true, wrote: true,
		args: `'B8', (SELECT array_agg(gen_random_uuid()) FROM generate_series(1, 129)), (SELECT array_agg('m' || g) FROM generate_series(1, 129) g),
		       array_fill(now(), ARRAY[129]), 2000, array_fill(NULL::text, ARRAY[129])`},
	{name: "an empty member id", batch: true, refused: true,
		args: `'B8', ARRAY[gen_random_uuid()], ARRAY[''], ARRAY[now()], 2000, ARRAY[NULL]::text[]`},
	{name: "a member id with a space", batch: true, refused: true,
		args: `'B8', ARRAY[gen_random_uuid()], ARRAY['m 1'], ARRAY[now()], 2000, ARRAY[NULL]::text[]`},
	{name: "a member id of 129 bytes", batch: true, refused: true,
		args: `'B8', ARRAY[gen_random_uuid()], ARRAY[repeat('m', 129)], ARRAY[now()], 2000, ARRAY[NULL]::text[]`},
	{name: "a campaign id outside [A-Za-z0-9_-]", batch: true, refused: true,
		args: `'B8''--', ARRAY[gen_random_uuid()], ARRAY['m1'], ARRAY[now()], 2000, ARRAY[NULL]::text[]`},
	{name: "one coupon id for two members", batch: true, refused: true,
		args: `'B8', ARRAY['8d1e2c55-7f43-4d8e-9a51-0c7d6f1b2a03'::uuid, '8d1e2c55-7f43-4d8e-9a51-0c7d6f1b2a03'], ARRAY['m1', 'm2'], ` + twoTimes + `, 2000, ` + twoNulls},
	{name: "a trace that is no traceparent", batch: true, refused: true, wrote: true,
		args: `'B8', ARRAY[gen_random_uuid()], ARRAY['m1'], ARRAY[now()], 2000, ARRAY['<script>']`},
	{name: "issued_at => '2030-06-15', in a campaign that starts in 2030 (issue 30)", batch: true, refused: true,
		args: `'FUTURE', ARRAY[gen_random_uuid()], ARRAY['m1'], ARRAY['2030-06-15 10:00+09'::timestamptz], 2000, ARRAY[NULL]::text[]`},
	{name: "an issue time in another month", batch: true, refused: true, wrote: true,
		args: `'B8', ARRAY[gen_random_uuid()], ARRAY['m1'], ARRAY[now() - interval '40 days'], 2000, ARRAY[NULL]::text[]`},
	{name: "a cap of 1,000,000 yen for a 3,000 yen coupon", batch: true,
		args: `'BIG', ARRAY[gen_random_uuid()], ARRAY['m1'], ARRAY[now()], 1000000, ARRAY[NULL]::text[]`},
	{name: "one: issued_at => '2030-06-15' (issue 30)", refused: true,
		args: `gen_random_uuid(), 'FUTURE', 'm1', '2030-06-15 10:00+09', 2000, NULL`},
	{name: "one: an empty member id", refused: true,
		args: `gen_random_uuid(), 'B8', '', now(), 2000, NULL`},
	{name: "one: a cap of 1,000,000 yen for a 3,000 yen coupon",
		args: `gen_random_uuid(), 'BIG', 'm1', now(), 1000000, NULL`},
}

// forgeryDB is a migrated database with campaigns B8 (1,000 yen coupons, always active), FUTURE
// (starting in 2030) and BIG (3,000 yen coupons, above the 2,000 yen cap), member sink holding
// a B8 coupon, and pools as its owner, coupon_issue and coupon_admin.
type forgeryDB struct {
	url                 string
	owner, issue, admin *pgxpool.Pool
}

func newForgeryDB(t *testing.T) forgeryDB {
	t.Helper()
	dbURL := pgtest.URL(t)
	d := forgeryDB{url: dbURL, owner: openPool(t, dbURL), issue: openPool(t, pgtest.LoginAs(t, dbURL, "coupon_issue")),
		admin: openPool(t, pgtest.LoginAs(t, dbURL, "coupon_admin"))}
	starts := time.Date(2030, 6, 1, 0, 0, 0, 0, issuance.Tokyo)
	for _, c := range []campaign.Campaign{
		{ID: "B8", DiscountYen: 1000, BudgetYen: 1_000_000},
		{ID: "FUTURE", DiscountYen: 1000, BudgetYen: 100_000, StartsAt: &starts},
		{ID: "BIG", DiscountYen: 3000, BudgetYen: 100_000},
	} {
		if err := campaign.Create(context.Background(), d.owner, c); err != nil {
			t.Fatal(err)
		}
	}
	d.reset(t)
	return d
}

// reset empties what the forgeries write and issues sink its B8 coupon again, so that each
// forgery starts from the same tables: with sink's pair held, a batch writes its first member
// only, which is how issue 30's '[0:1]' arrays charged one member's coupon to another.
func (d forgeryDB) reset(t *testing.T) {
	t.Helper()
	if _, err := d.owner.Exec(context.Background(), `TRUNCATE issued_coupons, member_monthly_usage, notification_outbox CASCADE;
		UPDATE campaign_budgets SET issued_yen = 0;
		SELECT * FROM issue_coupon(gen_random_uuid(), 'B8', 'sink', now(), 2000, NULL)`); err != nil {
		t.Fatal(err)
	}
}

// tables is what a forgery could write, counted.
func (d forgeryDB) tables(t *testing.T) string {
	t.Helper()
	var s string
	if err := d.owner.QueryRow(context.Background(), `SELECT format('coupons %s, usage rows %s (%s yen), outbox rows %s, issued %s yen, rule changes %s, cap %s',
	  (SELECT count(*) FROM issued_coupons), (SELECT count(*) FROM member_monthly_usage),
	  (SELECT coalesce(sum(used_yen), 0) FROM member_monthly_usage), (SELECT count(*) FROM notification_outbox),
	  (SELECT sum(issued_yen) FROM campaign_budgets), (SELECT count(*) FROM coupon_rules_changes),
	  (SELECT monthly_cap_yen FROM coupon_rules))`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// call makes forgery f through fn as pool's user and returns whether the tables changed, and
// the call's error.
func (d forgeryDB) call(t *testing.T, pool *pgxpool.Pool, fn string, f forgery) (bool, error) {
	t.Helper()
	before := d.tables(t)
	_, err := pool.Exec(context.Background(), fmt.Sprintf(`SELECT * FROM %s(%s)`, fn, f.args))
	return d.tables(t) != before, err
}

// callers are the functions and the roles that may call them: IssueCoupon's and the grant's.
func (d forgeryDB) callers(f forgery) map[string]*pgxpool.Pool {
	if f.batch {
		return map[string]*pgxpool.Pool{"issue_coupons_batch": d.issue, "grant_coupons_batch": d.admin}
	}
	return map[string]*pgxpool.Pool{"issue_coupon": d.issue, "grant_coupon": d.admin}
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func TestForgedArgumentsRefused(t *testing.T) {
	t.Parallel()
	d := newForgeryDB(t)
	start := d.tables(t)
	for _, f := range forgeries {
		for fn, pool := range d.callers(f) {
			wrote, err := d.call(t, pool, fn, f)
			switch {
			case wrote:
				t.Errorf("%s through %s: wrote (%v), want nothing written", f.name, fn, err)
			case f.refused && sqlState(err) != pgerrcode.InvalidParameterValue:
				t.Errorf("%s through %s: %v, want 22023", f.name, fn, err)
			case !f.refused && err != nil:
				t.Errorf("%s through %s: %v, want an answer without a write", f.name, fn, err)
			}
		}
	}
	if got := d.tables(t); got != start || !strings.HasPrefix(got, "coupons 1, usage rows 1 (1000 yen), outbox rows 1, issued 1000 yen, rule changes 2, cap 2000") {
		t.Errorf("after the forgeries: %s, want sink's coupon alone, as at the start", got)
	}
}

// TestForgedArgumentsPassTheOldCheck is TestForgedArgumentsRefused's broken variant: with the
// issuance's check of 00015 back (and the wrapper's checks gone), each forgery marked wrote
// writes, as on main before 00021, so the test above fails on it.
func TestForgedArgumentsPassTheOldCheck(t *testing.T) {
	t.Parallel()
	d := newForgeryDB(t)
	pgtest.BreakFunction(t, d.owner, "issue_coupons_batch_v3", [2]string{checks00021, check00015})
	pgtest.BreakFunction(t, d.owner, "issue_coupons_batch_v2", wrapperChecks("issue_coupons_batch_v2"))
	pgtest.BreakFunction(t, d.owner, "grant_coupons_batch_v2", wrapperChecks("grant_coupons_batch_v2"))
	for _, f := range forgeries {
		if !f.wrote {
			continue
		}
		for fn, pool := range d.callers(f) {
			d.reset(t)
			if wrote, err := d.call(t, pool, fn, f); !wrote {
				t.Errorf("%s through %s on the old check: %v, nothing written; want the forgery to write (the fixture no longer shows it)", f.name, fn, err)
			}
		}
	}
}

// TestRulesSetRefusesItsArguments: coupon_rules_set, as coupon_admin, refuses a cap out of
// 1..1,000,000,000, an approval line out of 0..2,147,483,647, neither setting, and a missing or
// blank reason (CI422), writing nothing; coupon_issue may not call it (42501).
func TestRulesSetRefusesItsArguments(t *testing.T) {
	t.Parallel()
	d := newForgeryDB(t)
	before := d.tables(t)
	for _, args := range []string{`0, NULL, 'r'`, `-2000, NULL, 'r'`, `1000000001, NULL, 'r'`, `NULL, -1, 'r'`,
		`NULL, 2147483648, 'r'`, `NULL, NULL, 'r'`, `1000, NULL, ''`, `1000, NULL, '   '`, `1000, NULL, NULL`} {
		if _, err := d.admin.Exec(context.Background(), `SELECT * FROM coupon_rules_set(`+args+`)`); sqlState(err) != "CI422" {
			t.Errorf("coupon_rules_set(%s): %v, want CI422", args, err)
		}
	}
	if _, err := d.issue.Exec(context.Background(), `SELECT * FROM coupon_rules_set(1000000, NULL, 'r')`); sqlState(err) != pgerrcode.InsufficientPrivilege {
		t.Errorf("coupon_rules_set as coupon_issue: %v, want 42501", err)
	}
	if got := d.tables(t); got != before {
		t.Errorf("after the refusals: %s, want %s", got, before)
	}
}

// TestTheDatabaseClockDecides: a time the previous release sends, taken a few seconds before
// its call, is accepted and replaced by the database's clock; one past the 5 s skew is refused.
func TestTheDatabaseClockDecides(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newForgeryDB(t)
	var sent, issued time.Time
	if err := d.issue.QueryRow(ctx, `SELECT now() - interval '3 seconds'`).Scan(&sent); err != nil {
		t.Fatal(err)
	}
	var result string
	if err := d.issue.QueryRow(ctx, `SELECT result FROM issue_coupon(gen_random_uuid(), 'B8', 'm1', $1, 2000, NULL)`, sent).Scan(&result); err != nil || result != "ISSUED" {
		t.Fatalf("issue_coupon 3 s behind: %s %v, want ISSUED", result, err)
	}
	if err := d.owner.QueryRow(ctx, `SELECT issued_at FROM issued_coupons WHERE member_id = 'm1'`).Scan(&issued); err != nil {
		t.Fatal(err)
	}
	if !issued.After(sent.Add(2 * time.Second)) {
		t.Errorf("issued_at %s for a call sent with %s: want the database's clock, 3 s later", issued, sent)
	}
	if _, err := d.issue.Exec(ctx, `SELECT * FROM issue_coupon(gen_random_uuid(), 'B8', 'm2', now() + interval '6 seconds', 2000, NULL)`); sqlState(err) != pgerrcode.InvalidParameterValue {
		t.Errorf("issue_coupon 6 s ahead: %v, want 22023", err)
	}
}

// TestArgumentFormatsAreTheService: the database's id formats and batch maximum are
// shared/ids' and shared/issuance's: an id the service accepts passes issuance_args_check, one it
// refuses is refused.
func TestArgumentFormatsAreTheService(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, 1)
	var batchMax int
	if err := pool.QueryRow(ctx, `SELECT issuance_batch_max()`).Scan(&batchMax); err != nil || batchMax != issuance.MaxBatchMax {
		t.Errorf("issuance_batch_max() = %d (%v), want MaxBatchMax %d", batchMax, err, issuance.MaxBatchMax)
	}
	for _, c := range []struct{ member, campaign string }{
		{"m0001", "SW-A"}, {strings.Repeat("m", ids.MaxMemberIDLen), strings.Repeat("c", ids.MaxCampaignIDLen)}, {"!~", "a_Z-9"},
		{"", "SW-A"}, {strings.Repeat("m", ids.MaxMemberIDLen+1), "SW-A"}, {"m 1", "SW-A"}, {"m\x7f", "SW-A"}, {"mé", "SW-A"},
		{"m0001", ""}, {"m0001", strings.Repeat("c", ids.MaxCampaignIDLen+1)}, {"m0001", "SW.A"}, {"m0001", "SW A"},
	} {
		_, err := pool.Exec(ctx, `SELECT issuance_args_check('t', $1, ARRAY[gen_random_uuid()], ARRAY[$2::text], ARRAY[now()], ARRAY[NULL]::text[])`,
			c.campaign, c.member)
		if service := ids.Request(c.member, c.campaign); (service == nil) != (err == nil) {
			t.Errorf("member %q, campaign %q: the service says %v, the database %v", c.member, c.campaign, service, err)
		}
	}
}

// traceFormat is a W3C traceparent of version 00, as the service stores it on the outbox row.
var traceFormat = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// traces are the traceparents tried against issuance_args_check: valid ones and near misses,
// among them 55 bytes of hex with their dashes moved.
var traces = []string{
	"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	"00-00000000000000000000000000000000-0000000000000000-00",
	"00-0af7651916cd43dd8448eb211c80319-cb7ad6b7169203331-01",  // dashes moved: 31 and 17 hex
	"00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-101",  // 16, then 15 and 3
	"00-0af7651916cd43dd8448eb211c80319c0b7ad6b7169203331-01",  // a dash missing
	"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331--1",  // a dash too many
	"000-af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  // the version's dash moved
	"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  // another version
	"00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  // upper case
	"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g",  // not hex
	"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",   // 54 bytes
	"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-011", // 56 bytes
	"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n",
	"00-0af7651916cd43dd8448eb211c8031é-b7ad6b7169203331-01",
	"", "<script>",
}

// traceRefusals returns, for each of traces, whether issuance_args_check refused it where the
// format says otherwise.
func traceRefusals(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var wrong []string
	for _, tr := range traces {
		_, err := pool.Exec(context.Background(), `SELECT issuance_args_check('t', 'SW-A', ARRAY[gen_random_uuid()], ARRAY['m1'], ARRAY[now()], ARRAY[$1::text])`, tr)
		if err != nil && sqlState(err) != pgerrcode.InvalidParameterValue {
			t.Fatalf("trace %q: %v", tr, err)
		}
		if traceFormat.MatchString(tr) != (err == nil) {
			wrong = append(wrong, fmt.Sprintf("trace %q: the format says %v, the database %v", tr, traceFormat.MatchString(tr), err))
		}
	}
	return wrong
}

// TestTraceFormatIsW3C: issuance_args_check accepts a trace exactly when it is a traceparent
// of version 00. Since 00023 it judges one by its length and the places of its dashes, and hex
// between them; its broken variant, without the dashes' places, lets the moved dashes through.
func TestTraceFormatIsW3C(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, 1)
	for _, w := range traceRefusals(t, pool) {
		t.Error(w)
	}
	pgtest.BreakFunction(t, pool, "issuance_args_check_v3", [2]string{"AND substr(p_trace_parents[k], 53, 1) = '-'", ""},
		[2]string{"AND substr(p_trace_parents[k], 36, 1) = '-'", ""})
	if wrong := traceRefusals(t, pool); len(wrong) != 2 {
		t.Errorf("without the dashes' places: %d traces judged wrong (%q), want the 2 with their dashes moved (the fixture no longer shows it)", len(wrong), wrong)
	}
}

// TestOutboxClaimRefusesItsArguments: outbox_claim, as coupon_relay, refuses a limit outside
// 1..1000, no run, a lease or retry-key window outside (0, 23 h], and a due time after the
// database's clock (22023), claiming nothing. Its broken variant, the claim of 00015 without the
// check, claims a row due in an hour for a caller that says it is two hours later.
func TestOutboxClaimRefusesItsArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newForgeryDB(t)
	relay := openPool(t, pgtest.LoginAs(t, d.url, "coupon_relay"))
	if _, err := d.owner.Exec(ctx, `INSERT INTO member_line_accounts (member_id, line_user_id) VALUES ('sink', 'U0123456789abcdef0123456789abcdef');
		UPDATE notification_outbox SET next_attempt_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	claimed := func() int {
		t.Helper()
		var n int
		if err := d.owner.QueryRow(ctx, `SELECT count(*) FROM notification_outbox WHERE claimed_by IS NOT NULL OR skipped_at IS NOT NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, args := range []string{
		`0, gen_random_uuid(), interval '30 s', now(), interval '23 h'`,
		`1001, gen_random_uuid(), interval '30 s', now(), interval '23 h'`,
		`NULL, gen_random_uuid(), interval '30 s', now(), interval '23 h'`,
		`10, NULL, interval '30 s', now(), interval '23 h'`,
		`10, gen_random_uuid(), interval '0 s', now(), interval '23 h'`,
		`10, gen_random_uuid(), interval '30 s', now(), interval '25 h'`,
		`10, gen_random_uuid(), interval '30 s', NULL, interval '23 h'`,
		`10, gen_random_uuid(), interval '30 s', now() + interval '2 hours', interval '23 h'`,
	} {
		if _, err := relay.Exec(ctx, `SELECT * FROM outbox_claim(`+args+`)`); sqlState(err) != pgerrcode.InvalidParameterValue {
			t.Errorf("outbox_claim(%s): %v, want 22023", args, err)
		}
	}
	if n := claimed(); n != 0 {
		t.Errorf("%d rows claimed or skipped by the refused calls, want 0", n)
	}

	pgtest.BreakFunction(t, d.owner, "outbox_claim", [2]string{"WHERE outbox_claim_args_check(p_limit, p_run, p_lease, p_due_at, p_key_window) AND ", "WHERE "})
	if _, err := relay.Exec(ctx, `SELECT * FROM outbox_claim(10, gen_random_uuid(), interval '30 s', now() + interval '2 hours', interval '23 h')`); err != nil || claimed() != 1 {
		t.Errorf("the broken variant, a due time two hours ahead: %v, %d rows claimed; want the row due in an hour claimed (the fixture no longer shows it)", err, claimed())
	}
}

// TestDryRunBatchRefusesItsArguments: issue_dry_run_batch (00028), as coupon_issue, refuses with
// 22023 a member array that is not one dimension from index 1 of 1 to issuance_batch_max()
// members without NULLs, and an id outside the service's formats (ids.Request), as
// issuance_args_check does for the issuance; a well-formed group is answered, one row per member.
func TestDryRunBatchRefusesItsArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newForgeryDB(t)
	for _, c := range []struct{ name, args string }{
		{"members counted from 0", `'B8', '[0:1]={m1,m2}'::text[]`},
		{"members as a two-dimensional array", `'B8', '{{m1},{m2}}'::text[]`},
		{"a NULL member", `'B8', ARRAY['m1', NULL]`},
		{"a NULL array", `'B8', NULL::text[]`},
		{"no member", `'B8', '{}'::text[]`},
		{"129 members, past the batch maximum", `'B8', (SELECT array_agg('m' || g) FROM generate_series(1, 129) g)`},
		{"a NULL campaign", `NULL, ARRAY['m1']`},
	} {
		if _, err := d.issue.Exec(ctx, `SELECT * FROM issue_dry_run_batch(`+c.args+`)`); sqlState(err) != pgerrcode.InvalidParameterValue {
			t.Errorf("%s: %v, want 22023", c.name, err)
		}
	}
	for _, c := range []struct{ member, campaign string }{
		{"m0001", "B8"}, {strings.Repeat("m", ids.MaxMemberIDLen), strings.Repeat("c", ids.MaxCampaignIDLen)}, {"!~", "a_Z-9"},
		{"", "B8"}, {strings.Repeat("m", ids.MaxMemberIDLen+1), "B8"}, {"m 1", "B8"}, {"m\x7f", "B8"}, {"mé", "B8"},
		{"m0001", ""}, {"m0001", strings.Repeat("c", ids.MaxCampaignIDLen+1)}, {"m0001", "B8.A"}, {"m0001", "B8 A"},
	} {
		var rows int
		err := d.issue.QueryRow(ctx, `SELECT count(*)::int FROM issue_dry_run_batch($1, ARRAY['m2', $2::text])`, c.campaign, c.member).Scan(&rows)
		if err != nil && sqlState(err) != pgerrcode.InvalidParameterValue {
			t.Fatalf("member %q, campaign %q: %v", c.member, c.campaign, err)
		}
		if service := ids.Request(c.member, c.campaign); (service == nil) != (err == nil) || (err == nil && rows != 2) {
			t.Errorf("member %q, campaign %q: the service says %v, the database %v (%d rows for 2 members)", c.member, c.campaign, service, err, rows)
		}
	}
}
