package issuance_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// TestAnswersCarryTheDatabasesClock: the database's clock (issue_now(), moved with
// pgtest.SetClock) crosses a Tokyo month boundary and a release's instant while the service's
// own clock reads today: every answer names what the database stamped and judged. A coupon
// issued a microsecond before 2026-12-01 00:00 JST answers month 2026-11, one issued at it
// 2026-12, through IssueCoupon's call and the grant's, each the month of its row; a microsecond
// before a release the dry run and the issuance answer NOT_STARTED with that release as
// next_release_at, at it AVAILABLE and ISSUED. The broken variant, the month taken from the
// service's clock at the request (as issuance.go did before 00031), is kept as a fixture and
// shown to fail the same checks.
func TestAnswersCarryTheDatabasesClock(t *testing.T) {
	t.Parallel()
	midnight := time.Date(2026, 12, 1, 0, 0, 0, 0, issuance.Tokyo)
	release := midnight.Add(10 * time.Hour)
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t, 4)
			pgtest.SetClock(t, pool, midnight.Add(-time.Hour)) // the release is to come when it is made
			for _, c := range []campaign.Campaign{{ID: "M", DiscountYen: 100, BudgetYen: 10_000},
				{ID: "R", DiscountYen: 100, BudgetYen: 10_000, Releases: []campaign.Release{{At: release, Coupons: 1}}}} {
				if err := campaign.Create(ctx, pool, c); err != nil {
					t.Fatal(err)
				}
			}
			svc, err := issuance.New(pool, issuance.Config{BatchMax: 1})
			if err != nil {
				t.Fatal(err)
			}
			issue, grant := svc.Issue, svc.Grant
			if broken {
				issue, grant = monthOfTheServicesClock(svc.Issue), monthOfTheServicesClock(svc.Grant)
			}
			var wrong []string
			for _, c := range []struct {
				at     time.Time
				member string
				call   func(context.Context, string, string) (issuance.Outcome, error)
				month  string
			}{
				{midnight.Add(-time.Microsecond), "m-nov", issue, "2026-11"},
				{midnight, "m-dec", issue, "2026-12"},
				{midnight.Add(-time.Microsecond), "g-nov", grant, "2026-11"},
				{midnight, "g-dec", grant, "2026-12"},
			} {
				pgtest.SetClock(t, pool, c.at)
				out, err := c.call(ctx, c.member, "M")
				var stamped string
				if qerr := pool.QueryRow(ctx, `SELECT month FROM issued_coupons WHERE member_id = $1`, c.member).Scan(&stamped); qerr != nil {
					t.Fatal(qerr)
				}
				if err != nil || out.Result != issuance.ResultIssued || out.Month != c.month || stamped != c.month {
					wrong = append(wrong, fmt.Sprintf("%s at %s: %s month %s (%v), its row %s; want ISSUED in %s",
						c.member, c.at.Format(time.RFC3339Nano), out.Result, out.Month, err, stamped, c.month))
				}
			}
			pgtest.SetClock(t, pool, release.Add(-time.Microsecond))
			dry, derr := svc.DryRun(ctx, "r1", "R")
			out, err := issue(ctx, "r1", "R")
			for _, got := range []struct {
				what   string
				result issuance.Result
				reason string
				next   *time.Time
				err    error
			}{{"dry run", dry.Result, dry.Reason, dry.NextReleaseAt, derr}, {"issuance", out.Result, out.Reason, out.NextReleaseAt, err}} {
				if got.err != nil || got.result != issuance.ResultCampaignNotActive || got.reason != issuance.ReasonNotStarted ||
					got.next == nil || !got.next.Equal(release) {
					wrong = append(wrong, fmt.Sprintf("a microsecond before the release, the %s: %s %s %v (%v), want NOT_STARTED, next %s",
						got.what, got.result, got.reason, got.next, got.err, release))
				}
			}
			pgtest.SetClock(t, pool, release)
			dry, derr = svc.DryRun(ctx, "r1", "R")
			out, err = issue(ctx, "r1", "R")
			if derr != nil || dry.Result != issuance.ResultAvailable || err != nil || out.Result != issuance.ResultIssued || out.Month != "2026-12" {
				wrong = append(wrong, fmt.Sprintf("at the release: the dry run %s (%v), the issuance %s in %s (%v); want AVAILABLE, ISSUED in 2026-12",
					dry.Result, derr, out.Result, out.Month, err))
			}
			pgtest.Verdict(t, broken, wrong)
		})
	}
}

// monthOfTheServicesClock is the broken variant kept as a fixture: call's answers with the month
// of the service's clock at the request, as Issue named it before 00031.
func monthOfTheServicesClock(call func(context.Context, string, string) (issuance.Outcome, error)) func(context.Context, string, string) (issuance.Outcome, error) {
	return func(ctx context.Context, member, campaignID string) (issuance.Outcome, error) {
		month := issuance.Month(time.Now())
		out, err := call(ctx, member, campaignID)
		if out.Result == issuance.ResultIssued {
			out.Month = month
		}
		return out, err
	}
}
