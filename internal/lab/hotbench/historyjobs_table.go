package hotbench

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/mops/coupon-api/internal/ops/opsverbs"
	"github.com/mops/coupon-api/shared/outbox"
)

// The goals of issue 42 the jobs tables are read against.
const (
	ReconcileGoalSeconds = 60   // reconcile at 10x the history, incremental
	PruneGoalWALPerRow   = 2048 // bytes of WAL a pruned row
	PruneGoalRatio       = 0.9  // the issuance's rate beside the prune over alone
)

// ReconcileTable and PruneTable head the tables [WriteReconcileTable] and [WritePruneTable] write.
const (
	ReconcileTable = "reconcile: full against incremental"
	PruneTable     = "outbox prune beside the hot campaign"
)

// WriteReconcileTable writes the reconcile turns on a history of coupons coupons, their medians
// and spreads, the incremental seconds per changed coupon and, from it, the goal lines.
func WriteReconcileTable(w io.Writer, coupons int64, r ReconcileJobs) error {
	fmt.Fprintf(w, "%s (reconcile.Run as `couponctl reconcile` runs it; every run clean)\n", ReconcileTable)
	fmt.Fprintf(w, "base: a full run of %d live coupons, clean, %.2f s; then changed: %d coupons issued now (%d new campaigns, new members), %d old ones voided\n",
		r.Base.Coupons, r.BaseSeconds, r.Change.Issued, r.Change.Campaigns, r.Change.Voided)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "turn\tpass\tseconds\tcoupons examined\tload\t")
	var full, inc, changed []float64
	for _, t := range r.Turns {
		fmt.Fprintf(tw, "%d\t%s\t%.2f\t%d\t%.2f\t\n", t.Turn, passName(t.Full), t.Seconds, t.Coupons, t.Load1)
		if t.Full {
			full = append(full, t.Seconds)
		} else {
			inc, changed = append(inc, t.Seconds), append(changed, float64(t.Coupons))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "full: %s s; incremental: %s s; full / incremental (medians) %.1fx\n", spread(full, 2), spread(inc, 2), median(full)/median(inc))
	perCoupon := median(inc) / max(1, median(changed))
	tenN := 10 * coupons
	k := tenN / 100
	at := perCoupon * float64(k)
	verdict := "reached"
	if at > ReconcileGoalSeconds {
		verdict = fmt.Sprintf("NOT reached (%.1fx over)", at/ReconcileGoalSeconds)
	}
	fmt.Fprintf(w, "model: incremental %.1f us per changed coupon (median seconds over coupons examined, its fixed cost included); "+
		"full %.2f us per coupon\n", perCoupon*1e6, median(full)/float64(max(1, r.Base.Coupons))*1e6)
	fmt.Fprintf(w, "goal: at 10x this history (%d coupons) with 1%% changed (%d coupons), incremental %.0f s against %d s: %s; a full pass %.0f s\n",
		tenN, k, at, ReconcileGoalSeconds, verdict, median(full)/float64(max(1, r.Base.Coupons))*float64(tenN))
	fmt.Fprintf(w, "at the probe's scale, 10x 20M (200,000,000 coupons, 1%% changed: 2,000,000), by the same rate: incremental %.0f s "+
		"(the rate holds while the probed indexes stay in memory; a history smaller than the cache gives a floor, not a verdict: "+
		"docs/performance.md measures it at 20M)\n", perCoupon*2_000_000)
	return nil
}

// WritePruneTable writes the prune turns, the A/A and beside/alone spreads and the goal lines.
func WritePruneTable(w io.Writer, p PruneJobs) error {
	fmt.Fprintf(w, "%s (outbox prune's package and defaults: %d rows a statement, a %s pause; --older-than %s; backlog %d sent rows)\n",
		PruneTable, outbox.PruneBatch, opsverbs.PrunePause, p.OlderThan, p.Backlog)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "turn\tkind\tissued/s\tp99 ms\trate ratio\tp99 ratio\trows pruned\trows/s\tWAL bytes/row (prune)\tWAL bytes/row (turn, issuance incl.)\tload\trules\t")
	var aa, ratio, p99, wal, rows []float64
	for _, t := range p.Turns {
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.1f\t%s\t%s\t%d\t%s\t%s\t%s\t%.2f\t%s\t\n", t.Turn, t.Kind, t.Rate, t.P99Ms,
			orDash(t.RateRatio, 2), orDash(t.P99Ratio, 2), t.Pruned, orDash(t.PrunedPerSec, 0), orDash(t.WALPerRow, 0),
			orDash(t.TurnWALPerRow, 0), t.Load1, t.Rules)
		switch {
		case t.Kind == PruneAlone && t.RateRatio > 0:
			aa = append(aa, t.RateRatio)
		case t.Kind == PruneBeside:
			ratio, p99, rows = append(ratio, t.RateRatio), append(p99, t.P99Ratio), append(rows, t.PrunedPerSec)
			if t.WALPerRow >= 0 {
				wal = append(wal, t.WALPerRow)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "ratios: beside over the mean of the alone turns around it; the second alone turn of a round over the first (A/A)")
	fmt.Fprintf(w, "A/A (alone after alone, a beside between): %s; beside / alone: %s, p99 %s; rows pruned/s %s\n",
		spread(aa, 2), spread(ratio, 2), spread(p99, 2), spread(rows, 0))
	walVerdict := "not measured (no pg_stat_statements)"
	if len(wal) > 0 {
		walVerdict = fmt.Sprintf("%s bytes: %s", spread(wal, 0), met(median(wal) <= PruneGoalWALPerRow))
	}
	fmt.Fprintf(w, "goal: WAL per pruned row <= %d bytes: %s\n", PruneGoalWALPerRow, walVerdict)
	fmt.Fprintf(w, "goal: issuance beside the prune at %.1fx or better: median %.2f: %s (the A/A spread above is the noise)\n",
		PruneGoalRatio, median(ratio), met(median(ratio) >= PruneGoalRatio))
	return nil
}

// orDash is f with prec decimals, "-" when f is 0 or less (not measured).
func orDash(f float64, prec int) string {
	if f <= 0 {
		return "-"
	}
	return fmtFloat(f, prec)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
