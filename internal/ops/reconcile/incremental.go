package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/shared/db"
)

// Pass is what one [Run] checked and found.
type Pass struct {
	Report
	// Full is true when the pass checked every row: on demand, or when no clean run came before.
	Full bool `json:"full"`
	// Since is the watermark of the clean run an incremental pass continued from; nil for a full one.
	Since *time.Time `json:"since,omitempty"`
	// Watermark is this pass's: every row it did not see was stamped at or after it.
	Watermark time.Time `json:"watermark"`
	// ChangedCoupons and ChangedMonths are what an incremental pass examined: the coupons issued
	// or voided at or after Since, and their member-months.
	ChangedCoupons int64 `json:"changed_coupons"`
	ChangedMonths  int64 `json:"changed_months"`
	// RunID is the clean run this pass recorded (reconcile_runs), 0 when it found a fault.
	RunID int64 `json:"run_id,omitempty"`
}

// Options says how [Run] checks.
type Options struct {
	// Full checks every row even after a clean run.
	Full bool
	// HorizonWait is how long the pass waits for the transactions that held a transaction id
	// when it began (default 1 minute); past it, it fails naming their backends.
	HorizonWait time.Duration
	// Progress, when set, is told each step.
	Progress func(format string, args ...any)
}

// StampMargin is how long before a transaction's first write its stamps may be taken: the
// functions stamp issue_now() as their call starts (issued_at, voided_at, the outbox's created_at,
// a redemption's at), then write, within one call bounded by its session's timeouts (the
// issuance's 3 s budget). The watermark is the pass's start less this margin.
const StampMargin = 5 * time.Minute

// stampMargin is [StampMargin]; a test sets it to 0 to show the horizon's wait alone.
var stampMargin = StampMargin

// defaultHorizonWait is Options.HorizonWait's default.
const defaultHorizonWait = time.Minute

// Beginner is a pool or a connection: what [Run] reads and records through.
type Beginner interface {
	db.Querier
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// lastRun is the newest clean run's watermark and campaign baselines.
type lastRun struct {
	watermark time.Time
	baseline  map[string][2]int64 // campaign id: yen and coupons of its baseline
}

// Run checks the tables as [Check] does and, when nothing is wrong, records the clean run
// (reconcile_runs, through reconcile_run_record). After a clean run it checks only what changed
// since that run's watermark (incremental): every campaign's counter against its baseline at the
// watermark plus the coupons issued or voided since; R2, R3, the counters and the redemptions of
// the (campaign, member) pairs, member-months and coupons those touched; the outbox rows of the
// coupons issued since and the outbox rows created since. Full, or no clean run yet, checks every
// row. A row changed behind the functions' backs without a new stamp (an old counter or outbox row
// edited by hand) is found by a full pass only (docs/operations.md, "Reconcile").
//
// Before its snapshot the pass waits, at most HorizonWait, for every transaction that held a
// transaction id as it began (watermarkAt): whatever its snapshot does not see was then written
// by a transaction that began writing after, stamped at or after the watermark. Errors: the
// database's, and a wait past HorizonWait.
func Run(ctx context.Context, conn Beginner, opts Options) (Pass, error) {
	say := opts.Progress
	if say == nil {
		say = func(string, ...any) {}
	}
	if opts.HorizonWait <= 0 {
		opts.HorizonWait = defaultHorizonWait
	}
	last, err := readLastRun(ctx, conn)
	if err != nil {
		return Pass{}, err
	}
	started := time.Now()
	watermark, err := watermarkAt(ctx, conn, opts.HorizonWait, say)
	if err != nil {
		return Pass{}, err
	}
	var p Pass
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		var baseline map[string][2]int64
		var err error
		if opts.Full || last == nil {
			say("reconcile: full pass (every row)")
			p, baseline, err = fullPass(ctx, tx, watermark)
		} else {
			watermark = maxTime(watermark, last.watermark)
			say("reconcile: incremental pass: what changed since %s", last.watermark.Format(time.RFC3339))
			p, baseline, err = incrementalPass(ctx, tx, *last, watermark)
		}
		if err != nil || len(p.Violations()) > 0 {
			return err
		}
		return record(ctx, tx, &p, baseline, started)
	})
	if err != nil {
		return Pass{}, err
	}
	return p, nil
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// sqlLastRun is the newest clean run.
const sqlLastRun = `SELECT watermark, campaigns FROM reconcile_runs ORDER BY run_id DESC LIMIT 1`

