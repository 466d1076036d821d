package console

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// The console's reads are plain SELECTs at READ COMMITTED: they take no row lock, so no read
// waits for an issuance holding a budget stripe and no issuance waits for a read. The figures a
// rule enforces (budget, issued yen) are the R1 counters of campaign_budgets, as campaign show
// reads them; the aggregates over issued_coupons (a campaign's burn-down and funnel, the list's
// last 5 minutes' rate and usage) scan the coupons (no index orders a campaign's by time) and are
// cached per instance, so that however many people refresh a page, each instance scans at most
// once per [aggregateTTL], and a scan that took d is reused for [scanShare] times d at least: the
// scans of one aggregate take at most 1/scanShare of a core, whatever the campaign's size.

// aggregateTTL is the shortest time an instance reuses an aggregate over issued_coupons.
const aggregateTTL = 5 * time.Second

// scanShare bounds the share of a core one aggregate's scans take: one in 20 (5 %).
const scanShare = 20

// rateWindow is the window of [Row.RecentCount]: the rate over the last 5 minutes (issue 32).
const rateWindow = 5 * time.Minute

// The stages of a campaign's funnel (配布 → 送信 → 利用), as SQL conditions on a live coupon c
// (issued_coupons, voided_at IS NULL) with its outbox row o (notification_outbox, LEFT JOINed)
// and its pruned row's outcome p (outbox_pruned, sqlPrunedJoin): sqlPushed is its LINE push sent,
// its row sent or pruned with the outcome sent (in outbox_pruned since 00039, in the coupon's
// outbox_outcome before; a row pruned with the outcome not known is not counted: the coupon
// page's 記録整理済み); sqlRedeemed is redeemed now (redeemed_at, which a rollback clears).
const (
	sqlPrunedJoin = `
  LEFT JOIN outbox_pruned p ON p.issued_at = c.issued_at AND p.coupon_id = c.coupon_id`
	sqlPushed   = `(o.sent_at IS NOT NULL OR coalesce(p.outcome, c.outbox_outcome) = 'sent')`
	sqlRedeemed = `c.redeemed_at IS NOT NULL`
	// sqlPending is a request waiting for an approver, as the database judges it (the view's
	// state: undecided and not lapsed, 24 h after it was made).
	sqlPending = `q.state = 'pending'`
)

// Usage is what a campaign's coupons came to: Live, the coupons issued and not voided (配布数),
// and Redeemed, those of them redeemed now (利用数).
type Usage struct {
	Live, Redeemed int
}

// Funnel is a campaign's live coupons by how far they went: issued (Live), pushed (Pushed,
// [sqlPushed]) and redeemed (Redeemed). A coupon redeemed before its push is skipped by the relay:
// it counts in Redeemed and not in Pushed.
type Funnel struct {
	Usage
	Pushed int
}

// Row is one campaign of the list.
type Row struct {
	campaign.Status
	// RecentCount is the coupons issued in the last [rateWindow], still live.
	RecentCount int
	Usage
}

// Count is the coupons the R1 counter stands for: issued yen over the face value, every coupon
// of a campaign being worth its discount.
func (r Row) Count() int {
	if r.DiscountYen == 0 {
		return 0
	}
	return r.IssuedYen / r.DiscountYen
}

// PerMinute is [Row.RecentCount] as a rate per minute.
func (r Row) PerMinute() float64 { return float64(r.RecentCount) / rateWindow.Minutes() }

// Point is one point of a burn-down: at T, IssuedYen of live coupons issued so far against
// BudgetYen, the budget then. It is the JSON of /campaigns/{id}/burndown.json.
type Point struct {
	T         time.Time `json:"t"`
	IssuedYen int64     `json:"issued_yen"`
	BudgetYen int64     `json:"budget_yen"`
}

// Request is one row of campaign_change_requests: a change waiting for a second person, or
// decided.
type Request struct {
	ID                         int64
	CampaignID, Kind           string
	Args                       map[string]any
	RequestedBy, RequestReason string
	RequestedAt                time.Time
	State                      string
	DecidedBy, DecisionReason  string
	DecidedAt                  *time.Time
}

// HistoryRow is one row of campaign_changes (the person who made it through the console in
// Person) with the request it applied, if any: its requester and reason.
type HistoryRow struct {
	campaign.Change
	RequestedBy, RequestReason string
}

