package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// TestCampaignCreateCounts: --coupons N --discount-yen D makes a budget of N x D yen, with
// --budget-yen equal to it or without it; releases alone make a budget of their coupons; an
// --audience-only campaign is created audience-only. Judged by the budget stripes and releases
// counted with SQL; show and list then give the counts beside the yen, the issued coupons
// counted from issued_coupons after a grant.
func TestCampaignCreateCounts(t *testing.T) {
	d := newGrantDB(t)
	t.Setenv("DATABASE_URL", d.admin)
	for _, step := range []struct {
		args      []string
		id        string
		budgetYen int
		releases  int
		audience  bool
	}{
		{[]string{"--id", "FIRST", "--discount-yen", "300", "--coupons", "1000", "--stripes", "4"}, "FIRST", 300_000, 0, false},
		{[]string{"--id", "BOTH", "--discount-yen", "500", "--coupons", "20", "--budget-yen", "10000"}, "BOTH", 10_000, 0, false},
		{[]string{"--id", "REL", "--discount-yen", "500", "--release", "2020-01-01T10:00:00+09:00=30",
			"--release", "2099-01-01T10:00:00+09:00=20"}, "REL", 25_000, 2, false},
		{[]string{"--id", "GOLD", "--discount-yen", "1000", "--coupons", "50", "--audience-only"}, "GOLD", 50_000, 0, true},
	} {
		var code int
		var stdout, stderr string
		// REL's first release has passed: it is created before it (campaign create refuses one).
		pgtest.AtClock(t, d.owner, time.Date(2019, 12, 31, 0, 0, 0, 0, issuance.Tokyo), func() {
			code, stdout, stderr = grantCLI(append([]string{"campaign", "create"}, step.args...)...)
		})
		if code != 0 {
			t.Fatalf("create %v: exit %d\n%s%s", step.args, code, stdout, stderr)
		}
		if want := fmt.Sprintf("budget %d yen (%d coupons)", step.budgetYen, step.budgetYen/d.count(t,
			`SELECT min(discount_yen) FROM campaign_budgets WHERE campaign_id = $1`, step.id)); !strings.Contains(stdout, want) {
			t.Errorf("create %s: output lacks %q:\n%s", step.id, want, stdout)
		}
		if got := d.count(t, `SELECT sum(budget_yen) FROM campaign_budgets WHERE campaign_id = $1`, step.id); got != step.budgetYen {
			t.Errorf("%s: budget %d yen in the stripes, want %d", step.id, got, step.budgetYen)
		}
		if got := d.count(t, `SELECT count(*) FROM campaign_releases WHERE campaign_id = $1`, step.id); got != step.releases {
			t.Errorf("%s: %d releases, want %d", step.id, got, step.releases)
		}
		if got := d.count(t, `SELECT count(*) FROM campaign_budgets WHERE campaign_id = $1 AND audience_only`, step.id) > 0; got != step.audience {
			t.Errorf("%s: audience-only %v, want %v", step.id, got, step.audience)
		}
	}

	path, _ := memberFile(t, "c", 3)
	if code, stdout, stderr := grantCLI("grant", "--campaign", "FIRST", "--members", path, "--out", t.TempDir()+"/g.csv"); code != 0 {
		t.Fatalf("grant: exit %d\n%s%s", code, stdout, stderr)
	}
	issued := d.count(t, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'FIRST' AND voided_at IS NULL`)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"campaign", "show", "FIRST"}, []string{"budget     300000 yen (1000 coupons)",
			fmt.Sprintf("issued     %d yen (%d coupons)", issued*300, issued),
			fmt.Sprintf("remaining  %d yen (%d coupons)", (1000-issued)*300, 1000-issued)}},
		{[]string{"campaign", "show", "REL"}, []string{"released   30 of 50 coupons, in 1 of 2 releases; 30 coupons to take now",
			"2020-01-01T10:00:00+09:00  30       30               yes", "2099-01-01T10:00:00+09:00  20       50               no"}},
		{[]string{"campaign", "show", "GOLD"}, []string{"audience   0 members, audience-only: any other member is answered NOT_ELIGIBLE"}},
		{[]string{"campaign", "list"}, []string{fmt.Sprintf("%d/1000 ", issued), "releases 1/2 open, next 2099-01-01T10:00:00+09:00",
			"audience-only (0 members)"}},
	} {
		code, stdout, stderr := grantCLI(c.args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", c.args, code, stdout, stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(stdout, w) {
				t.Errorf("%v: output lacks %q:\n%s", c.args, w, stdout)
			}
		}
	}
	if issued != 3 {
		t.Errorf("%d coupons granted, want 3", issued)
	}
}

// TestCampaignCreateBadForms: each form couponctl cannot take exits 2 with one "couponctl:" line
// naming its flag and the usage, and a refusal by the database exits 1; nothing is created
// (campaigns counted with SQL).
func TestCampaignCreateBadForms(t *testing.T) {
	d := newGrantDB(t, campaign.Campaign{ID: "TAKEN", DiscountYen: 100, BudgetYen: 1000})
	t.Setenv("DATABASE_URL", d.admin)
	base := []string{"campaign", "create", "--id", "BAD", "--discount-yen", "500"}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "give the budget: --budget-yen N (yen) or --coupons N"},
		{[]string{"--coupons", "0"}, 2, "--coupons 0: want at least 1"},
		{[]string{"--coupons", "10", "--budget-yen", "4000"}, 2, "--budget-yen 4000 is not --coupons 10 x --discount-yen 500 = 5000 yen"},
		{[]string{"--coupons", "5000000"}, 2, "--coupons 5000000 x --discount-yen 500 = 2500000000 yen: above"},
		{[]string{"--release", "tomorrow=5"}, 2, `--release "tomorrow=5": want AT=N`},
		{[]string{"--release", "2099-01-01T10:00:00+09:00"}, 2, `--release "2099-01-01T10:00:00+09:00": want AT=N`},
		{[]string{"--release", "2099-01-01T10:00:00+09:00=0"}, 2, `--release "2099-01-01T10:00:00+09:00=0": N must be a whole number of coupons`},
		{[]string{"--release", "2099-01-01T10:00:00+09:00=x"}, 2, `--release "2099-01-01T10:00:00+09:00=x": N must be a whole number of coupons`},
		{[]string{"--release", "2099-01-01T10:00:00.5+09:00=5"}, 2, `--release "2099-01-01T10:00:00.5+09:00=5": AT must be a whole second`},
		{[]string{"--release", "0001-01-01T00:00:00Z=5"}, 2, `--release "0001-01-01T00:00:00Z=5": AT before the year 2000 is a mistake`},
		{[]string{"--release", "2099-01-01T10:00:00+09:00=5", "--release", "2099-01-01T01:00:00Z=5"}, 2,
			"--release/--daily-release: campaign BAD: two releases at 2099-01-01T10:00:00+09:00"},
		{[]string{"--coupons", "10", "--release", "2099-01-01T10:00:00+09:00=11"}, 2,
			"--release/--daily-release: campaign BAD: the releases give 11 coupons, above the budget's 10"},
		{[]string{"--ends", "2099-01-01T00:00:00+09:00", "--release", "2099-01-01T10:00:00+09:00=5"}, 2,
			"--release/--daily-release: campaign BAD: a release at 2099-01-01T10:00:00+09:00, at or after its end"},
		{[]string{"--daily-release", "10:00=5"}, 2, "--daily-release needs --days K"},
		{[]string{"--daily-release", "10:00=5", "--days", "3"}, 2, "--daily-release needs --starts T"},
		{[]string{"--daily-release", "10:00=5", "--days", "0", "--starts", "2099-01-01T00:00:00+09:00"}, 2, "--daily-release needs --days K, 1-366"},
		{[]string{"--daily-release", "24:00=5", "--days", "3", "--starts", "2099-01-01T00:00:00+09:00"}, 2, `--daily-release "24:00=5": want HH:MM=N`},
		{[]string{"--daily-release", "9:00=5", "--days", "3", "--starts", "2099-01-01T00:00:00+09:00"}, 2, `--daily-release "9:00=5": want HH:MM=N`},
		{[]string{"--daily-release", "09:00=-1", "--days", "3", "--starts", "2099-01-01T00:00:00+09:00"}, 2, `--daily-release "09:00=-1": N must be a whole number of coupons`},
		{[]string{"--days", "3", "--coupons", "10"}, 2, "--days 3 needs --daily-release HH:MM=N"},
		{[]string{"--discount-yen", "0", "--coupons", "10"}, 2, "--discount-yen 0: want a positive number of yen"},
	} {
		code, stdout, stderr := grantCLI(append(append([]string{}, base...), c.args...)...)
		if code != c.code || !strings.Contains(stderr, c.want) || strings.Count(stderr, "couponctl: ") != 1 ||
			!strings.Contains(stderr, "Usage:") {
			t.Errorf("%v: exit %d, want %d with one couponctl: line saying %q and the usage\n%s%s", c.args, code, c.code, c.want, stdout, stderr)
		}
	}
	code, stdout, stderr := grantCLI("campaign", "create", "--id", "TAKEN", "--discount-yen", "100", "--coupons", "3",
		"--release", "2099-01-01T10:00:00+09:00=3")
	if code != 1 || !strings.Contains(stderr, "couponctl: campaign: already exists: TAKEN") {
		t.Errorf("create of a campaign that exists: exit %d, want 1 naming it\n%s%s", code, stdout, stderr)
	}
	if n := d.count(t, `SELECT count(*) FROM campaigns`); n != 1 {
		t.Errorf("%d campaigns after the refusals, want only TAKEN", n)
	}
	if n := d.count(t, `SELECT count(*) FROM campaign_releases`); n != 0 {
		t.Errorf("%d releases after the refusals, want none", n)
	}
}

// TestDailyReleaseTokyoDays: --daily-release HH:MM=N --days K releases at HH:MM Asia/Tokyo
// (00:00 and 09:00 JST are not UTC midnight), on consecutive Tokyo days from --starts' Tokyo
// date, the first on the next day when HH:MM that day is before --starts, and at --starts itself
// when they are equal. Judged by the instants in campaign_releases, read with SQL. Shown red on
// two broken variants: the days and HH:MM taken in UTC (a release at 10:00 UTC, 19:00 JST), and
// the first release on --starts' date even before --starts.
func TestDailyReleaseTokyoDays(t *testing.T) {
	checkAndBreak(t, dailyReleaseCheck,
		brokenVariant{"days and HH:MM in UTC", func(t *testing.T) {
			swap(t, &dailyReleases, func(starts time.Time, hour, minute, coupons, days int) []campaign.Release {
				s := starts.UTC()
				first := time.Date(s.Year(), s.Month(), s.Day(), hour, minute, 0, 0, time.UTC)
				if first.Before(starts) {
					first = first.AddDate(0, 0, 1)
				}
				out := make([]campaign.Release, days)
				for i := range out {
					out[i] = campaign.Release{At: first.AddDate(0, 0, i), Coupons: coupons}
				}
				return out
			})
		}},
		brokenVariant{"the first release before --starts", func(t *testing.T) {
			swap(t, &dailyReleases, func(starts time.Time, hour, minute, coupons, days int) []campaign.Release {
				s := starts.In(issuance.Tokyo)
				first := time.Date(s.Year(), s.Month(), s.Day(), hour, minute, 0, 0, issuance.Tokyo)
				out := make([]campaign.Release, days)
				for i := range out {
					out[i] = campaign.Release{At: first.AddDate(0, 0, i), Coupons: coupons}
				}
				return out
			})
		}})
}

func dailyReleaseCheck(t *testing.T, v *verdict) {
	d := newGrantDB(t)
	t.Setenv("DATABASE_URL", d.admin)
	// The database's clock before the releases below: create refuses a release that has passed.
	pgtest.SetClock(t, d.owner, time.Date(2026, 12, 1, 0, 0, 0, 0, issuance.Tokyo))
	for _, c := range []struct {
		id, starts, daily string
		want              []string // the releases' instants in UTC
	}{
		// 00:30 JST is the previous UTC day: the first release is at 10:00 JST that Tokyo day.
		{"TEN", "2026-12-05T00:30:00+09:00", "10:00=50", []string{"2026-12-05T01:00:00Z", "2026-12-06T01:00:00Z", "2026-12-07T01:00:00Z"}},
		// Tokyo midnight (15:00 UTC the day before), at the start itself.
		{"MIDNIGHT", "2026-12-04T15:00:00Z", "00:00=10", []string{"2026-12-04T15:00:00Z", "2026-12-05T15:00:00Z", "2026-12-06T15:00:00Z"}},
		// 09:00 JST is UTC midnight; a start at 09:30 JST puts the first release on the next day.
		{"NINE", "2026-12-05T09:30:00+09:00", "09:00=10", []string{"2026-12-06T00:00:00Z", "2026-12-07T00:00:00Z", "2026-12-08T00:00:00Z"}},
		// 23:59 JST across the end of a month and a year.
		{"EVE", "2026-12-31T00:00:00+09:00", "23:59=10", []string{"2026-12-31T14:59:00Z", "2027-01-01T14:59:00Z", "2027-01-02T14:59:00Z"}},
	} {
		code, stdout, stderr := grantCLI("campaign", "create", "--id", c.id, "--discount-yen", "100", "--starts", c.starts,
			"--daily-release", c.daily, "--days", "3")
		if code != 0 {
			v.Errorf("%s: exit %d\n%s%s", c.id, code, stdout, stderr)
			continue
		}
		rows, err := d.owner.Query(context.Background(),
			`SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') FROM campaign_releases WHERE campaign_id = $1 ORDER BY at`, c.id)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, " ") != strings.Join(c.want, " ") {
			v.Errorf("%s: --starts %s --daily-release %s: releases at %v, want %v", c.id, c.starts, c.daily, got, c.want)
		}
	}
}

