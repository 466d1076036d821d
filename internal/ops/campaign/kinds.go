package campaign

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/shared/ids"
)

// Release is one scheduled release of a campaign's coupons (campaign_releases,
// 00025_campaign_kinds.sql): from At on, Coupons more coupons may be issued. Coupons not taken
// roll over to the next release; the budget still caps everything. The issuance judges a release
// at the instant it writes its budget stripe, by the database's clock: no coupon of a release
// commits before At.
type Release struct {
	At      time.Time
	Coupons int
}

// MaxReleases bounds the releases [Campaign.Validate] takes in one campaign create: a daily
// release for a year.
const MaxReleases = 366

// MaxAudienceChange is the most member ids one campaign_audience_change call takes
// (00025_campaign_kinds.sql): [AudienceChange] is called with chunks of at most this many.
const MaxAudienceChange = 1000

// CheckReleases checks c's releases, as [Campaign.Validate] does: whole positive coupon counts,
// at most [MaxReleases], no two at one instant, each before the campaign's end, and no more
// coupons in all than the budget holds. campaign_create refuses the same (CI422).
func (c Campaign) CheckReleases() error {
	if len(c.Releases) > MaxReleases {
		return fmt.Errorf("campaign %s: %d releases: want at most %d", c.ID, len(c.Releases), MaxReleases)
	}
	seen := make(map[int64]bool, len(c.Releases))
	total := int64(0)
	for _, r := range c.Releases {
		switch {
		case r.Coupons < 1:
			return fmt.Errorf("campaign %s: a release of %d coupons at %s: want at least 1", c.ID, r.Coupons, tokyo(&r.At))
		case seen[r.At.UnixMicro()]:
			return fmt.Errorf("campaign %s: two releases at %s: give one release per instant", c.ID, tokyo(&r.At))
		case c.EndsAt != nil && !r.At.Before(*c.EndsAt):
			return fmt.Errorf("campaign %s: a release at %s, at or after its end at %s: it could never issue", c.ID, tokyo(&r.At), tokyo(c.EndsAt))
		}
		seen[r.At.UnixMicro()] = true
		total += int64(r.Coupons)
	}
	if c.DiscountYen > 0 && total > int64(c.BudgetYen/c.DiscountYen) {
		return fmt.Errorf("campaign %s: the releases give %d coupons, above the budget's %d (%d yen of %d yen coupons)",
			c.ID, total, c.BudgetYen/c.DiscountYen, c.BudgetYen, c.DiscountYen)
	}
	return nil
}

// ReleasedCoupons is how many coupons c's releases give in all.
func (c Campaign) ReleasedCoupons() int {
	n := 0
	for _, r := range c.Releases {
		n += r.Coupons
	}
	return n
}

// DailyReleases returns days releases of coupons each at hour:minute Asia/Tokyo time on
// consecutive Asia/Tokyo days. The first is on starts' Asia/Tokyo date, or on the next day when
// hour:minute of that date comes before starts: no release is ever before the campaign starts.
// Asia/Tokyo has kept +09:00 without daylight saving since 1951, so each day is 24 hours.
func DailyReleases(starts time.Time, hour, minute, coupons, days int) []Release {
	s := starts.In(jst)
	first := time.Date(s.Year(), s.Month(), s.Day(), hour, minute, 0, 0, jst)
	if first.Before(starts) {
		first = first.AddDate(0, 0, 1)
	}
	out := make([]Release, days)
	for i := range out {
		out[i] = Release{At: first.AddDate(0, 0, i), Coupons: coupons}
	}
	return out
}

// ReleaseStatus is a release as [Show] reads it: Released is how many coupons the campaign's
// releases have given up to and including this one, Open whether its instant has come by the
// database's clock.
type ReleaseStatus struct {
	Release
	Released int
	Open     bool
}

// sqlReleases are the releases of the campaigns $1, by campaign and instant, each with the
// coupons released up to it and whether it is open by the database's clock (the one the
// issuance judges by).
const sqlReleases = `
SELECT campaign_id, at, coupons, sum(coupons) OVER (PARTITION BY campaign_id ORDER BY at)::integer, at <= issue_now()
  FROM campaign_releases WHERE campaign_id = ANY($1) ORDER BY campaign_id, at`

// readReleases fills in the releases of list's campaigns.
func readReleases(ctx context.Context, db reader, list []Status) error {
	idx := make(map[string]int, len(list))
	campaigns := make([]string, len(list))
	for i, s := range list {
		idx[s.ID], campaigns[i] = i, s.ID
	}
	rows, err := db.Query(ctx, sqlReleases, campaigns)
	if err != nil {
		return err
	}
	var id string
	var r ReleaseStatus
	_, err = pgx.ForEachRow(rows, []any{&id, &r.At, &r.Coupons, &r.Released, &r.Open}, func() error {
		s := &list[idx[id]]
		s.Releases = append(s.Releases, r.Release)
		s.Schedule = append(s.Schedule, r)
		return nil
	})
	return err
}

// OpenReleases is how many of s's releases are open, and the coupons they have released.
func (s Status) OpenReleases() (open, released int) {
	for _, r := range s.Schedule {
		if r.Open {
			open, released = open+1, r.Released
		}
	}
	return open, released
}

// sqlReleaseAdd adds a release through campaign_release_add (00025_campaign_kinds.sql), which
// writes its history row; [Update] sends it for [Changes.Releases].
const sqlReleaseAdd = `SELECT ` + changeColumns + ` FROM campaign_release_add($1, $2, $3, $4)`

// AudienceChange adds members to campaign id's audience (add), or removes them, through
// campaign_audience_change (00025_campaign_kinds.sql) in one transaction that writes one history
// row, and returns how many it changed: a member already in (or, removing, not in) the audience
// is left as it is, so a chunk sent twice changes nothing the second time. members holds 1 to
// [MaxAudienceChange] member ids. Errors: a member id that is not one, [ErrNotFound],
// [ErrRefused] (a campaign open to every member: only an [Campaign.AudienceOnly] one has an
// audience), [ErrBusy], or the database's; nothing changed.
func AudienceChange(ctx context.Context, db Querier, id string, members []string, add bool, reason string) (int, error) {
	if len(members) == 0 || len(members) > MaxAudienceChange {
		return 0, fmt.Errorf("%w: campaign %s: %d members in one audience change: want 1-%d", ErrRefused, id, len(members), MaxAudienceChange)
	}
	for _, m := range members {
		if err := ids.Member(m); err != nil {
			return 0, fmt.Errorf("%w: member id %q: %v", ErrRefused, m, err)
		}
	}
	var changed int
	b := &pgx.Batch{}
	b.Queue(`SELECT campaign_audience_change($1, $2, $3, $4)`, id, members, add, reason).QueryRow(func(row pgx.Row) error {
		return row.Scan(&changed)
	})
	if err := sendChange(ctx, db, id, b); err != nil {
		return 0, err
	}
	return changed, nil
}
