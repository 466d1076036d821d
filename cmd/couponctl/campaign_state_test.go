package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestCampaignStateWithReleases: campaign show's state and list's kind column for a campaign with
// releases say what IssueCoupon answers, as the database judges it at its clock (moved with
// pgtest.SetClock): not started until the first release (NOT_STARTED), the released coupons taken
// with the next release's instant (BUDGET_EXCEEDED with next_release_at) or none to come, the
// budget spent; and how many coupons can be taken now, a voided coupon given back to what is
// released.
func TestCampaignStateWithReleases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := func(day int) time.Time { return time.Date(2026, 12, 5+day, 9, 0, 0, 0, time.UTC) } // 18:00 JST
	d := newGrantDB(t,
		campaign.Campaign{ID: "R", DiscountYen: 100, BudgetYen: 10_000, Releases: []campaign.Release{{At: at(0), Coupons: 10}, {At: at(1), Coupons: 10}}},
		campaign.Campaign{ID: "SPENT", DiscountYen: 100, BudgetYen: 1_000, Releases: []campaign.Release{{At: at(0), Coupons: 10}}},
		campaign.Campaign{ID: "PLAIN", DiscountYen: 100, BudgetYen: 10_000})
	issue := func(id string, n int) {
		t.Helper()
		if _, err := d.owner.Exec(ctx, `SELECT * FROM issue_coupons_batch_v3($1, (SELECT array_agg(gen_random_uuid()) FROM generate_series(1, $2)),
			(SELECT array_agg($1 || '-' || g || '-' || extract(epoch FROM issue_now())) FROM generate_series(1, $2) g),
			array_fill(NULL::text, ARRAY[$2]))`, id, n); err != nil {
			t.Fatal(err)
		}
	}
	show := func(id string) campaign.Status {
		t.Helper()
		s, err := campaign.Show(ctx, d.owner, id)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, c := range []struct {
		name  string
		clock time.Time
		do    func()
		id    string
		state string
		avail int
		kind  string
	}{
		{"before the first release", at(0).Add(-time.Hour), nil, "R", "not started (first release at 2026-12-05T18:00:00+09:00)", 0,
			"releases 0/2 open, next 2026-12-05T18:00:00+09:00"},
		{"the released coupons taken", at(0).Add(time.Minute), func() { issue("R", 10) }, "R",
			"active (released coupons taken; next release at 2026-12-06T18:00:00+09:00)", 0, "releases 1/2 open, next 2026-12-06T18:00:00+09:00"},
		{"one voided of them", at(0).Add(2 * time.Minute), func() {
			if _, err := d.owner.Exec(ctx, `SELECT coupon_void((SELECT min(coupon_id::text)::uuid FROM issued_coupons WHERE campaign_id = 'R'), 'test', false)`); err != nil {
				t.Fatal(err)
			}
		}, "R", "active", 1, "releases 1/2 open, next 2026-12-06T18:00:00+09:00"},
		{"every release taken", at(1).Add(time.Minute), func() { issue("R", 11) }, "R", "active (released coupons taken; no release to come)", 0, "releases 2/2 open"},
		{"the budget spent", at(1).Add(2 * time.Minute), func() { issue("SPENT", 10) }, "SPENT", "active (budget spent)", 0, "releases 1/1 open"},
		{"no releases", at(1).Add(3 * time.Minute), func() { issue("PLAIN", 30) }, "PLAIN", "active", 70, "-"},
	} {
		pgtest.SetClock(t, d.owner, c.clock)
		if c.do != nil {
			c.do()
		}
		s := show(c.id)
		if got := state(s); got != c.state {
			t.Errorf("%s: state %q, want %q", c.name, got, c.state)
		}
		if s.RemainingCoupons != c.avail {
			t.Errorf("%s: %d coupons to take now, want %d", c.name, s.RemainingCoupons, c.avail)
		}
		if got := kinds(s); got != c.kind {
			t.Errorf("%s: kind %q, want %q", c.name, got, c.kind)
		}
	}
	var out bytes.Buffer
	writeCampaign(&out, show("R"))
	for _, w := range []string{"budget     10000 yen (100 coupons)", "issued     2000 yen (20 coupons)", "remaining  8000 yen (80 coupons)",
		"released   20 of 20 coupons, in 2 of 2 releases; 0 coupons to take now",
		"2026-12-05T18:00:00+09:00  10       10               yes"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("campaign show lacks %q:\n%s", w, out.String())
		}
	}
}