func readLastRun(ctx context.Context, q db.Querier) (*lastRun, error) {
	var l lastRun
	var raw []byte
	err := q.QueryRow(ctx, sqlLastRun).Scan(&l.watermark, &raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err == nil {
		err = json.Unmarshal(raw, &l.baseline)
	}
	if err != nil {
		return nil, fmt.Errorf("reconcile: the last clean run: %w", err)
	}
	return &l, nil
}

// watermarkAt waits for the transaction horizon and answers the watermark (waitHorizon): a
// variable, so that a test can swap in the broken variant that trusts the clock alone.
var watermarkAt = waitHorizon

// sqlHorizon reads the transactions that hold a transaction id now, and the clock the stamps are
// read from (issue_now()).
const sqlHorizon = `SELECT pg_current_snapshot()::text, issue_now()`

// sqlHorizonPassed answers whether none of the transactions in progress in snapshot $1 still is.
const sqlHorizonPassed = `SELECT NOT EXISTS (SELECT FROM pg_snapshot_xip($1::pg_snapshot) x WHERE pg_xact_status(x) = 'in progress')`

// sqlHorizonHolders names the backends of those still in progress.
const sqlHorizonHolders = `
SELECT coalesce(string_agg(DISTINCT l.pid::text, ', '), '')
  FROM pg_snapshot_xip($1::pg_snapshot) x
  JOIN pg_locks l ON l.locktype = 'transactionid' AND l.granted AND l.mode = 'ExclusiveLock'
                 AND l.transactionid::text = (x::text::numeric % 4294967296)::text
 WHERE pg_xact_status(x) = 'in progress'`

// horizonPoll is how often waitHorizon looks again.
const horizonPoll = 20 * time.Millisecond

// waitHorizon reads the clock and the transactions in progress, waits until each has ended
// (committed or rolled back), and answers the clock less [StampMargin]. A transaction that
// writes after the read took its transaction id after it, so its stamps are at or after the
// answer; one that held an id before the read has ended before the pass's snapshot, which sees it.
func waitHorizon(ctx context.Context, q db.Querier, maxWait time.Duration, say func(string, ...any)) (time.Time, error) {
	var snap string
	var at time.Time
	if err := q.QueryRow(ctx, sqlHorizon).Scan(&snap, &at); err != nil {
		return time.Time{}, fmt.Errorf("reconcile: the transaction horizon: %w", err)
	}
	deadline := time.Now().Add(maxWait)
	for said := false; ; said = true {
		var passed bool
		if err := q.QueryRow(ctx, sqlHorizonPassed, snap).Scan(&passed); err != nil {
			return time.Time{}, fmt.Errorf("reconcile: the transaction horizon: %w", err)
		}
		if passed {
			return at.Add(-stampMargin), nil
		}
		if !said {
			say("reconcile: waiting for the transactions in progress at %s to end", at.Format(time.RFC3339Nano))
		}
		if time.Now().After(deadline) {
			var pids string
			_ = q.QueryRow(ctx, sqlHorizonHolders, snap).Scan(&pids)
			return time.Time{}, fmt.Errorf("reconcile: transactions begun before %s still run after %s (backends %s): "+
				"end them or run again", at.Format(time.RFC3339), maxWait, pids)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(horizonPoll):
		}
	}
}

// sqlBaseline is each campaign's baseline at @watermark, from every coupon: the coupons issued
// before it that are live, or were voided at or after it.
const sqlBaseline = `
SELECT campaign_id, SUM(amount_yen)::bigint, count(*)
  FROM issued_coupons
 WHERE issued_at < @watermark AND (voided_at IS NULL OR voided_at >= @watermark)
 GROUP BY campaign_id`

// fullPass is [Check] and the baselines at watermark, in tx's snapshot.
func fullPass(ctx context.Context, tx pgx.Tx, watermark time.Time) (Pass, map[string][2]int64, error) {
	p := Pass{Full: true, Watermark: watermark}
	var err error
	if p.Report, err = Check(ctx, tx); err != nil {
		return p, nil, err
	}
	rows, err := tx.Query(ctx, sqlBaseline, pgx.NamedArgs{"watermark": watermark})
	if err != nil {
		return p, nil, fmt.Errorf("reconcile: baselines: %w", err)
	}
	baseline := map[string][2]int64{}
	var id string
	var yen, n int64
	_, err = pgx.ForEachRow(rows, []any{&id, &yen, &n}, func() error {
		baseline[id] = [2]int64{yen, n}
		return nil
	})
	if err != nil {
		return p, nil, fmt.Errorf("reconcile: baselines: %w", err)
	}
	return p, baseline, nil
}

// scopeIncremental names, for every check, the rows that changed since @since: changed, the
// coupons issued (issued_coupons_issued_brin) or voided (issued_coupons_voided) since; live, the
// live coupons of their member-months; pair_coupons, the coupons of the (campaign, member) pairs
// issued since; usage, the counters of those member-months; outbox_coupons and redeemed, the
// coupons issued since; outbox, the outbox rows created since (notification_outbox_created_brin);
// redemptions, the whole history of each coupon with a history row since
// (coupon_redemptions_at_brin).
const scopeIncremental = `
WITH changed AS MATERIALIZED (
  SELECT coupon_id, campaign_id, member_id, month, issued_at FROM issued_coupons WHERE issued_at >= @since
  UNION
  SELECT coupon_id, campaign_id, member_id, month, issued_at FROM issued_coupons WHERE voided_at >= @since),
scope_months AS MATERIALIZED (SELECT DISTINCT member_id, month FROM changed),
live AS (SELECT i.* FROM scope_months m JOIN issued_coupons i USING (member_id, month) WHERE i.voided_at IS NULL),
pair_coupons AS (SELECT i.* FROM (SELECT DISTINCT campaign_id, member_id FROM changed WHERE issued_at >= @since) p
                   JOIN issued_coupons i USING (campaign_id, member_id)),
usage AS (SELECT u.* FROM scope_months m JOIN member_monthly_usage u USING (member_id, month)),
outbox_coupons AS (SELECT * FROM issued_coupons WHERE issued_at >= @since),
outbox AS (SELECT * FROM notification_outbox WHERE created_at >= @since),
redemptions AS (SELECT r.* FROM (SELECT DISTINCT coupon_id FROM coupon_redemptions WHERE at >= @since) c
                  JOIN coupon_redemptions r USING (coupon_id)),
redeemed AS (SELECT * FROM issued_coupons WHERE issued_at >= @since)`

// sqlChanged counts what an incremental pass examines.
const sqlChanged = scopeIncremental + `
SELECT (SELECT count(*) FROM changed), (SELECT count(*) FROM scope_months)`

// sqlCampaignsSince reads each campaign as [sqlCampaigns] does, its live coupons' yen and count
// taken from its baseline at @since (@baseline) instead of every coupon: less the coupons issued
// before @since and voided since (gone), plus the live coupons issued since (fresh). The last two
// columns are its baseline at @watermark: the baseline less gone's voided before @watermark,
// plus fresh's issued before @watermark and live or voided at or after it.
const sqlCampaignsSince = `
WITH base AS (SELECT key AS campaign_id, (value->>0)::bigint AS yen, (value->>1)::bigint AS n
                FROM jsonb_each(@baseline::jsonb)),
fresh AS (SELECT campaign_id,
                 SUM(amount_yen) FILTER (WHERE voided_at IS NULL) AS live_yen,
                 count(*) FILTER (WHERE voided_at IS NULL) AS live_n,
                 SUM(amount_yen) FILTER (WHERE issued_at < @watermark AND (voided_at IS NULL OR voided_at >= @watermark)) AS base_yen,
                 count(*) FILTER (WHERE issued_at < @watermark AND (voided_at IS NULL OR voided_at >= @watermark)) AS base_n
            FROM issued_coupons WHERE issued_at >= @since GROUP BY campaign_id),
gone AS (SELECT campaign_id, SUM(amount_yen) AS yen, count(*) AS n,
                SUM(amount_yen) FILTER (WHERE voided_at < @watermark) AS before_yen,
                count(*) FILTER (WHERE voided_at < @watermark) AS before_n
           FROM issued_coupons WHERE voided_at >= @since AND issued_at < @since GROUP BY campaign_id),
b AS (SELECT campaign_id, SUM(budget_yen)::bigint AS budget_yen, SUM(issued_yen)::bigint AS issued_yen
        FROM campaign_budgets GROUP BY campaign_id)
SELECT b.campaign_id, b.budget_yen, b.issued_yen,
       (COALESCE(base.yen, 0) - COALESCE(gone.yen, 0) + COALESCE(fresh.live_yen, 0))::bigint,
       (COALESCE(base.n, 0) - COALESCE(gone.n, 0) + COALESCE(fresh.live_n, 0))::bigint,
       COALESCE(GREATEST(o.issued_yen - o.budget_yen, 0), 0)::bigint,
       (COALESCE(base.yen, 0) - COALESCE(gone.before_yen, 0) + COALESCE(fresh.base_yen, 0))::bigint,
       (COALESCE(base.n, 0) - COALESCE(gone.before_n, 0) + COALESCE(fresh.base_n, 0))::bigint
  FROM b LEFT JOIN base USING (campaign_id) LEFT JOIN fresh USING (campaign_id) LEFT JOIN gone USING (campaign_id)
  LEFT JOIN legacy_overshoot o ON o.campaign_id = b.campaign_id
 ORDER BY b.campaign_id`

// incrementalPass checks what changed since last's watermark, in tx's snapshot, and answers the
// baselines at watermark.
func incrementalPass(ctx context.Context, tx pgx.Tx, last lastRun, watermark time.Time) (Pass, map[string][2]int64, error) {
	since := last.watermark
	p := Pass{Since: &since, Watermark: watermark}
	args := pgx.NamedArgs{"since": since}
	var err error
	if p.Report, err = checkScope(ctx, tx, scopeIncremental, args); err != nil {
		return p, nil, err
	}
	if err := tx.QueryRow(ctx, sqlChanged, args).Scan(&p.ChangedCoupons, &p.ChangedMonths); err != nil {
		return p, nil, fmt.Errorf("reconcile: what changed: %w", err)
	}
	raw, err := json.Marshal(last.baseline)
	if err != nil {
		return p, nil, err
	}
	rows, err := tx.Query(ctx, sqlCampaignsSince, pgx.NamedArgs{"since": since, "watermark": watermark, "baseline": string(raw)})
	if err != nil {
		return p, nil, fmt.Errorf("reconcile: campaigns: %w", err)
	}
	baseline := map[string][2]int64{}
	var c Campaign
	var yen, n int64
	p.Coupons = 0
	_, err = pgx.ForEachRow(rows, []any{&c.CampaignID, &c.BudgetYen, &c.CounterYen, &c.ActualYen, &c.Coupons, &c.LegacyOvershootYen, &yen, &n},
		func() error {
			p.Campaigns = append(p.Campaigns, c)
			p.Coupons += c.Coupons
			baseline[c.CampaignID] = [2]int64{yen, n}
			return nil
		})
	if err != nil {
		return p, nil, fmt.Errorf("reconcile: campaigns: %w", err)
	}
	return p, baseline, nil
}

// sqlRecord records a clean run (reconcile_run_record, migration 00040).
const sqlRecord = `SELECT reconcile_run_record(@full, @since, @watermark, @campaigns::jsonb, @coupons, @months, @started)`

// record writes p, clean, as the newest clean run, with its baselines.
func record(ctx context.Context, tx pgx.Tx, p *Pass, baseline map[string][2]int64, started time.Time) error {
	raw, err := json.Marshal(baseline)
	if err != nil {
		return err
	}
	coupons := p.ChangedCoupons
	if p.Full {
		coupons = p.Coupons
	}
	err = tx.QueryRow(ctx, sqlRecord, pgx.NamedArgs{"full": p.Full, "since": p.Since, "watermark": p.Watermark,
		"campaigns": string(raw), "coupons": coupons, "months": p.ChangedMonths, "started": started}).Scan(&p.RunID)
	if err != nil {
		return fmt.Errorf("reconcile: record the clean run: %w", err)
	}
	return nil
}

// WritePass prints what the pass covered, then the report ([Report.Write]), then the clean run
// it recorded.
func (p Pass) WritePass(w io.Writer) {
	if p.Full {
		fmt.Fprintln(w, "full pass: every row")
	} else {
		fmt.Fprintf(w, "incremental pass: what changed since %s: %d coupons issued or voided, %d member-months; every campaign counter\n",
			p.Since.Format(time.RFC3339), p.ChangedCoupons, p.ChangedMonths)
	}
	p.Report.Write(w)
	if p.RunID != 0 {
		fmt.Fprintf(w, "recorded clean run %d: the next run checks what changed since %s\n", p.RunID, p.Watermark.Format(time.RFC3339))
	}
}