// reads runs the console's SELECTs, caching the aggregates.
type reads struct {
	pool *pgxpool.Pool
	// redeemed is the SQL condition on a coupon c that counts it in 利用数: [sqlRedeemed]. The
	// tests run their checks with broken conditions in its place.
	redeemed string
	// pending is the SQL condition on a request q (campaign_change_requests) that puts it in the
	// approvals inbox: [sqlPending]. The tests run their checks with a broken one in its place.
	pending string
	mu      sync.Mutex
	cache   map[string]cached
}

type cached struct {
	until time.Time
	val   any
}

// memo returns what load returns for key, reused for [aggregateTTL], or [scanShare] times the
// load's time when that is longer.
func (r *reads) memo(ctx context.Context, key string, load func(context.Context) (any, error)) (any, error) {
	r.mu.Lock()
	c, ok := r.cache[key]
	r.mu.Unlock()
	if ok && time.Now().Before(c.until) {
		return c.val, nil
	}
	start := time.Now()
	v, err := load(ctx)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.cache == nil {
		r.cache = map[string]cached{}
	}
	r.cache[key] = cached{until: time.Now().Add(max(aggregateTTL, scanShare*time.Since(start))), val: v}
	r.mu.Unlock()
	return v, nil
}

// listCounts is what the list counts of a campaign's live coupons in its one scan of them all.
type listCounts struct {
	recent int
	usage  Usage
}

