package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestCampaignChangeVerbs runs the live-campaign verbs as a user in coupon_admin: each change
// prints what it changed and the campaign after it, and lands in the history with its reason and
// login; a cut below the issued yen exits 1 naming the issued yen; a command line that cannot be
// a change exits 2 with the usage.
func TestCampaignChangeVerbs(t *testing.T) {
	url := pgtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	if out, err := couponctl("campaign", "create", "--id", "LIVE", "--discount-yen", "1000", "--budget-yen", "10000"); err != nil {
		t.Fatalf("campaign create: %v\n%s", err, out)
	}
	t.Setenv("DATABASE_URL", pgtest.LoginAs(t, url, "coupon_admin"))
	ctx := context.Background()
	cli := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(ctx, args, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	for _, step := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"campaign", "update", "LIVE", "--add-budget-yen", "5000", "--stripes", "3", "--reason", "raise"}, 0,
			[]string{"LIVE: budget changed", "LIVE: stripes changed", "before  budget_yen=10000 issued_yen=0 stripes=1",
				"after   budget_yen=15000 issued_yen=0 stripes=3", "budget     15000 yen", "stripes    3"}},
		{[]string{"campaign", "pause", "LIVE", "--reason", "runaway"}, 0, []string{"LIVE: pause changed", "state      paused since"}},
		{[]string{"campaign", "pause", "LIVE", "--reason", "again"}, 0, []string{"LIVE: nothing to change, it already is so"}},
		{[]string{"campaign", "show", "LIVE"}, 0, []string{"state      paused since"}},
		{[]string{"campaign", "resume", "LIVE", "--reason", "fixed"}, 0, []string{"LIVE: resume changed", "state      active"}},
		{[]string{"campaign", "update", "LIVE", "--budget-yen", "500", "--reason", "cut"}, 1, []string{"not between one 1000 yen coupon", "nothing changed"}},
		{[]string{"campaign", "update", "LIVE", "--ends", "2099-01-01T00:00:00+09:00", "--reason", "extended"}, 0,
			[]string{"LIVE: period changed", "ends_at=2099-01-01T00:00:00+09:00"}},
		{[]string{"campaign", "update", "LIVE", "--ends", "open", "--reason", "open again"}, 0, []string{"ends_at=(open)"}},
		{[]string{"campaign", "end", "LIVE", "--reason", "over"}, 0, []string{"LIVE: end changed", "state      ended"}},
		{[]string{"campaign", "list"}, 0, []string{"LIVE", "ended"}},
		{[]string{"campaign", "history", "LIVE"}, 0, []string{"budget", "stripes", "pause", "resume", "period", "end", "runaway", "extended"}},
		{[]string{"campaign", "update", "LIVE", "--add-budget-yen", "1000", "--reason", "after the end"}, 1,
			[]string{"campaign LIVE has ended", "move its end first", "nothing changed"}},
		{[]string{"campaign", "update", "NOPE", "--stripes", "2", "--reason", "x"}, 1, []string{"campaign: not found: NOPE (couponctl campaign list shows the campaigns)"}},
		{[]string{"campaign", "pause", "LIVE"}, 2, []string{"campaign pause needs --reason TEXT"}},
		{[]string{"campaign", "update", "LIVE", "--reason", "x"}, 2, []string{"nothing to change"}},
		{[]string{"campaign", "update", "LIVE", "--budget-yen", "1", "--add-budget-yen", "1", "--reason", "x"}, 2, []string{"not both"}},
		{[]string{"campaign", "update", "LIVE", "--ends", "tomorrow", "--reason", "x"}, 2, []string{"want RFC 3339"}},
		{[]string{"campaign", "update", "LIVE", "--stripes", "2", "--reason", " "}, 2, []string{"campaign update needs --reason TEXT"}},
		{[]string{"campaign", "update", "LIVE", "--budget-yen", "-5", "--reason", "x"}, 2, []string{"--budget-yen -5: want 1 to 2147483647 yen"}},
		{[]string{"campaign", "update", "LIVE", "--add-budget-yen", "9223372036854775807", "--reason", "x"}, 2, []string{"--add-budget-yen 9223372036854775807: want"}},
		{[]string{"campaign", "history", "bad id!"}, 2, []string{"campaign"}},
	} {
		code, stdout, stderr := cli(step.args...)
		if code != step.code {
			t.Errorf("%v: exit %d, want %d\n%s%s", step.args, code, step.code, stdout, stderr)
		}
		for _, w := range step.want {
			if !strings.Contains(stdout+stderr, w) {
				t.Errorf("%v: output lacks %q:\n%s%s", step.args, w, stdout, stderr)
			}
		}
	}
	// The history names the login that made each change.
	_, stdout, _ := cli("campaign", "history", "LIVE")
	if n := strings.Count(stdout, "coupon_admin_"); n != 7 {
		t.Errorf("history: %d rows by the coupon_admin login, want 7:\n%s", n, stdout)
	}
}

// TestCampaignName: campaign create --name names a campaign, show prints it beside the id,
// update --name renames it with a 'name' history row (before, after, reason); a blank name or
// one of 101 characters is refused before anything is sent (exit 2), nothing changed.
func TestCampaignName(t *testing.T) {
	d := newGrantDB(t)
	t.Setenv("DATABASE_URL", d.admin)
	for _, step := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"campaign", "create", "--id", "NAMED", "--name", "年末感謝祭 500円クーポン", "--discount-yen", "500", "--coupons", "10"}, 0, "created NAMED"},
		{[]string{"campaign", "show", "NAMED"}, 0, "name       年末感謝祭 500円クーポン"},
		{[]string{"campaign", "update", "NAMED", "--name", "年末感謝祭（延長）", "--reason", "延長"}, 0, "NAMED: name changed"},
		{[]string{"campaign", "show", "NAMED"}, 0, "name       年末感謝祭（延長）"},
		{[]string{"campaign", "update", "NAMED", "--name", "  ", "--reason", "x"}, 2, "--name: "},
		{[]string{"campaign", "create", "--id", "LONG", "--name", strings.Repeat("名", 101), "--discount-yen", "500", "--coupons", "10"}, 2, "a name of 1-100 characters"},
	} {
		code, stdout, stderr := grantCLI(step.args...)
		if code != step.code || !strings.Contains(stdout+stderr, step.want) {
			t.Errorf("%q: exit %d, want %d saying %q\n%s%s", step.args, code, step.code, step.want, stdout, stderr)
		}
	}
	if n := d.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'NAMED' AND what = 'name'
  AND after->>'name' = '年末感謝祭（延長）' AND before->>'name' = '年末感謝祭 500円クーポン'`); n != 1 {
		t.Errorf("%d 'name' history rows from the first name to the second, want 1", n)
	}
	if n := d.count(t, `SELECT count(*) FROM campaign_budgets WHERE campaign_id = 'LONG'`); n != 0 {
		t.Errorf("a campaign with a 101-character name was created")
	}
}