// TestCampaignUpdateRelease: campaign update --release AT=N adds a release with its history row
// and reason, after a budget raise given in the same command (one transaction, the raise
// first); the database's refusals (an instant past by its clock, printed at +09:00; releases
// above the budget; a campaign created without releases) exit 1 and change nothing, the raise
// given with a refused release included; a malformed --release exits 2 naming it. campaign
// create refuses a past instant as update does (before 00034: created, its coupons open at
// once, exit 0). Judged by campaign_releases, the budget and the history counted with SQL.
func TestCampaignUpdateRelease(t *testing.T) {
	d := newGrantDB(t, campaign.Campaign{ID: "PLAIN", DiscountYen: 100, BudgetYen: 1000})
	t.Setenv("DATABASE_URL", d.admin)
	code, stdout, stderr := grantCLI("campaign", "create", "--id", "LATE", "--discount-yen", "100",
		"--release", "2099-01-01T10:00:00+09:00=5", "--release", "2020-01-01T10:00:00+09:00=5")
	if want := "campaign LATE: a release at 2020-01-01T10:00:00+09:00 is not after the database's clock ("; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("create with a past release: exit %d, want 1 saying %q\n%s%s", code, want, stdout, stderr)
	}
	if n := d.count(t, `SELECT count(*) FROM campaign_budgets WHERE campaign_id = 'LATE'`); n != 0 {
		t.Errorf("create with a past release left %d budget rows, want none", n)
	}
	if code, stdout, stderr := grantCLI("campaign", "create", "--id", "REL", "--discount-yen", "100",
		"--release", "2099-01-01T10:00:00+09:00=5"); code != 0 {
		t.Fatalf("create: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, step := range []struct {
		args             []string
		code             int
		want             []string
		releases, budget int
	}{
		{[]string{"REL", "--add-budget-yen", "500", "--release", "2099-01-02T10:00:00+09:00=5", "--reason", "day 2 (PROMO-77)"}, 0,
			[]string{"REL: budget changed", "REL: release changed", "before  released_coupons=5",
				"after   at=2099-01-02T10:00:00+09:00 coupons=5 released_coupons=10", "2099-01-02T10:00:00+09:00  5        10               no"}, 2, 1000},
		{[]string{"REL", "--add-budget-yen", "500", "--release", "2020-01-01T10:00:00+09:00=5", "--reason", "late"}, 1,
			[]string{"couponctl: campaign: change refused: campaign REL: a release at 2020-01-01T10:00:00+09:00 is not after the database's clock (", "+09:00); nothing changed"}, 2, 1000},
		{[]string{"REL", "--release", "2099-01-03T10:00:00+09:00=1", "--reason", "over"}, 1,
			[]string{"releases of 11 coupons in all, above the budget's 10 coupons"}, 2, 1000},
		{[]string{"REL", "--release", "2099-01-02T10:00:00+09:00", "--reason", "x"}, 2,
			[]string{`--release "2099-01-02T10:00:00+09:00": want AT=N`, "Usage:"}, 2, 1000},
		{[]string{"PLAIN", "--release", "2099-01-02T10:00:00+09:00=1", "--reason", "x"}, 1,
			[]string{"campaign PLAIN was created without releases"}, 2, 1000},
		{[]string{"REL", "--ends", "2099-01-02T00:00:00+09:00", "--reason", "shorter"}, 0,
			[]string{"warning: 1 of campaign REL's releases to come are at or after its end or its coupons' expiry: they will never open"}, 2, 1000},
	} {
		code, stdout, stderr := grantCLI(append([]string{"campaign", "update"}, step.args...)...)
		if code != step.code {
			t.Errorf("%v: exit %d, want %d\n%s%s", step.args, code, step.code, stdout, stderr)
		}
		for _, w := range step.want {
			if !strings.Contains(stdout+stderr, w) {
				t.Errorf("%v: output lacks %q:\n%s%s", step.args, w, stdout, stderr)
			}
		}
		if n := d.count(t, `SELECT count(*) FROM campaign_releases WHERE campaign_id = 'REL'`); n != step.releases {
			t.Errorf("%v: %d releases, want %d", step.args, n, step.releases)
		}
		if n := d.count(t, `SELECT sum(budget_yen) FROM campaign_budgets WHERE campaign_id = 'REL'`); n != step.budget {
			t.Errorf("%v: budget %d yen, want %d", step.args, n, step.budget)
		}
	}
	if n := d.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'REL' AND what = 'release' AND reason = 'day 2 (PROMO-77)'`); n != 1 {
		t.Errorf("%d release rows in REL's history with the reason, want 1", n)
	}
	if n := d.count(t, `SELECT count(*) FROM campaign_changes WHERE what <> 'create'`); n != 3 {
		t.Errorf("%d changes in the history, want the raise and the release of the one command that passed, and the end moved", n)
	}
}

// TestGrantOnACampaignWithReleases: grant judges a campaign with releases as IssueCoupon does
// before it sends anything: before its first release it is not started (refused, exit 1, naming
// the release's instant; before, the check read the campaign's start, nil, and panicked), and
// once the released coupons are taken it has no room (refused, naming the next release; before,
// the check read the budget alone and sent every member). Nothing issued, counted with SQL.
func TestGrantOnACampaignWithReleases(t *testing.T) {
	d := newGrantDB(t)
	t.Setenv("DATABASE_URL", d.admin)
	for _, args := range [][]string{
		{"--id", "LATER", "--release", "2099-01-01T10:00:00+09:00=5"},
		{"--id", "TAKEN", "--release", "2020-01-01T10:00:00+09:00=5", "--release", "2099-01-01T10:00:00+09:00=5"},
	} {
		var code int
		var stdout, stderr string
		// TAKEN's first release has passed: it is created before it (campaign create refuses one).
		pgtest.AtClock(t, d.owner, time.Date(2019, 12, 31, 0, 0, 0, 0, issuance.Tokyo), func() {
			code, stdout, stderr = grantCLI(append([]string{"campaign", "create", "--discount-yen", "100"}, args...)...)
		})
		if code != 0 {
			t.Fatalf("create %v: exit %d\n%s%s", args, code, stdout, stderr)
		}
	}
	// The five coupons released in 2020 are taken (the counter as five issuances leave it).
	if _, err := d.owner.Exec(context.Background(), `UPDATE campaign_budgets SET issued_yen = 500 WHERE campaign_id = 'TAKEN'`); err != nil {
		t.Fatal(err)
	}
	path, _ := memberFile(t, "r", 3)
	for _, c := range []struct{ id, want string }{
		{"LATER", "couponctl: grant: campaign LATER opens with a release at 2099-01-01T10:00:00+09:00: the 3 members without its coupon would answer CAMPAIGN_NOT_ACTIVE; run the grant then, or add an earlier release"},
		{"TAKEN", "couponctl: grant: campaign TAKEN's released coupons are taken: the 3 members without its coupon would answer " +
			"BUDGET_EXCEEDED; run the grant after its next release, at 2099-01-01T10:00:00+09:00; nothing was issued"},
	} {
		code, stdout, stderr := grantCLI("grant", "--campaign", c.id, "--members", path, "--out", t.TempDir()+"/g.csv")
		if code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("grant %s: exit %d, want 1 saying %q\n%s%s", c.id, code, c.want, stdout, stderr)
		}
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons`); n != 0 {
		t.Errorf("%d coupons issued by refused grants, want none", n)
	}
}