// list is every campaign with its figures, its rate and its usage: the rate and the usage are
// counted in one scan of every live coupon (cached).
func (r *reads) list(ctx context.Context) ([]Row, error) {
	statuses, err := campaign.List(ctx, r.pool)
	if err != nil {
		return nil, err
	}
	counts, err := r.memo(ctx, "list", func(ctx context.Context) (any, error) {
		rows, err := r.pool.Query(ctx, `
SELECT c.campaign_id, count(*) FILTER (WHERE c.issued_at >= now() - make_interval(secs => $1)), count(*),
       count(*) FILTER (WHERE `+r.redeemed+`)
  FROM issued_coupons c WHERE c.voided_at IS NULL GROUP BY c.campaign_id`, rateWindow.Seconds())
		if err != nil {
			return nil, err
		}
		m := map[string]listCounts{}
		var id string
		var n listCounts
		_, err = pgx.ForEachRow(rows, []any{&id, &n.recent, &n.usage.Live, &n.usage.Redeemed}, func() error { m[id] = n; return nil })
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("console: the rate of the last %s and the usage: %w", rateWindow, err)
	}
	out := make([]Row, len(statuses))
	for i, s := range statuses {
		n := counts.(map[string]listCounts)[s.ID]
		out[i] = Row{Status: s, RecentCount: n.recent, Usage: n.usage}
	}
	return out, nil
}

// maxPoints bounds a burn-down's points: minutes are merged into wider buckets past it.
const maxPoints = 120

// campaignScan is what one scan of a campaign's live coupons finds: the yen issued per minute,
// oldest first, and the funnel.
type campaignScan struct {
	minutes []Point
	funnel  Funnel
}

// scan is campaign id's live coupons, each with its outbox row, in one scan (cached): their yen
// summed per minute, and the funnel counted per minute and summed. The burn-down and the funnel
// share it.
func (r *reads) scan(ctx context.Context, id string) (campaignScan, error) {
	v, err := r.memo(ctx, "campaign "+id, func(ctx context.Context) (any, error) {
		rows, err := r.pool.Query(ctx, `
SELECT date_trunc('minute', c.issued_at) AS m, sum(c.amount_yen), count(*),
       count(*) FILTER (WHERE `+sqlPushed+`), count(*) FILTER (WHERE `+r.redeemed+`)
  FROM issued_coupons c LEFT JOIN notification_outbox o USING (coupon_id)`+sqlPrunedJoin+`
 WHERE c.campaign_id = $1 AND c.voided_at IS NULL GROUP BY m ORDER BY m`, id)
		if err != nil {
			return nil, err
		}
		var sc campaignScan
		var p Point
		var f Funnel
		_, err = pgx.ForEachRow(rows, []any{&p.T, &p.IssuedYen, &f.Live, &f.Pushed, &f.Redeemed}, func() error {
			sc.minutes = append(sc.minutes, p)
			sc.funnel.Live += f.Live
			sc.funnel.Pushed += f.Pushed
			sc.funnel.Redeemed += f.Redeemed
			return nil
		})
		return sc, err
	})
	if err != nil {
		return campaignScan{}, fmt.Errorf("console: the coupons of %s: %w", id, err)
	}
	return v.(campaignScan), nil
}

// funnel is campaign id's funnel, from the scan the burn-down shares.
func (r *reads) funnel(ctx context.Context, id string) (Funnel, error) {
	sc, err := r.scan(ctx, id)
	return sc.funnel, err
}

// burndown is campaign s's issued yen over time, from its first coupon to now: live coupons
// summed per minute in the campaign's scan ([reads.scan]), merged into at most [maxPoints]
// buckets, each point cumulative, with the budget in force then (from the campaign's budget
// changes). The first point is the first coupon's minute at 0 yen, the last is now, at the R1
// counter.
func (r *reads) burndown(ctx context.Context, s campaign.Status, now time.Time) ([]Point, error) {
	sc, err := r.scan(ctx, s.ID)
	if err != nil {
		return nil, err
	}
	budgets, err := r.budgetChanges(ctx, s.ID)
	if err != nil {
		return nil, err
	}
	minutes := sc.minutes
	step := 1
	if len(minutes) > maxPoints-1 {
		step = (len(minutes) + maxPoints - 2) / (maxPoints - 1)
	}
	var out []Point
	if len(minutes) > 0 { // the line starts at nothing issued, the first coupon's minute
		out = append(out, Point{T: minutes[0].T, BudgetYen: budgetAt(budgets, int64(s.BudgetYen), minutes[0].T)})
	}
	var sum int64
	for i, m := range minutes {
		sum += m.IssuedYen
		if (i+1)%step == 0 || i == len(minutes)-1 {
			t := m.T.Add(time.Minute)
			if t.After(now) {
				t = now
			}
			out = append(out, Point{T: t, IssuedYen: sum, BudgetYen: budgetAt(budgets, int64(s.BudgetYen), t)})
		}
	}
	return append(out, Point{T: now, IssuedYen: int64(s.IssuedYen), BudgetYen: int64(s.BudgetYen)}), nil
}

// budgetChange is a budget change of the history: at At the budget went from Before to After.
type budgetChange struct {
	At            time.Time
	Before, After int64
}

func (r *reads) budgetChanges(ctx context.Context, id string) ([]budgetChange, error) {
	rows, err := r.pool.Query(ctx, `
SELECT changed_at, (before->>'budget_yen')::bigint, (after->>'budget_yen')::bigint
  FROM campaign_changes WHERE campaign_id = $1 AND what = 'budget' ORDER BY change_id`, id)
	if err != nil {
		return nil, fmt.Errorf("console: budget history of %s: %w", id, err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[budgetChange])
}

// budgetAt is the budget in force at t: the last change's at or before t, else the first
// later change's before, else the budget now.
func budgetAt(changes []budgetChange, now int64, t time.Time) int64 {
	for i := len(changes) - 1; i >= 0; i-- {
		if !changes[i].At.After(t) {
			return changes[i].After
		}
	}
	if len(changes) > 0 {
		return changes[0].Before
	}
	return now
}

const requestColumns = `request_id, campaign_id, kind, args, requested_by, request_reason, requested_at, state,
coalesce(decided_by, ''), coalesce(decision_reason, ''), decided_at`

// requests is campaign id's change requests, newest first, in the state the database judges
// (campaign_change_requests: a pending request lapses 24 h after it was made).
func (r *reads) requests(ctx context.Context, id string) ([]Request, error) {
	rows, err := r.pool.Query(ctx, `SELECT `+requestColumns+` FROM campaign_change_requests
 WHERE campaign_id = $1 ORDER BY request_id DESC`, id)
	if err != nil {
		return nil, fmt.Errorf("console: requests of %s: %w", id, err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Request])
}

// history is campaign id's changes, newest first, with the console user who made each.
func (r *reads) history(ctx context.Context, id string) ([]HistoryRow, error) {
	rows, err := r.pool.Query(ctx, `
SELECT c.change_id, c.campaign_id, c.changed_at, c.changed_by, c.what, c.before, c.after, c.reason,
       coalesce(c.operator_email, ''), coalesce(c.request_id, 0), coalesce(q.requested_by, ''), coalesce(q.request_reason, '')
  FROM campaign_changes c LEFT JOIN campaign_change_requests q USING (request_id)
 WHERE c.campaign_id = $1 ORDER BY c.change_id DESC`, id)
	if err != nil {
		return nil, fmt.Errorf("console: history of %s: %w", id, err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (h HistoryRow, err error) {
		c := &h.Change
		err = row.Scan(&c.ID, &c.CampaignID, &c.At, &c.By, &c.What, &c.Before, &c.After, &c.Reason, &c.Person,
			&c.RequestID, &h.RequestedBy, &h.RequestReason)
		return h, err
	})
}

// roleOf is email's console role as the database keeps it: viewer, operator or approver.
func (r *reads) roleOf(ctx context.Context, email string) (string, error) {
	var role string
	if err := r.pool.QueryRow(ctx, `SELECT console_role_of($1)`, email).Scan(&role); err != nil {
		return "", fmt.Errorf("console: the role of %s: %w", email, err)
	}
	return role, nil
}

// voidedByEmail is, for each of ids voided through the console, the person who voided it.
func (r *reads) voidedByEmail(ctx context.Context, ids []string) (map[string]string, error) {
	rows, err := r.pool.Query(ctx, `
SELECT coupon_id::text, voided_by_email FROM issued_coupons WHERE coupon_id = ANY ($1::uuid[]) AND voided_by_email IS NOT NULL`, ids)
	if err != nil {
		return nil, fmt.Errorf("console: who voided: %w", err)
	}
	m := map[string]string{}
	var id, email string
	_, err = pgx.ForEachRow(rows, []any{&id, &email}, func() error { m[id] = email; return nil })
	return m, err
}

// approvalLine is the four-eyes line, in yen: the rule setting approval_above_yen (couponctl
// rules set --approval-above-yen), above which console_budget makes a raise a request.
func (r *reads) approvalLine(ctx context.Context) (int64, error) {
	var yen int64
	err := r.pool.QueryRow(ctx, `SELECT approval_above_yen FROM coupon_rules`).Scan(&yen)
	return yen, err
}

// Pending is a request waiting for an approver, as the inbox shows it: the campaign's budget
// and period now beside what the request asks, and when it lapses.
type Pending struct {
	Request
	LapsesAt         time.Time
	BudgetYen        int64      // the campaign's budget now
	StartsAt, EndsAt *time.Time // the campaign's period now
}

// AfterYen is the budget the request would leave: its budget_yen, or its add_yen added to the
// budget now (console_decide adds it to the budget in force at approval).
func (p Pending) AfterYen() int64 {
	if v, ok := p.Args["budget_yen"].(float64); ok {
		return int64(v)
	}
	add, _ := p.Args["add_yen"].(float64)
	return p.BudgetYen + int64(add)
}

// pendingRequests is every request waiting for an approver, across campaigns, the first to lapse first.
func (r *reads) pendingRequests(ctx context.Context) ([]Pending, error) {
	rows, err := r.pool.Query(ctx, `
SELECT `+requestColumns+`, q.lapses_at, b.budget_yen, b.starts_at, b.ends_at
  FROM campaign_change_requests q
  JOIN (SELECT campaign_id, sum(budget_yen)::bigint AS budget_yen, min(starts_at) AS starts_at, min(ends_at) AS ends_at
          FROM campaign_budgets GROUP BY campaign_id) b USING (campaign_id)
 WHERE `+r.pending+` ORDER BY q.lapses_at, q.request_id`)
	if err != nil {
		return nil, fmt.Errorf("console: the pending requests: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (p Pending, err error) {
		q := &p.Request
		err = row.Scan(&q.ID, &q.CampaignID, &q.Kind, &q.Args, &q.RequestedBy, &q.RequestReason, &q.RequestedAt, &q.State,
			&q.DecidedBy, &q.DecisionReason, &q.DecidedAt, &p.LapsesAt, &p.BudgetYen, &p.StartsAt, &p.EndsAt)
		return p, err
	})
}

// pendingCount is how many requests wait for an approver: the header's 承認待ち n 件.
func (r *reads) pendingCount(ctx context.Context) (int, error) {
	var n int
	err := r.pool.QueryRow(ctx, `SELECT count(*) FROM campaign_change_requests q WHERE `+r.pending).Scan(&n)
	return n, err
}

// pace is campaign s's coupons a minute over the last [rateWindow] (to the minute), from its
// scan's minutes (cached with the burn-down): the page's forecast.
func (r *reads) pace(ctx context.Context, s campaign.Status) (float64, error) {
	sc, err := r.scan(ctx, s.ID)
	if err != nil || s.DiscountYen <= 0 {
		return 0, err
	}
	from := s.At.Add(-rateWindow).Truncate(time.Minute)
	var yen int64
	for _, m := range sc.minutes {
		if !m.T.Before(from) {
			yen += m.IssuedYen
		}
	}
	return float64(yen) / float64(s.DiscountYen) / rateWindow.Minutes(), nil
}
