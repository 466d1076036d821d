package campaign_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// What a change may do to an ended campaign is judged inside the change functions, under the
// campaign's lock (campaign_refuse_ended, 00031): a pause, a resume, a budget change and a
// release are refused (CI422: ErrRefused), a move of its end or of its coupons' expiry reopens
// it, and an update that does both reopens it first.

// TestEndedCampaignTakesOnlyAReopening: a campaign whose end has passed (the database's clock
// moved past it) refuses a pause, a resume, a budget change and a release, each naming its end
// and changing nothing (its history counted with SQL); a move of its end reopens it, and one
// update that moves its end and raises its budget does both.
func TestEndedCampaignTakesOnlyAReopening(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ends := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	l := newLive(t, campaign.Campaign{ID: "OVER", DiscountYen: coupon, BudgetYen: 10 * coupon, EndsAt: &ends,
		Releases: []campaign.Release{{At: time.Now().Add(30 * time.Minute), Coupons: 5}}})
	if _, err := campaign.Pause(ctx, l.admin, "OVER", "paused before its end"); err != nil {
		t.Fatal(err)
	}
	pgtest.SetClock(t, l.pool, ends.Add(time.Minute))
	add := int64(coupon)
	for _, c := range []struct {
		what string
		do   func() error
	}{
		{"pause", func() error { _, err := campaign.Pause(ctx, l.admin, "OVER", "again"); return err }},
		{"resume", func() error { _, err := campaign.Resume(ctx, l.admin, "OVER", "reopen?"); return err }},
		{"budget change", func() error {
			_, err := campaign.Update(ctx, l.admin, "OVER", campaign.Changes{AddBudgetYen: &add, Reason: "more"})
			return err
		}},
		{"release", func() error {
			_, err := campaign.Update(ctx, l.admin, "OVER", campaign.Changes{
				Releases: []campaign.Release{{At: ends.Add(time.Hour), Coupons: 1}}, Reason: "more"})
			return err
		}},
	} {
		if err := c.do(); !errors.Is(err, campaign.ErrRefused) || !strings.Contains(err.Error(), "has ended") {
			t.Errorf("a %s of an ended campaign: %v, want it refused as ended", c.what, err)
		}
	}
	if n := l.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'OVER' AND what NOT IN ('create', 'pause')`); n != 0 {
		t.Errorf("%d history rows after the refused changes, want none", n)
	}
	later := ends.Add(2 * time.Hour)
	got, err := campaign.Update(ctx, l.admin, "OVER", campaign.Changes{SetEnds: true, EndsAt: &later, AddBudgetYen: &add, Reason: "reopened"})
	if err != nil || len(got) != 2 || got[0].What != "period" || got[1].What != "budget" {
		t.Fatalf("a move of the end with a raise: %+v %v, want the period then the budget changed", got, err)
	}
	if s, err := campaign.Show(ctx, l.admin, "OVER"); err != nil || s.State != campaign.StatePaused || s.BudgetYen != 11*coupon {
		t.Errorf("after the reopening: %s, budget %d (%v), want PAUSED with 11 coupons of budget", s.State, s.BudgetYen, err)
	}
}

// TestEndJudgedUnderTheLock: a resume and a budget change that arrive while an end is in flight
// (its transaction holds the campaign's stripes, uncommitted) wait for it (pg_blocking_pids) and
// are refused once it commits: no history row but the end's. The broken variant is the
// judgement outside the lock, as couponctl campaign resume and the console made it before 00031:
// the campaign read (not ended yet) before the change is sent, and no judgement in the change
// functions; both go through after the end.
func TestEndJudgedUnderTheLock(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			l := newLive(t, campaign.Campaign{ID: "RACE", DiscountYen: coupon, BudgetYen: 10 * coupon})
			if _, err := campaign.Pause(ctx, l.admin, "RACE", "a pause to resume"); err != nil {
				t.Fatal(err)
			}
			judge := func(change func() error) error { return change() }
			if broken {
				for _, fn := range []string{"campaign_change_state", "campaign_change_budget"} {
					pgtest.BreakFunction(t, l.pool, fn, [2]string{"PERFORM campaign_refuse_ended(", "PERFORM 1, ("})
				}
				judge = judgedOutsideTheLock(l)
			}
			end, err := l.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer end.Rollback(ctx)
			var pid int
			if err := end.QueryRow(ctx, `SELECT pg_backend_pid() FROM campaign_change_state('RACE', 'end', NULL, NULL, false, false, 'the end')`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			add := int64(coupon)
			errs := make(chan error, 2)
			go func() {
				errs <- judge(func() error { _, err := campaign.Resume(ctx, l.admin, "RACE", "resume"); return err })
			}()
			go func() {
				errs <- judge(func() error {
					_, err := campaign.Update(ctx, l.admin, "RACE", campaign.Changes{AddBudgetYen: &add, Reason: "more"})
					return err
				})
			}()
			pgtest.WaitBlockedBy(t, l.pool, pid, 2)
			if err := end.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var wrong []string
			for range 2 {
				if err := <-errs; !errors.Is(err, campaign.ErrRefused) {
					wrong = append(wrong, fmt.Sprintf("a change behind the end: %v, want it refused", err))
				}
			}
			if n := l.count(t, `SELECT count(*) FROM campaign_changes WHERE campaign_id = 'RACE' AND what IN ('resume', 'budget')`); n != 0 {
				wrong = append(wrong, fmt.Sprintf("%d resume or budget rows after the end", n))
			}
			pgtest.Verdict(t, broken, wrong)
		})
	}
}

// judgedOutsideTheLock is the broken variant's judgement, kept as a fixture: the campaign read
// as it is committed, a change of an ended one refused before it is sent, as resumeUnlessEnded
// (couponctl) and the console's resume did before 00031.
func judgedOutsideTheLock(l *live) func(change func() error) error {
	return func(change func() error) error {
		s, err := campaign.Show(context.Background(), l.admin, "RACE")
		if err != nil {
			return err
		}
		if s.State == campaign.StateEnded || s.State == campaign.StateExpired {
			return fmt.Errorf("%w: campaign RACE has ended", campaign.ErrRefused)
		}
		return change()
	}
}
