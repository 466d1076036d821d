package hotbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/opsverbs"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox"
)

// The kinds of a prune turn.
const (
	PruneAlone  = "alone"  // the hot cell alone
	PruneBeside = "beside" // the hot cell while the prune runs
)

// PruneTurn is one turn of [HistoryJobs.Prune].
type PruneTurn struct {
	Turn  int
	Kind  string // PruneAlone or PruneBeside
	Rate  float64
	P99Ms float64
	// RateRatio and P99Ratio are, for a beside turn, its over the mean of the alone turns around
	// it; for the second alone turn of a round, its over the first (A/A); 0 for the first.
	RateRatio, P99Ratio float64
	Pruned              int64
	PrunedPerSec        float64
	// WALPerRow is the WAL bytes of the prune's own statements (pg_stat_statements wal_bytes,
	// before and after the turn) over the rows they deleted; -1 without pg_stat_statements.
	WALPerRow float64
	// TurnWALPerRow is the server's WAL of the turn (pg_current_wal_lsn), the issuance's
	// included, over the rows pruned.
	TurnWALPerRow float64
	Load1         float64
	Rules         string
}

// PruneJobs is what [HistoryJobs.Prune] measured.
type PruneJobs struct {
	OlderThan time.Duration // the prune's retention: every sent row of the history is older
	Backlog   int64         // the rows it could delete when the turns began
	Turns     []PruneTurn
}

// ErrBacklogGone is returned when the prune deleted every row the history offered before a turn
// ended: a larger history (or fewer or shorter turns) is needed.
var ErrBacklogGone = errors.New("hotbench: the history's backlog of sent outbox rows ran out during a prune turn")

// sqlPruneWAL reads the WAL written by the database's prune statements so far (pg_stat_statements)
// and the server's WAL position, both in bytes.
const sqlPruneWAL = `
SELECT coalesce(sum(wal_bytes), 0)::bigint, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE '%INSERT INTO outbox_pruned%'`

// sqlServerWAL is the server's WAL position without pg_stat_statements.
const sqlServerWAL = `SELECT 0::bigint, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`

// sqlBacklog is the retention that makes every sent row of the history prunable (the time since
// the newest one, less a minute, in whole minutes) and the rows a prune with it may delete.
const sqlBacklog = `
WITH r AS (SELECT greatest(date_trunc('minute', now() - max(sent_at)) - interval '1 minute', interval '1 minute') AS keep
             FROM notification_outbox WHERE sent_at IS NOT NULL)
SELECT extract(epoch FROM r.keep)::bigint,
       (SELECT count(*) FROM notification_outbox
         WHERE (sent_at IS NOT NULL OR skipped_at IS NOT NULL) AND COALESCE(sent_at, skipped_at) < now() - r.keep)
  FROM r`

// pruneRig is what the prune turns share: the issuance's pool and service, the prune's own pool,
// the members drawn, and whether pg_stat_statements is there.
type pruneRig struct {
	bench      HistoryBench
	pool       *pgxpool.Pool
	prunePool  *pgxpool.Pool
	svc        *issuance.Service
	draw       *memberDraw
	statements bool
	olderThan  time.Duration
}

// Prune measures `outbox prune` beside the issuance on the history: turn 0, the hot cell of
// [HistoryBench] alone for at most 5 s (a warm-up, unreported), then j.Turns rounds of three
// turns of j.Duration: alone, beside, alone ([bracketRatios]), where beside is the same hot cell
// while [opsverbs.PrunePaced] runs with the verb's defaults ([outbox.PruneBatch] rows a statement,
// [opsverbs.PrunePause] between them) on a connection of its own, stopping between two
// statements once j.Duration has passed. The backlog is the history's last month of sent outbox
// rows; [ErrBacklogGone] when it runs out within a turn.
func (j HistoryJobs) Prune(ctx context.Context) (PruneJobs, error) {
	var out PruneJobs
	rig, err := j.pruneRig(ctx)
	if err != nil {
		return out, err
	}
	defer rig.pool.Close()
	defer rig.prunePool.Close()
	var keepSeconds int64
	if err := rig.pool.QueryRow(ctx, sqlBacklog).Scan(&keepSeconds, &out.Backlog); err != nil {
		return out, fmt.Errorf("hotbench: the prune's backlog: %w", err)
	}
	out.OlderThan = time.Duration(keepSeconds) * time.Second
	rig.olderThan = out.OlderThan
	j.say("jobs: prune: %d sent outbox rows closed more than %s ago to prune", out.Backlog, out.OlderThan)
	if out.Backlog == 0 {
		return out, fmt.Errorf("%w: the history has no sent outbox rows", ErrBacklogGone)
	}
	if _, err := rig.turn(ctx, 0, PruneAlone, min(j.Duration, 5*time.Second)); err != nil {
		return out, err
	}
	for round := range j.Turns {
		var r [3]PruneTurn
		for i, kind := range []string{PruneAlone, PruneBeside, PruneAlone} {
			if r[i], err = rig.turn(ctx, 1+3*round+i, kind, j.Duration); err != nil {
				return out, err
			}
		}
		bracketRatios(&r)
		for _, t := range r {
			out.Turns = append(out.Turns, t)
			j.say("jobs: prune turn %d (round %d/%d), %s: %.0f issued/s (x%s), p99 %.1f ms (x%s), %d rows pruned, WAL bytes/row %s, load %.2f",
				t.Turn, round+1, j.Turns, t.Kind, t.Rate, orDash(t.RateRatio, 2), t.P99Ms, orDash(t.P99Ratio, 2), t.Pruned, orDash(t.WALPerRow, 0), t.Load1)
		}
	}
	return out, nil
}

