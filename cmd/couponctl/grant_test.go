package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/shared/issuance"
)

// freshCouponPerRun is a broken grant_coupons_batch_v3 kept as a fixture: it voids, with reissue, the
// coupon a member already holds and issues another, so that each run mints a fresh coupon id
// (R1-R3 hold: the void gives the yen back first). It is what "a re-run issues nothing new"
// rules out.
var freshCouponPerRun = [][2]string{{"BEGIN\n  FOR a IN SELECT", `BEGIN
  PERFORM coupon_void(c.coupon_id, 'granted again', true) FROM issued_coupons c
    WHERE c.campaign_id = p_campaign_id AND c.member_id = ANY (p_member_ids) AND c.voided_at IS NULL;
  FOR a IN SELECT`}}

// grantDB is a migrated database for grant tests: its owner's URL and pool, and the URL of a
// login in coupon_admin, as which grants run.
type grantDB struct {
	url, admin string
	owner      *pgxpool.Pool
}

func newGrantDB(t *testing.T, campaigns ...campaign.Campaign) grantDB {
	t.Helper()
	d := grantDB{url: pgtest.URL(t)}
	d.admin = pgtest.LoginAs(t, d.url, "coupon_admin")
	var err error
	if d.owner, err = pgxpool.New(context.Background(), d.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.owner.Close)
	for _, c := range campaigns {
		create := func() {
			if err := campaign.Create(context.Background(), d.owner, c); err != nil {
				t.Fatal(err)
			}
		}
		if len(c.Releases) == 0 {
			create()
			continue
		}
		// A fixture's releases may have passed: it is made a minute before its first.
		first := slices.MinFunc(c.Releases, func(a, b campaign.Release) int { return a.At.Compare(b.At) })
		pgtest.AtClock(t, d.owner, first.At.Add(-time.Minute), create)
	}
	return d
}

func (d grantDB) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := d.owner.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitSessionsGone waits until no session of the coupon_admin login is left on the server.
func (d grantDB) waitSessionsGone(t *testing.T) {
	t.Helper()
	u, err := url.Parse(d.admin)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if n := d.count(t, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, u.User.Username()); n > 0 {
			return fmt.Errorf("%d sessions of %s still run", n, u.User.Username())
		}
		return nil
	})
}

