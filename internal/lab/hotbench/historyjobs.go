package hotbench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/reconcile"
)

// HistoryChange is what [ChangeHistory] changed, in coupons.
type HistoryChange struct {
	Issued, Voided int64
	Campaigns      int64 // the campaigns created for the coupons issued
}

// changeCampaigns bounds the campaigns [ChangeHistory] issues from.
const changeCampaigns = 100

// sqlChangeIssue issues $1 coupons at issue_now(), set-based, writing what the issuance writes
// for each: a UUIDv7 coupon of one of $3 campaigns $2NNN in turn (discount 100 to 500 yen as the
// history's campaigns), to a new member $4k; the member-month's usage row, an open outbox row,
// and the campaign's counter (one stripe). It answers the coupons issued.
var sqlChangeIssue = `
WITH s AS MATERIALIZED (
  SELECT ` + sqlV7("g.issued_at") + ` AS coupon_id, g.*
    FROM (SELECT $2 || lpad((k % $3)::text, 3, '0') AS campaign_id, $4 || k AS member_id,
                 100 * (1 + (k % $3) % 5) AS amount_yen, t.at AS issued_at,
                 to_char(t.at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM') AS month
            FROM generate_series(0, $1::bigint - 1) k, (SELECT issue_now() AS at) t) g),
c AS (
  INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at)
  SELECT coupon_id, campaign_id, member_id, month, amount_yen, issued_at FROM s),
u AS (
  INSERT INTO member_monthly_usage (member_id, month, used_yen) SELECT member_id, month, amount_yen FROM s),
o AS (
  INSERT INTO notification_outbox (coupon_id, member_id, created_at) SELECT coupon_id, member_id, issued_at FROM s),
b AS (
  UPDATE campaign_budgets b SET issued_yen = b.issued_yen + t.yen
    FROM (SELECT campaign_id, sum(amount_yen) AS yen FROM s GROUP BY 1) t
   WHERE b.campaign_id = t.campaign_id AND b.stripe = 0)
SELECT count(*) FROM s`

// sqlChangeVoid voids the $1 newest live coupons of the history's campaigns (HIST-, one stripe)
// issued more than two days before issue_now(), for reason $2, by session_user, as coupon_void
// does one, set-based: each gives its yen back to its member-month (R3) and to its campaign's
// counter (R1). It answers the coupons voided.
const sqlChangeVoid = `
WITH gone AS MATERIALIZED (
  SELECT coupon_id, campaign_id, member_id, month, amount_yen FROM issued_coupons
   WHERE voided_at IS NULL AND redeemed_at IS NULL AND campaign_id LIKE 'HIST-%'
     AND issued_at < issue_now() - interval '2 days'
   ORDER BY issued_at DESC LIMIT $1 FOR UPDATE),
v AS (
  UPDATE issued_coupons c SET voided_at = issue_now(), voided_by = session_user, void_reason = $2
    FROM gone g WHERE c.coupon_id = g.coupon_id),
u AS (
  UPDATE member_monthly_usage u SET used_yen = u.used_yen - g.yen
    FROM (SELECT member_id, month, sum(amount_yen) AS yen FROM gone GROUP BY 1, 2) g
   WHERE u.member_id = g.member_id AND u.month = g.month),
b AS (
  UPDATE campaign_budgets b SET issued_yen = b.issued_yen - d.yen
    FROM (SELECT campaign_id, sum(amount_yen) AS yen FROM gone GROUP BY 1) d
   WHERE b.campaign_id = d.campaign_id AND b.stripe = 0)
SELECT count(*) FROM gone`

// ChangeHistory changes a history ([BuildHistory]) as a day of production would between two
// reconcile runs, keeping every rule and counter true: k coupons issued now to new members of
// new campaigns (created through package campaign, open now, with room for them), and k/10 of
// the history's old live coupons voided with their yen given back, in one transaction.
func ChangeHistory(ctx context.Context, pool *pgxpool.Pool, k int64) (HistoryChange, error) {
	ch := HistoryChange{Campaigns: min(changeCampaigns, max(1, k/100))}
	prefix := fmt.Sprintf("JOBS-%d-", time.Now().UnixMilli())
	room := k/ch.Campaigns + 1
	for c := range ch.Campaigns {
		discount := 100 * int(1+c%5)
		id := fmt.Sprintf("%s%03d", prefix, c)
		if err := campaign.Create(ctx, pool, campaign.Campaign{ID: id, DiscountYen: discount, BudgetYen: discount * int(room)}); err != nil {
			return ch, fmt.Errorf("hotbench: change campaign %s: %w", id, err)
		}
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, sqlChangeIssue, k, prefix, ch.Campaigns, "j"+prefix).Scan(&ch.Issued); err != nil {
			return fmt.Errorf("hotbench: issue the changed coupons: %w", err)
		}
		if err := tx.QueryRow(ctx, sqlChangeVoid, k/10, "bench jobs: changed since the base run").Scan(&ch.Voided); err != nil {
			return fmt.Errorf("hotbench: void the changed coupons: %w", err)
		}
		return nil
	})
	return ch, err
}

