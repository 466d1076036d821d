package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// TestCampaignStateWithReleases: campaign show's state and list's kind column for a campaign with
// releases say what IssueCoupon answers: not started until the first release (NOT_STARTED),
// the released coupons taken with the next release's instant (BUDGET_EXCEEDED with
// next_release_at) or none to come, the budget spent; and how many coupons can be taken now, a
// voided coupon given back to what is released.
func TestCampaignStateWithReleases(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 30, 0, time.UTC)
	at := func(day int) time.Time { return time.Date(2026, 12, 5+day, 9, 0, 0, 0, time.UTC) } // 18:00 JST
	status := func(issued int, open ...bool) campaign.Status {
		s := campaign.Status{Campaign: campaign.Campaign{ID: "R", DiscountYen: 100, BudgetYen: 10_000}, IssuedYen: issued * 100}
		released := 0
		for i, o := range open {
			released += 10
			s.Releases = append(s.Releases, campaign.Release{At: at(i), Coupons: 10})
			s.Schedule = append(s.Schedule, campaign.ReleaseStatus{Release: s.Releases[i], Released: released, Open: o})
			if !o && s.NextReleaseAt == nil {
				s.NextReleaseAt = &s.Releases[i].At // as release_next reads it for a campaign without a period
			}
		}
		return s
	}
	for _, c := range []struct {
		name  string
		s     campaign.Status
		state string
		avail int
		kind  string
	}{
		{"before the first release", status(0, false, false), "not started (first release at 2026-12-05T18:00:00+09:00)", 0,
			"releases 0/2 open, next 2026-12-05T18:00:00+09:00"},
		{"the released coupons taken", status(10, true, false), "active (released coupons taken; next release at 2026-12-06T18:00:00+09:00)", 0,
			"releases 1/2 open, next 2026-12-06T18:00:00+09:00"},
		{"one voided of them", status(9, true, false), "active", 1, "releases 1/2 open, next 2026-12-06T18:00:00+09:00"},
		{"every release taken", status(20, true, true), "active (released coupons taken; no release to come)", 0, "releases 2/2 open"},
		{"the budget spent", status(100, true), "active (budget spent)", 0, "releases 1/1 open"},
		{"no releases", status(30), "active", 70, "-"},
	} {
		if got := state(c.s, now); got != c.state {
			t.Errorf("%s: state %q, want %q", c.name, got, c.state)
		}
		if got := c.s.AvailableCoupons(); got != c.avail {
			t.Errorf("%s: %d coupons to take now, want %d", c.name, got, c.avail)
		}
		if got := kinds(c.s); got != c.kind {
			t.Errorf("%s: kind %q, want %q", c.name, got, c.kind)
		}
	}
	var out bytes.Buffer
	writeCampaign(&out, status(12, true, true), now)
	for _, w := range []string{"budget     10000 yen (100 coupons)", "issued     1200 yen (12 coupons)", "remaining  8800 yen (88 coupons)",
		"released   20 of 20 coupons, in 2 of 2 releases; 8 coupons to take now",
		"2026-12-05T18:00:00+09:00  10       10               yes"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("campaign show lacks %q:\n%s", w, out.String())
		}
	}
}
