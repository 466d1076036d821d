package main

import (
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
)

// The tests below are the findings of a new user trying couponctl (issue 31's second round).

// TestCouponsExpireInsideThePeriod: a campaign whose coupons would expire at or before its start
// could never issue one: create and update refuse it with exit 2, naming both instants in
// +09:00, and write nothing (counted with SQL); coupons expiring before the period's end are what
// the contract allows (the campaign ends at the expiry), and both verbs say so. Red on the broken
// variant, the expiry judged by nothing (before: both taken silently).
func TestCouponsExpireInsideThePeriod(t *testing.T) {
	checkAndBreak(t, expiryInsidePeriodCheck, brokenVariant{"expiry not checked", func(t *testing.T) {
		swap(t, &expiryCheck, func(_, _, _ *time.Time) (string, error) { return "", nil })
	}})
}

func expiryInsidePeriodCheck(t *testing.T, found *verdict) {
	d := newGrantDB(t)
	t.Setenv("DATABASE_URL", d.url)
	day := time.Now().Add(48 * time.Hour).Truncate(time.Hour).In(tokyo(t))
	at := func(h int) string { return day.Add(time.Duration(h) * time.Hour).Format(time.RFC3339) }
	rows := func(id string) int { return d.count(t, `SELECT count(*) FROM campaigns WHERE campaign_id = $1`, id) }

	code, stdout, stderr := grantCLI("campaign", "create", "--id", "EARLY", "--discount-yen", "500", "--budget-yen", "5000",
		"--starts", at(10), "--ends", at(20), "--coupons-expire", at(5))
	if code != 2 || !strings.Contains(stderr, "expire at "+at(5)+", at or before its start at "+at(10)) {
		found.Errorf("create with coupons expiring before the start: exit %d, want 2 naming both instants\n%s%s", code, stdout, stderr)
	}
	if n := rows("EARLY"); n != 0 {
		found.Errorf("the refused create wrote %d campaigns rows", n)
	}
	code, stdout, stderr = grantCLI("campaign", "create", "--id", "SHORT", "--discount-yen", "500", "--budget-yen", "5000",
		"--starts", at(10), "--ends", at(20), "--coupons-expire", at(15))
	if code != 0 || !strings.Contains(stderr, "warning: its coupons expire at "+at(15)+", before its end at "+at(20)) {
		found.Errorf("create with coupons expiring before the end: exit %d, want 0 with a warning naming both\n%s%s", code, stdout, stderr)
	}
	if n := rows("SHORT"); n != 1 {
		t.Fatalf("create SHORT wrote %d campaigns rows, want 1", n)
	}
	startsAt := func() string {
		var s time.Time
		if err := d.owner.QueryRow(context.Background(),
			`SELECT min(starts_at) FROM campaign_budgets WHERE campaign_id = 'SHORT'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s.In(tokyo(t)).Format(time.RFC3339)
	}
	t.Setenv("DATABASE_URL", d.admin)
	for _, args := range [][]string{
		{"--starts", at(16)},
		{"--coupons-expire", at(9)},
	} {
		code, stdout, stderr = grantCLI(append([]string{"campaign", "update", "SHORT", "--reason", "x"}, args...)...)
		if code != 2 || !strings.Contains(stderr, "before its start") || !strings.Contains(stderr, "nothing changed") {
			found.Errorf("update %v: exit %d, want 2 refusing coupons that expire before the start\n%s%s", args, code, stdout, stderr)
		}
	}
	if got := startsAt(); got != at(10) {
		found.Errorf("a refused update moved the start to %s", got)
	}
	if n := d.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'SHORT' AND what <> 'create'`); n != 0 {
		found.Errorf("refused updates wrote %d history rows", n)
	}
	code, stdout, stderr = grantCLI("campaign", "update", "SHORT", "--ends", at(30), "--reason", "x")
	if code != 0 || !strings.Contains(stderr, "warning: its coupons expire at "+at(15)+", before its end at "+at(30)) {
		found.Errorf("update --ends past the expiry: exit %d, want 0 with the warning\n%s%s", code, stdout, stderr)
	}
}

// TestPruneFloorNamesItsSetting: a retention below the floor that RELAY_RETENTION set is refused
// naming RELAY_RETENTION, not --older-than, which was not given.
func TestPruneFloorNamesItsSetting(t *testing.T) {
	t.Setenv("RELAY_RETENTION", "1h")
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none") // never reached: the floor is judged first
	code, stdout, stderr := grantCLI("outbox", "prune")
	if code != 2 || !strings.Contains(stderr, "couponctl: RELAY_RETENTION=1h0m0s: below the 24h0m0s floor") ||
		strings.Contains(stderr, "--older-than 1h") {
		t.Errorf("prune with RELAY_RETENTION=1h: exit %d, want 2 naming RELAY_RETENTION\n%s%s", code, stdout, stderr)
	}
}

// TestUnknownCouponAndCampaignAreNamed: "outbox requeue" of a coupon that does not exist, and
// "coupon show --member M --campaign NOPE" of a campaign that does not exist, say so and exit 1
// (before: "neither parked nor skipped; left alone" and "has no coupons of campaign NOPE", exit 0).
// Red on requeue's broken variant, blind to coupons that do not exist.
func TestUnknownCouponAndCampaignAreNamed(t *testing.T) {
	checkAndBreak(t, unknownNamedCheck, brokenVariant{"unknown coupons not named", func(t *testing.T) {
		swap(t, &couponsUnknown, func(context.Context, *pgxpool.Pool, []string) ([]string, error) { return nil, nil })
	}})
}

func unknownNamedCheck(t *testing.T, found *verdict) {
	d := newGrantDB(t, campaign.Campaign{ID: "K", DiscountYen: 500, BudgetYen: 1_000_000})
	t.Setenv("DATABASE_URL", d.admin)
	issueTo(t, d, "K", "k1")
	const nobody = "00000000-0000-4000-8000-000000000001"
	code, stdout, stderr := grantCLI("outbox", "requeue", nobody)
	if code != 1 || !strings.Contains(stderr, "couponctl: "+nobody+": no such coupon") {
		found.Errorf("requeue of an unknown coupon: exit %d, want 1 saying it does not exist\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = grantCLI("coupon", "show", "--member", "k1", "--campaign", "NOPE")
	if code != 1 || !strings.Contains(stderr, "couponctl: campaign NOPE does not exist") {
		found.Errorf("coupon show --campaign NOPE: exit %d, want 1 saying the campaign does not exist\n%s%s", code, stdout, stderr)
	}
	if code, stdout, stderr = grantCLI("coupon", "show", "--member", "k1", "--campaign", "K"); code != 0 || !strings.Contains(stdout, "live") {
		found.Errorf("coupon show --member k1 --campaign K: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestGrantCSVNeutralisesFormulas: member ids that a spreadsheet would run as a formula (=, +,
// -, @ first) are written to grant's CSV behind a single quote (OWASP, "CSV Injection"), while
// the coupons go to the members as they are named (counted with SQL). Red on the broken variant,
// the cell written as it is.
func TestGrantCSVNeutralisesFormulas(t *testing.T) {
	checkAndBreak(t, grantCSVCheck, brokenVariant{"cells written as given", func(t *testing.T) { swap(t, &grantCSVCell, func(s string) string { return s }) }})
}

func grantCSVCheck(t *testing.T, found *verdict) {
	d := newGrantDB(t, campaign.Campaign{ID: "F", DiscountYen: 500, BudgetYen: 1_000_000})
	t.Setenv("DATABASE_URL", d.admin)
	members := []string{"=1+1", "+81-90", "-2+3", "@SUM(A1)", "m=1"}
	dir := t.TempDir()
	file, out := filepath.Join(dir, "members.txt"), filepath.Join(dir, "answers.csv")
	if err := os.WriteFile(file, []byte(strings.Join(members, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, stdout, stderr := grantCLI("grant", "--campaign", "F", "--members", file, "--out", out); code != 0 {
		t.Fatalf("grant: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'F' AND member_id = ANY($1)`, members); n != len(members) {
		found.Errorf("%d coupons for the members as named, want %d", n, len(members))
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, l := range lines[1:] {
		got[l[0]] = true
		if strings.ContainsAny(l[0][:1], "=+-@\t\r") {
			found.Errorf("CSV cell %q starts a formula", l[0])
		}
	}
	for _, want := range []string{"'=1+1", "'+81-90", "'-2+3", "'@SUM(A1)", "m=1"} {
		if !got[want] {
			found.Errorf("CSV lacks the member cell %q: %q", want, lines)
		}
	}
}

// TestCorrectionDryRunSaysWhatHappens: the dry run of a correction (--allow-reissue on a coupon
// voided without it) counts it as a pair released for reissue, not as a coupon voided.
func TestCorrectionDryRunSaysWhatHappens(t *testing.T) {
	d := newGrantDB(t, campaign.Campaign{ID: "C", DiscountYen: 500, BudgetYen: 1_000_000})
	t.Setenv("DATABASE_URL", d.admin)
	ids := issueTo(t, d, "C", "c1")
	if _, err := coupon.Void(context.Background(), d.owner, ids[0], "CS-1", false); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := grantCLI("coupon", "void", ids[0], "--allow-reissue", "--reason", "CS-2", "--dry-run")
	if code != 0 || strings.Contains(stdout, "would void") || !strings.Contains(stdout, "would release its pair for reissue") ||
		!strings.Contains(stdout, "dry run: 0 of 1 coupons would be voided, 1 would have its pair released for reissue, 0 refused; nothing changed") {
		t.Errorf("dry run of a correction: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE reissue_allowed`); n != 0 {
		t.Errorf("the dry run released %d pairs", n)
	}
	// Once the correction is made, its dry run says done, as its real re-run does (it said
	// "would be refused: voided already"; found trying the release as a new user).
	if code, stdout, stderr := grantCLI("coupon", "void", ids[0], "--allow-reissue", "--reason", "CS-2"); code != 0 {
		t.Fatalf("the correction: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = grantCLI("coupon", "void", ids[0], "--allow-reissue", "--reason", "CS-2", "--dry-run")
	if code != 0 || !strings.Contains(stdout, "voided already by an earlier run") || !strings.Contains(stdout, "0 refused") {
		t.Errorf("dry run of a correction already made: exit %d, want done\n%s%s", code, stdout, stderr)
	}
}

// TestMemberFileEncodingNamed: a UTF-8 byte order mark, or UTF-16 text, after the first line of
// a member file (files joined together) is named with its line, before anything is sent. Red on
// the broken variant, readIDs blind to the encoding (before: "byte 0 is 0xEF").
func TestMemberFileEncodingNamed(t *testing.T) {
	checkAndBreak(t, memberFileEncodingCheck, brokenVariant{"encodings not checked", func(t *testing.T) { swap(t, &idEncoding, func(string) string { return "" }) }})
}

func memberFileEncodingCheck(t *testing.T, found *verdict) {
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none") // never reached: the file is read first
	utf16 := func(s string) string {
		var b strings.Builder
		b.WriteString("\xff\xfe")
		for _, r := range s {
			b.WriteByte(byte(r))
			b.WriteByte(0)
		}
		return b.String()
	}
	for _, c := range []struct{ name, text, want string }{
		{"bom", "m1\nm2\n\ufeffm3\n", "members.txt:3: a UTF-8 byte order mark (BOM)"},
		{"utf16", "m1\n" + utf16("m2\nm3\n"), "members.txt:2: UTF-16"},
		{"utf16-first", utf16("m1\n"), "members.txt:1: UTF-16"},
	} {
		file := filepath.Join(t.TempDir(), "members.txt")
		if err := os.WriteFile(file, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		code, stdout, stderr := grantCLI("grant", "--campaign", "X", "--members", file)
		if code != 2 || !strings.Contains(stderr, c.want) || strings.Contains(stderr, "byte 0 is 0x") {
			found.Errorf("%s: exit %d, want 2 with %q\n%s%s", c.name, code, c.want, stdout, stderr)
		}
	}
}

// TestHistoryCreateHasNoBefore: the create's row of campaign history has nothing before it
// ("-"), not a list of "(open)" figures.
func TestHistoryCreateHasNoBefore(t *testing.T) {
	d := newGrantDB(t, campaign.Campaign{ID: "H", DiscountYen: 500, BudgetYen: 5000})
	t.Setenv("DATABASE_URL", d.admin)
	code, stdout, stderr := grantCLI("campaign", "history", "H")
	if code != 0 || strings.Contains(stdout, "(open)") || !regexp.MustCompile(`(?m)create +- +budget_yen=5000`).MatchString(stdout) {
		t.Errorf("history of a new campaign: exit %d, want its create with \"-\" before\n%s%s", code, stdout, stderr)
	}
}

// TestDatabaseRefusalTimesInTokyo: a refusal raised by a SQL function with a time in it (ending a
// campaign that has not started) prints that time in RFC 3339 at +09:00, as every other time
// couponctl prints, not in PostgreSQL's format in the session's zone. Red on the broken variant,
// the refusal printed as the database wrote it.
func TestDatabaseRefusalTimesInTokyo(t *testing.T) {
	checkAndBreak(t, refusalTimesCheck, brokenVariant{"times as PostgreSQL prints them", func(t *testing.T) { swap(t, &refusalTimes, func(s string) string { return s }) }})
}

func refusalTimesCheck(t *testing.T, found *verdict) {
	d := newGrantDB(t)
	t.Setenv("DATABASE_URL", d.url)
	starts := time.Now().Add(72 * time.Hour).Truncate(time.Second).UTC()
	if code, stdout, stderr := grantCLI("campaign", "create", "--id", "LATER", "--discount-yen", "500", "--budget-yen", "5000",
		"--starts", starts.Format(time.RFC3339)); code != 0 {
		t.Fatalf("create: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, err := d.owner.Exec(context.Background(), `ALTER DATABASE `+pgxIdent(t, d)+` SET TimeZone = 'UTC'`); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DATABASE_URL", d.admin)
	code, stdout, stderr := grantCLI("campaign", "end", "LATER", "--reason", "x")
	want := starts.In(tokyo(t)).Format(time.RFC3339)
	if code != 1 || !strings.Contains(stderr, "it starts "+want+")") ||
		regexp.MustCompile(`\d{2}:\d{2}:\d{2}\+00`).MatchString(stderr) {
		found.Errorf("end of a campaign not started: exit %d, want 1 with its start as %s\n%s%s", code, want, stdout, stderr)
	}
}

// pgxIdent is d's database name, quoted as an identifier.
func pgxIdent(t *testing.T, d grantDB) string {
	t.Helper()
	var name string
	if err := d.owner.QueryRow(context.Background(), `SELECT quote_ident(current_database())`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestTokyoTimes: PostgreSQL's text of a timestamptz in any session zone becomes RFC 3339 at
// +09:00, its fraction kept; other text is left as it is.
func TestTokyoTimes(t *testing.T) {
	for in, want := range map[string]string{
		"starts 2026-12-05 13:24:30+00 is not":                   "starts 2026-12-05T22:24:30+09:00 is not",
		"at 2026-12-05 13:24:30.123456+00;":                      "at 2026-12-05T22:24:30.123456+09:00;",
		"(2026-12-05 18:54:30+05:30) and 2026-12-05 22:24:30+09": "(2026-12-05T22:24:30+09:00) and 2026-12-05T22:24:30+09:00",
		"2026-12-05 13:24:30-03:30:15":                           "2026-12-06T01:54:45+09:00",
		"month 2026-12, 2026-12-05T22:24:30+09:00 kept":          "month 2026-12, 2026-12-05T22:24:30+09:00 kept",
	} {
		if got := tokyoTimes(in); got != want {
			t.Errorf("tokyoTimes(%q) = %q, want %q", in, got, want)
		}
	}
}