// ReconcileTurn is one reconcile run of a [HistoryJobs] turn.
type ReconcileTurn struct {
	Turn    int
	Full    bool
	Seconds float64
	// Coupons is what the run examined: every live coupon (full), or the coupons issued or voided
	// since the base run (incremental).
	Coupons int64
	Load1   float64
}

// ReconcileJobs is what [HistoryJobs] measured of reconcile.
type ReconcileJobs struct {
	Base        reconcile.Pass // the clean full run every incremental turn continues from
	BaseSeconds float64
	Change      HistoryChange
	Turns       []ReconcileTurn
}

// HistoryJobs measures the two daily jobs on a history database ([BuildHistory]) in alternating
// turns: reconcile ([HistoryJobs.Reconcile]) and the outbox prune beside the issuance
// ([HistoryJobs.Prune]).
type HistoryJobs struct {
	URL     string  // the history database
	History History // its shape: the members the issuance draws from
	// Changed is the coupons [ChangeHistory] issues after the base run (it voids a tenth as many).
	Changed  int64
	Turns    int
	Clients  int           // the issuance's clients in the prune turns
	Duration time.Duration // each prune turn's
	Progress io.Writer
}

func (j HistoryJobs) say(format string, args ...any) {
	if j.Progress != nil {
		fmt.Fprintf(j.Progress, format+"\n", args...)
	}
}

// Reconcile runs package reconcile as `couponctl reconcile` does (reconcile.Run, the verb's
// default horizon wait): one clean full run recorded as the base, then [ChangeHistory] of
// j.Changed coupons, then j.Turns turns of a full run and an incremental one, each incremental
// continuing from the base: the runs a turn records are deleted after it. Every run must be
// clean, and every incremental one must continue from the base: an error otherwise.
func (j HistoryJobs) Reconcile(ctx context.Context) (ReconcileJobs, error) {
	var r ReconcileJobs
	pool, err := pgxpool.New(ctx, j.URL)
	if err != nil {
		return r, err
	}
	defer pool.Close()
	j.say("jobs: reconcile: the base (a full run)...")
	t0 := time.Now()
	if r.Base, err = cleanRun(ctx, pool, true); err != nil {
		return r, err
	}
	r.BaseSeconds = time.Since(t0).Seconds()
	j.say("jobs: reconcile: base run %d clean in %.1f s; changing %d coupons...", r.Base.RunID, r.BaseSeconds, j.Changed)
	if r.Change, err = ChangeHistory(ctx, pool, j.Changed); err != nil {
		return r, err
	}
	for turn := 1; turn <= j.Turns; turn++ {
		for _, full := range []bool{true, false} {
			t0 := time.Now()
			p, err := cleanRun(ctx, pool, full)
			if err != nil {
				return r, fmt.Errorf("hotbench: reconcile turn %d: %w", turn, err)
			}
			t := ReconcileTurn{Turn: turn, Full: full, Seconds: time.Since(t0).Seconds(), Coupons: p.Coupons, Load1: load1()}
			if !full {
				t.Coupons = p.ChangedCoupons
				if p.Since == nil || !p.Since.Equal(r.Base.Watermark) {
					return r, fmt.Errorf("hotbench: reconcile turn %d: the incremental run continued from %v, not the base's watermark %s",
						turn, p.Since, r.Base.Watermark)
				}
			}
			if _, err := pool.Exec(ctx, `DELETE FROM reconcile_runs WHERE run_id > $1`, r.Base.RunID); err != nil {
				return r, err
			}
			r.Turns = append(r.Turns, t)
			j.say("jobs: reconcile turn %d/%d, %s: %.2f s, %d coupons, load %.2f", turn, j.Turns, passName(full), t.Seconds, t.Coupons, t.Load1)
		}
	}
	return r, nil
}

// cleanRun is one reconcile.Run, full or not, that must find nothing wrong.
func cleanRun(ctx context.Context, pool *pgxpool.Pool, full bool) (reconcile.Pass, error) {
	p, err := reconcile.Run(ctx, pool, reconcile.Options{Full: full})
	if err != nil {
		return p, err
	}
	if v := p.Violations(); len(v) > 0 {
		return p, fmt.Errorf("hotbench: the %s reconcile run found faults: %v", passName(full), v)
	}
	if p.Full != full || p.RunID == 0 {
		return p, fmt.Errorf("hotbench: asked a %s reconcile run, got full %t, run %d", passName(full), p.Full, p.RunID)
	}
	return p, nil
}

func passName(full bool) string {
	if full {
		return "full"
	}
	return "incremental"
}