// bracketRatios sets the ratios of a round of turns alone, beside, alone: beside's over the mean
// of the two alone turns around it, so that a rate drifting through the round counts for neither;
// the second alone turn's over the first (the A/A pair, the same span's noise and drift).
func bracketRatios(r *[3]PruneTurn) {
	r[1].RateRatio = r[1].Rate / ((r[0].Rate + r[2].Rate) / 2)
	r[1].P99Ratio = r[1].P99Ms / ((r[0].P99Ms + r[2].P99Ms) / 2)
	r[2].RateRatio, r[2].P99Ratio = r[2].Rate/r[0].Rate, r[2].P99Ms/r[0].P99Ms
}

// pruneRig opens the pools of the prune turns: Clients+2 connections for the issuance, as
// [HistoryBench.Run] has, and 2 for the prune.
func (j HistoryJobs) pruneRig(ctx context.Context) (*pruneRig, error) {
	cfg, err := issuance.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(j.URL)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = int32(j.Clients) + 2
	rig := &pruneRig{bench: HistoryBench{Full: j.URL, History: j.History, Clients: j.Clients, Progress: j.Progress},
		draw: &memberDraw{members: j.History.Members(), next: rand.Int64N(j.History.Members())}}
	if rig.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, err
	}
	pc.MaxConns = 2
	if rig.prunePool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		rig.pool.Close()
		return nil, err
	}
	_, err = rig.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	rig.statements = err == nil
	if err == nil {
		err = rig.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_statements LIMIT 1`).Scan(new(int64))
		rig.statements = err == nil
	}
	if !rig.statements {
		j.say("jobs: prune: no pg_stat_statements (%v): WAL per row from the server's WAL only, the issuance's included", err)
	}
	if rig.svc, err = issuance.New(rig.pool, cfg); err != nil {
		rig.pool.Close()
		rig.prunePool.Close()
		return nil, err
	}
	return rig, nil
}

// turn runs one prune turn of kind for d.
func (rig *pruneRig) turn(ctx context.Context, turn int, kind string, d time.Duration) (PruneTurn, error) {
	t := PruneTurn{Turn: turn, Kind: kind, WALPerRow: -1}
	before, err := rig.wal(ctx)
	if err != nil {
		return t, err
	}
	var (
		wg       sync.WaitGroup
		pruneErr error
		took     time.Duration
		ranOut   bool
	)
	if kind == PruneBeside {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			until := start.Add(d)
			t.Pruned, pruneErr = opsverbs.PrunePaced(ctx, rig.prunePool, rig.olderThan, outbox.PruneBatch, opsverbs.PrunePause, until, io.Discard)
			took, ranOut = time.Since(start), time.Now().Before(until)
		}()
	}
	cell, err := rig.bench.cell(ctx, rig.pool, rig.svc, rig.draw, HistoryHot, turn, d)
	wg.Wait()
	if err = errors.Join(err, pruneErr); err != nil {
		return t, fmt.Errorf("hotbench: prune turn %d (%s): %w", turn, kind, err)
	}
	if ranOut {
		return t, fmt.Errorf("%w (turn %d: %d rows deleted in %s)", ErrBacklogGone, turn, t.Pruned, took.Round(time.Millisecond))
	}
	after, err := rig.wal(ctx)
	if err != nil {
		return t, err
	}
	t.Rate, t.P99Ms, t.Load1, t.Rules = cell.Rate, cell.P99Ms, cell.Load1, cell.Rules
	if t.Pruned > 0 {
		t.PrunedPerSec = float64(t.Pruned) / took.Seconds()
		t.TurnWALPerRow = float64(after[1]-before[1]) / float64(t.Pruned)
		if rig.statements {
			t.WALPerRow = float64(after[0]-before[0]) / float64(t.Pruned)
		}
	}
	return t, nil
}

// wal reads the prune statements' WAL bytes so far (0 without pg_stat_statements) and the
// server's WAL position.
func (rig *pruneRig) wal(ctx context.Context) ([2]int64, error) {
	var w [2]int64
	q := sqlServerWAL
	if rig.statements {
		q = sqlPruneWAL
	}
	err := rig.pool.QueryRow(ctx, q).Scan(&w[0], &w[1])
	return w, err
}
