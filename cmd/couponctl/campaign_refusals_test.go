package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestCampaignUpdateOutOfRangeExitsTwo: campaign update's out-of-range values (--stripes 0,
// --coupon-valid-days -1) exit 2 with one "couponctl: " line and the usage, as campaign create's
// do, and change nothing (before: exit 1, the database's refusal). The campaign's history is
// counted with SQL. Shown red on the broken variant, the range checks left to the database.
func TestCampaignUpdateOutOfRangeExitsTwo(t *testing.T) {
	checkAndBreak(t, updateRangesCheck, brokenVariant{"the range checks left to the database", func(t *testing.T) {
		swap(t, &changeRanges, func(*pflag.FlagSet, int, int) error { return nil })
	}})
}

func updateRangesCheck(t *testing.T, v *verdict) {
	d := newGrantDB(t, campaign.Campaign{ID: "RANGE", DiscountYen: 500, BudgetYen: 10_000})
	t.Setenv("DATABASE_URL", d.admin)
	for _, args := range [][]string{
		{"campaign", "update", "RANGE", "--stripes", "0", "--reason", "r"},
		{"campaign", "update", "RANGE", "--stripes", "65", "--reason", "r"},
		{"campaign", "update", "RANGE", "--coupon-valid-days", "-1", "--reason", "r"},
	} {
		code, stdout, stderr := grantCLI(args...)
		if code != 2 || strings.Count(stderr, "couponctl: ") != 1 || !strings.Contains(stderr, "Usage:") {
			v.Errorf("%q: exit %d, want 2 with one couponctl: line and the usage\n%s%s", args, code, stdout, stderr)
		}
	}
	if n := d.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'RANGE' AND what <> 'create'`); n != 0 {
		v.Errorf("%d changes recorded by refused updates", n)
	}
}

// TestResumeOfAnEndedCampaign: campaign resume of an ended (and paused) campaign is refused,
// exit 1, naming campaign update --ends, and changes nothing (before: it answered "resume
// changed", wrote a 'resume' row in the history and left the campaign closed). Counted with SQL.
// Shown red on the broken variant, campaign_change_state without its refusal of an ended
// campaign (campaign_refuse_ended), which resumes whatever the campaign's state.
func TestResumeOfAnEndedCampaign(t *testing.T) {
	checkAndBreak(t, resumeEndedCheck, brokenVariant{"resume blind to the end", func(t *testing.T) {
		swap(t, &resumeEndedBreak, func(t *testing.T, owner *pgxpool.Pool) {
			pgtest.BreakFunction(t, owner, "campaign_change_state", [2]string{"    PERFORM campaign_refuse_ended(v_first, p_what, v_at);\n", ""})
		})
	}})
}

// resumeEndedBreak installs resumeEndedCheck's broken variant in the database owner connects to:
// nothing, unless TestResumeOfAnEndedCampaign swaps the variant in.
var resumeEndedBreak = func(*testing.T, *pgxpool.Pool) {}

func resumeEndedCheck(t *testing.T, v *verdict) {
	ends := time.Now().Add(time.Hour)
	d := newGrantDB(t, campaign.Campaign{ID: "OVER", DiscountYen: 500, BudgetYen: 10_000, EndsAt: &ends})
	if _, err := campaign.Pause(context.Background(), d.owner, "OVER", "paused before its end"); err != nil {
		t.Fatal(err)
	}
	pgtest.SetClock(t, d.owner, ends.Add(time.Hour))
	resumeEndedBreak(t, d.owner)
	t.Setenv("DATABASE_URL", d.admin)
	code, stdout, stderr := grantCLI("campaign", "resume", "OVER", "--reason", "r")
	if code != 1 || !strings.Contains(stderr, "campaign OVER has ended") ||
		!strings.Contains(stderr, "couponctl campaign update OVER --ends T") {
		v.Errorf("resume of an ended campaign: exit %d, want 1 naming campaign update --ends\n%s%s", code, stdout, stderr)
	}
	if n := d.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'OVER' AND what = 'resume'`); n != 0 {
		v.Errorf("%d 'resume' rows in the history of an ended campaign, want none", n)
	}
}