// coupons returns member -> coupon id of campaign id's coupons that a grant issued.
func (d grantDB) coupons(t *testing.T, id string) map[string]string {
	t.Helper()
	rows, err := d.owner.Query(context.Background(),
		`SELECT member_id, coupon_id::text FROM issued_coupons WHERE campaign_id = $1 AND granted_by IS NOT NULL`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var m, c string
		if err := rows.Scan(&m, &c); err != nil {
			t.Fatal(err)
		}
		got[m] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// memberFile writes n member ids, prefix00001.., one a line, and returns the path and the ids.
func memberFile(t *testing.T, prefix string, n int) (string, []string) {
	t.Helper()
	members := make([]string, n)
	for i := range members {
		members[i] = fmt.Sprintf("%s%05d", prefix, i+1)
	}
	path := filepath.Join(t.TempDir(), "members.txt")
	if err := os.WriteFile(path, []byte("# the members\n"+strings.Join(members, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, members
}

// answer is one line of grant's CSV.
type answer struct{ result, couponID string }

// readGrantCSV reads grant's CSV whole: member -> answer. A CSV without its header, with a
// short line or a member twice fails t.
func readGrantCSV(t *testing.T, path string) map[string]answer {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(lines) == 0 || !slices.Equal(lines[0], []string{"member", "result", "coupon_id"}) {
		t.Fatalf("%s: no header member,result,coupon_id: %q", path, lines)
	}
	got := map[string]answer{}
	for _, l := range lines[1:] {
		if _, dup := got[l[0]]; dup {
			t.Fatalf("%s: member %s twice", path, l[0])
		}
		got[l[0]] = answer{l[1], l[2]}
	}
	return got
}

// summaryCount is the count of result in grant's summary table, -1 when it has no such line.
func summaryCount(t *testing.T, summary, result string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(result) + ` +(\d+)$`).FindStringSubmatch(summary)
	if m == nil {
		return -1
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// grantCLI runs couponctl in this process with args and returns its exit code and output.
func grantCLI(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// The 10,000-member scenario: campaign GRANT has room for 9,000 coupons; of the members, 200
// have used their month's cap on CAP and 100 had a coupon of GRANT voided before the grant.
// With -short, the same scenario at a fifth of its size, every check the same: 2,000 members,
// room for 1,800, 40 capped, 20 voided (a grant of 10,000 members, run three times, takes
// most of the package's CPU).
func scenarioSize() (members, room, capped, voided int) {
	if testing.Short() {
		return 2_000, 1_800, 40, 20
	}
	return 10_000, 9_000, 200, 100
}

// newGrantScenario makes the scenario's database and member file.
func newGrantScenario(t *testing.T) (grantDB, string, []string) {
	t.Helper()
	scenarioMembers, scenarioRoom, scenarioCapped, scenarioVoided := scenarioSize()
	d := newGrantDB(t,
		campaign.Campaign{ID: "GRANT", DiscountYen: 1000, BudgetYen: scenarioRoom * 1000, Stripes: 8},
		campaign.Campaign{ID: "CAP", DiscountYen: issuance.DefaultMonthlyCapYen, BudgetYen: 100_000_000})
	path, members := memberFile(t, "g", scenarioMembers)
	svc, err := issuance.New(d.owner, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, m := range members[:scenarioCapped+scenarioVoided] {
		id := "CAP"
		if i >= scenarioCapped {
			id = "GRANT"
		}
		out, err := svc.Issue(ctx, m, id)
		if err != nil || out.Result != issuance.ResultIssued {
			t.Fatalf("issue %s to %s: %+v, %v", id, m, out, err)
		}
		if id == "GRANT" {
			if _, err := coupon.Void(ctx, d.owner, out.CouponID, "issued by mistake", false); err != nil {
				t.Fatal(err)
			}
		}
	}
	return d, path, members
}

// scenarioProblems checks the scenario after a grant ran to its end with csvPath its CSV, and
// first the coupons (member -> id) an earlier, interrupted run left: each member answered once,
// with one coupon or a refusal, which the tables agree with; no member holds two coupons of
// GRANT, voided ones included; every member the first run reached answered ALREADY_ISSUED with
// the first run's coupon; GRANT issued exactly its room; R1-R3 hold. It returns what is wrong,
// counted by kind.
func scenarioProblems(t *testing.T, d grantDB, members []string, first map[string]string, csvPath string) []string {
	t.Helper()
	_, scenarioRoom, scenarioCapped, scenarioVoided := scenarioSize()
	answers := readGrantCSV(t, csvPath)
	type held struct {
		couponID string
		voided   bool
		rows     int
	}
	tables := map[string]held{}
	rows, err := d.owner.Query(context.Background(), `
SELECT member_id, coupon_id::text, voided_at IS NOT NULL, count(*) OVER (PARTITION BY member_id)::int
  FROM issued_coupons WHERE campaign_id = 'GRANT'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var m string
		var h held
		if err := rows.Scan(&m, &h.couponID, &h.voided, &h.rows); err != nil {
			t.Fatal(err)
		}
		if prev, ok := tables[m]; !ok || prev.voided { // the live coupon, when the member has one
			tables[m] = h
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	wrong := map[string]int{}
	results := map[string]int{}
	for _, m := range members {
		a, ok := answers[m]
		h, has := tables[m]
		results[a.result]++
		switch {
		case !ok:
			wrong["a member without an answer in the CSV"]++
			continue
		case h.rows > 1:
			wrong["a member with more than one coupon of the campaign (voided ones included)"]++
		}
		switch a.result {
		case "ISSUED", "ALREADY_ISSUED":
			if !has || h.voided || h.couponID != a.couponID {
				wrong[a.result+" with a coupon id that is not the member's live coupon"]++
			}
		case "COUPON_VOIDED":
			if !has || !h.voided || h.couponID != a.couponID {
				wrong["COUPON_VOIDED with a coupon id that is not the member's voided coupon"]++
			}
		case "MONTHLY_CAP", "BUDGET_EXCEEDED":
			if has {
				wrong[a.result+" for a member who holds a coupon"]++
			}
		default:
			wrong["an answer that is neither a coupon nor a refusal: "+a.result]++
		}
		if id, reached := first[m]; reached && (a.result != "ALREADY_ISSUED" || a.couponID != id) {
			wrong["a member the first run reached, answered other than ALREADY_ISSUED with the first run's coupon"]++
		}
	}
	if n := len(answers) - len(members); n != 0 {
		wrong[fmt.Sprintf("%d answers for members not in the file", n)]++
	}
	live := d.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'GRANT' AND voided_at IS NULL`)
	if live != scenarioRoom {
		wrong[fmt.Sprintf("%d live coupons of GRANT, want its room %d", live, scenarioRoom)]++
	}
	if results["MONTHLY_CAP"] != scenarioCapped || results["COUPON_VOIDED"] != scenarioVoided {
		wrong[fmt.Sprintf("%d MONTHLY_CAP and %d COUPON_VOIDED, want %d and %d",
			results["MONTHLY_CAP"], results["COUPON_VOIDED"], scenarioCapped, scenarioVoided)]++
	}
	rep, err := reconcile.Check(context.Background(), d.owner)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations() {
		wrong[v]++
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(wrong)) {
		out = append(out, fmt.Sprintf("%s (%d)", k, wrong[k]))
	}
	t.Logf("answers: %v", results)
	return out
}

// startGrant starts the couponctl binary granting GRANT to the members of path, as the
// coupon_admin login, and returns it, its output and a channel closed when it has exited.
func startGrant(t *testing.T, d grantDB, path, out string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer, chan struct{}) {
	t.Helper()
	cmd := exec.Command(proctest.Build(t, "."), "grant", "--campaign", "GRANT", "--members", path, "--out", out)
	cmd.Env = proctest.Env("DATABASE_URL=" + d.admin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	return cmd, &stdout, &stderr, done
}

// interruptAtHalf waits until the grant has issued half its members a coupon, and sends it sig.
// It fails t if the grant ends first.
func interruptAtHalf(t *testing.T, d grantDB, cmd *exec.Cmd, stderr *bytes.Buffer, done chan struct{}, sig syscall.Signal) {
	t.Helper()
	scenarioMembers, _, _, _ := scenarioSize()
	// A loaded machine grants a few hundred members a second: the bound is generous.
	pgtest.Eventually(t, 5*time.Minute, func() error {
		select {
		case <-done:
			return nil
		default:
		}
		if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'GRANT' AND granted_by IS NOT NULL`); n < scenarioMembers/2 {
			return fmt.Errorf("%d coupons granted so far", n)
		}
		return nil
	})
	select {
	case <-done:
		t.Fatalf("the grant ended before it was interrupted: %v\n%s", cmd.ProcessState, stderr)
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	<-done
}

// TestGrantKilledAndRerun: a grant to 10,000 members killed (SIGKILL) once about half hold a
// coupon, then run again to its end: every member ends with one coupon or a refusal, none with
// two, and each member the first run reached answers ALREADY_ISSUED with the first run's coupon;
// R1-R3 hold. The broken variant, a grant that mints a fresh coupon per run, is seen.
func TestGrantKilledAndRerun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		broken [][2]string
	}{
		{"grant_coupons_batch", nil},
		{"broken: a fresh coupon per run", freshCouponPerRun},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d, path, members := newGrantScenario(t)
			csvPath := filepath.Join(t.TempDir(), "answers.csv")
			cmd, _, stderr, done := startGrant(t, d, path, csvPath)
			interruptAtHalf(t, d, cmd, stderr, done, syscall.SIGKILL)
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the first run: %v, want killed by SIGKILL", cmd.ProcessState)
			}
			if _, err := os.Stat(csvPath); err == nil {
				t.Errorf("a killed grant left %s: it is written whole or not at all", csvPath)
			}
			// A killed client's sessions run on to the end of their calls, which may commit: what
			// the first run left is known once they are gone.
			d.waitSessionsGone(t)
			first := d.coupons(t, "GRANT")
			t.Logf("the first run, killed, left %d coupons", len(first))

			if c.broken != nil {
				pgtest.BreakFunction(t, d.owner, "grant_coupons_batch_v3", c.broken...)
			}
			code, stdout, stderr2 := couponctlBin(t, []string{"DATABASE_URL=" + d.admin},
				"grant", "--campaign", "GRANT", "--members", path, "--out", csvPath)
			wrong := scenarioProblems(t, d, members, first, csvPath)
			if c.broken != nil {
				if len(wrong) == 0 {
					t.Fatal("the broken variant passed: the test would not see it")
				}
				t.Logf("the broken variant: %v", wrong)
				return
			}
			if code != 0 {
				t.Errorf("the re-run: exit %d, want 0 (refusals are answers)\n%s%s", code, stdout, stderr2)
			}
			for _, w := range wrong {
				t.Error(w)
			}
			if summaryCount(t, stdout, "ALREADY_ISSUED") != len(first) || !strings.Contains(stderr2, fmt.Sprintf("%d of them already hold its coupon", len(first))) {
				t.Errorf("the re-run's summary does not count the first run's %d coupons as ALREADY_ISSUED:\n%s%s", len(first), stdout, stderr2)
			}
		})
	}
}

// TestGrantInterrupted: Ctrl-C (SIGINT) at about half stops the grant with exit 130 and a CSV
// written whole, which is the tables' state exactly: every member it lists holds the coupon it
// names (or the refusal), and every coupon granted is in it. The same command then finishes the
// grant, the members of the partial CSV answering ALREADY_ISSUED with its coupons.
func TestGrantInterrupted(t *testing.T) {
	t.Parallel()
	scenarioMembers, _, _, _ := scenarioSize()
	d, path, members := newGrantScenario(t)
	csvPath := filepath.Join(t.TempDir(), "answers.csv")
	cmd, stdout, stderr, done := startGrant(t, d, path, csvPath)
	interruptAtHalf(t, d, cmd, stderr, done, syscall.SIGINT)
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("exit %d after SIGINT, want 130\n%s", code, stderr)
	}
	for _, w := range []string{"grant: interrupted after", "run the same command again", "couponctl: interrupted"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("stderr does not say %q:\n%s", w, stderr)
		}
	}
	if !strings.Contains(stdout.String(), "(not sent)") {
		t.Errorf("the summary does not count the members not sent:\n%s", stdout)
	}
	partial := readGrantCSV(t, csvPath)
	granted := d.coupons(t, "GRANT")
	first := map[string]string{}
	for m, a := range partial {
		if a.result == "ISSUED" {
			first[m] = a.couponID
		}
	}
	if len(partial) >= len(members) || len(first) < scenarioMembers/2 {
		t.Errorf("the partial CSV answers %d members, %d ISSUED: want fewer than %d, at least %d issued",
			len(partial), len(first), len(members), scenarioMembers/2)
	}
	if !maps.Equal(first, granted) {
		var missing int
		for m, id := range granted {
			if first[m] != id {
				missing++
			}
		}
		t.Errorf("the partial CSV's ISSUED (%d) are not the coupons granted (%d): %d granted coupons are not in it as such",
			len(first), len(granted), missing)
	}

	code, out, errOut := couponctlBin(t, []string{"DATABASE_URL=" + d.admin},
		"grant", "--campaign", "GRANT", "--members", path, "--out", csvPath)
	if code != 0 {
		t.Errorf("the re-run: exit %d, want 0\n%s%s", code, out, errOut)
	}
	for _, w := range scenarioProblems(t, d, members, first, csvPath) {
		t.Error(w)
	}
}

// TestGrantIdempotent: a second run of the same file issues nothing new and answers
// ALREADY_ISSUED with the first run's coupon ids; each coupon records the granting login. The
// broken variant, a grant that mints a fresh coupon per run, is seen.
func TestGrantIdempotent(t *testing.T) {
	for _, c := range []struct {
		name   string
		broken [][2]string
	}{
		{"grant_coupons_batch", nil},
		{"broken: a fresh coupon per run", freshCouponPerRun},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newGrantDB(t, campaign.Campaign{ID: "ONCE", DiscountYen: 500, BudgetYen: 1_000_000})
			if c.broken != nil {
				pgtest.BreakFunction(t, d.owner, "grant_coupons_batch_v3", c.broken...)
			}
			t.Setenv("DATABASE_URL", d.admin)
			path, members := memberFile(t, "o", 200)
			csvPath := filepath.Join(t.TempDir(), "answers.csv")
			args := []string{"grant", "--campaign", "ONCE", "--members", path, "--out", csvPath, "--concurrency", "4"}
			if code, stdout, stderr := grantCLI(args...); code != 0 || summaryCount(t, stdout, "ISSUED") != 200 {
				t.Fatalf("the first run: exit %d, want 0 and 200 ISSUED\n%s%s", code, stdout, stderr)
			}
			firstCSV := readGrantCSV(t, csvPath)
			code, stdout, stderr := grantCLI(args...)
			second := readGrantCSV(t, csvPath)
			var wrong []string
			if code != 0 {
				wrong = append(wrong, fmt.Sprintf("the second run: exit %d\n%s%s", code, stdout, stderr))
			}
			for _, m := range members {
				if second[m] != (answer{"ALREADY_ISSUED", firstCSV[m].couponID}) {
					wrong = append(wrong, fmt.Sprintf("%s: the second run answered %v, the first %v", m, second[m], firstCSV[m]))
					break
				}
			}
			if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'ONCE'`); n != len(members) {
				wrong = append(wrong, fmt.Sprintf("%d coupons of ONCE after two runs, want %d", n, len(members)))
			}
			if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE granted_by LIKE 'coupon_admin_%'`); n != len(members) {
				wrong = append(wrong, fmt.Sprintf("%d coupons record the coupon_admin login, want %d", n, len(members)))
			}
			if c.broken != nil {
				if len(wrong) == 0 {
					t.Fatal("the broken variant passed: the test would not see it")
				}
				t.Logf("the broken variant: %v", wrong)
				return
			}
			for _, w := range wrong {
				t.Error(w)
			}
			if summaryCount(t, stdout, "ALREADY_ISSUED") != 200 || !strings.Contains(stderr, "200 of them already hold its coupon") {
				t.Errorf("the second run's output does not say all 200 hold the coupon:\n%s%s", stdout, stderr)
			}
		})
	}
}

// TestGrantExitsOneOnError: a member whose call fails (a trigger refuses its coupon) is an
// ERROR in the CSV and the summary, with the error; the others are granted; the grant exits 1
// and says to run it again.
func TestGrantExitsOneOnError(t *testing.T) {
	d := newGrantDB(t, campaign.Campaign{ID: "ERR", DiscountYen: 500, BudgetYen: 1_000_000})
	_, err := d.owner.Exec(context.Background(), `
CREATE FUNCTION refuse_e00007() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the test refuses e00007''s coupon'; END $$;
CREATE TRIGGER refuse_e00007 BEFORE INSERT ON issued_coupons
  FOR EACH ROW WHEN (NEW.member_id = 'e00007') EXECUTE FUNCTION refuse_e00007()`)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("DATABASE_URL", d.admin)
	path, members := memberFile(t, "e", 20)
	csvPath := filepath.Join(t.TempDir(), "answers.csv")
	code, stdout, stderr := grantCLI("grant", "--campaign", "ERR", "--members", path, "--out", csvPath)
	if code != 1 {
		t.Errorf("exit %d, want 1\n%s%s", code, stdout, stderr)
	}
	if summaryCount(t, stdout, "ISSUED") != 19 || summaryCount(t, stdout, "ERROR") != 1 {
		t.Errorf("the summary does not count 19 ISSUED and 1 ERROR:\n%s", stdout)
	}
	for _, w := range []string{"error: e00007: ", "the test refuses e00007's coupon"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("the summary does not say %q:\n%s", w, stdout)
		}
	}
	if !strings.Contains(stderr, "1 members were not granted because of errors") {
		t.Errorf("stderr does not say a member was not granted:\n%s", stderr)
	}
	answers := readGrantCSV(t, csvPath)
	if a := answers["e00007"]; a != (answer{"ERROR", ""}) || len(answers) != len(members) {
		t.Errorf("the CSV: e00007 %v, %d members; want ERROR without a coupon, %d", a, len(answers), len(members))
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'ERR'`); n != 19 {
		t.Errorf("%d coupons, want 19", n)
	}
}

// TestGrantChecksFirst: what would make every member fail, or is not a grant, is refused before
// anything is issued, saying what to do: exit 2 for a command line couponctl does not accept,
// 1 for the rest; the tables hold no coupon afterwards.
func TestGrantChecksFirst(t *testing.T) {
	longAgo, past, future := time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	d := newGrantDB(t,
		campaign.Campaign{ID: "OK", DiscountYen: 500, BudgetYen: 1_000_000},
		campaign.Campaign{ID: "PAUSED", DiscountYen: 500, BudgetYen: 1_000_000},
		campaign.Campaign{ID: "ENDED", DiscountYen: 500, BudgetYen: 1_000_000, StartsAt: &longAgo, EndsAt: &past},
		campaign.Campaign{ID: "LATER", DiscountYen: 500, BudgetYen: 1_000_000, StartsAt: &future},
		campaign.Campaign{ID: "BIG", DiscountYen: 3000, BudgetYen: 1_000_000},
		campaign.Campaign{ID: "SPENT", DiscountYen: 500, BudgetYen: 500},
		campaign.Campaign{ID: "EXPIRED", DiscountYen: 500, BudgetYen: 1_000_000, CouponsExpireAt: &future})
	ctx := context.Background()
	if _, err := campaign.Pause(ctx, d.owner, "PAUSED", "test"); err != nil {
		t.Fatal(err)
	}
	// The clock passes EXPIRED's fixed coupon expiry.
	if _, err := d.owner.Exec(ctx, `UPDATE campaign_budgets SET coupons_expire_at = now() WHERE campaign_id = 'EXPIRED'`); err != nil {
		t.Fatal(err)
	}
	if _, err := d.owner.Exec(ctx, `UPDATE campaign_budgets SET issued_yen = budget_yen WHERE campaign_id = 'SPENT'`); err != nil {
		t.Fatal(err)
	}
	good, _ := memberFile(t, "c", 3)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.txt")
	empty := filepath.Join(dir, "empty.txt")
	if err := os.WriteFile(bad, []byte("c1\n# a comment\nc 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte("# nobody\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	issuer := pgtest.LoginAs(t, d.url, "coupon_issue")
	for _, c := range []struct {
		db   string
		args []string
		code int
		want string
	}{
		{d.admin, []string{"--members", good}, 2, "grant needs --campaign ID and --members FILE"},
		{d.admin, []string{"--campaign", "OK"}, 2, "grant needs --campaign ID and --members FILE"},
		{d.admin, []string{"--campaign", "OK", "--members", good, "--concurrency", "0"}, 2, "--concurrency 0: want 1-64"},
		{d.admin, []string{"--campaign", "bad id", "--members", good}, 2, "--campaign: "},
		{d.admin, []string{"--campaign", "OK", "--members", filepath.Join(dir, "none.txt")}, 2, "none.txt: no such file"},
		{d.admin, []string{"--campaign", "OK", "--members", bad}, 2, "bad.txt:3: invalid id"},
		{d.admin, []string{"--campaign", "OK", "--members", empty}, 2, "empty.txt: no ids in it"},
		{issuer, []string{"--campaign", "OK", "--members", good}, 1, "may not grant coupons: a grant runs as a user in coupon_admin"},
		{d.admin, []string{"--campaign", "NOPE", "--members", good}, 1, "campaign NOPE does not exist (couponctl campaign list"},
		{d.admin, []string{"--campaign", "PAUSED", "--members", good}, 1, "is paused since"},
		{d.admin, []string{"--campaign", "ENDED", "--members", good}, 1, "move its end first"},
		{d.admin, []string{"--campaign", "EXPIRED", "--members", good}, 1, "ended when its coupons expired at"},
		{d.admin, []string{"--campaign", "LATER", "--members", good}, 1, "run the grant then, or move its start"},
		{d.admin, []string{"--campaign", "BIG", "--members", good}, 1, "above the 2000 yen monthly cap"},
		{d.admin, []string{"--campaign", "SPENT", "--members", good}, 1, "raise its budget first (couponctl campaign update SPENT --add-budget-yen"},
		{d.admin, []string{"--campaign", "OK", "--members", good, "--out", filepath.Join(dir, "no", "such", "dir.csv")}, 1, "such/dir.csv: its directory: "},
	} {
		t.Setenv("DATABASE_URL", c.db)
		code, stdout, stderr := grantCLI(append([]string{"grant"}, c.args...)...)
		if code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, want %d saying %q\n%s%s", c.args, code, c.code, c.want, stdout, stderr)
		}
		if c.code == 1 && !strings.Contains(stderr, "nothing was issued") {
			t.Errorf("%q: the refusal does not say nothing was issued:\n%s", c.args, stderr)
		}
		// A command line not understood prints the usage; a file refused (exit 2 too) names its
		// line and says nothing was issued.
		if file := strings.Contains(c.want, ".txt"); c.code == 2 && !file && !strings.Contains(stderr, "Usage:") {
			t.Errorf("%q: exit 2 without the usage:\n%s", c.args, stderr)
		} else if c.code == 2 && file && !strings.Contains(stderr, "nothing was issued") {
			t.Errorf("%q: the refused file does not say nothing was issued:\n%s", c.args, stderr)
		}
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons`); n != 0 {
		t.Errorf("%d coupons issued by refused grants", n)
	}
}
