package hotbench

import (
	"fmt"
	"io"
	"time"
)

// replicaCPU runs load and returns the core-milliseconds the read pool's replica used
// meanwhile (Config.ReplicaCPU; 0 without it), or the first error.
func (s *session) replicaCPU(load func() error) (float64, error) {
	if s.cfg.ReplicaCPU == nil {
		return 0, load()
	}
	before, err := s.cfg.ReplicaCPU()
	if err != nil {
		return 0, err
	}
	if err := load(); err != nil {
		return 0, err
	}
	after, err := s.cfg.ReplicaCPU()
	return float64(after-before) / float64(time.Millisecond), err
}

// addTurnCPU notes the database server's core-ms per coupon of turn t, alone or beside.
func (r *DryRunResult) addTurnCPU(t dryTurn, beside bool) {
	if t.issued == 0 || t.pgMs == 0 {
		return
	}
	perCoupon := t.pgMs / float64(t.issued)
	if beside {
		r.PGBeside = append(r.PGBeside, perCoupon)
	} else {
		r.PGAlone = append(r.PGAlone, perCoupon)
	}
}

// ReadPoolTable heads the table `bench --dry-runs --read-pool` adds: the hot campaign's cost on
// the primary beside the herd of dry runs that a streaming replica answers.
const ReadPoolTable = "dry runs on a streaming replica: the primary's CPU"

// writeReadPool writes, when a replica answered the dry runs (Report.ReadPool), one row per
// dry-run cell: the primary's core-ms per coupon in each turn alone and beside the herd, the
// ratio of their medians (issue 42's goal: within 10%), the primary's core-ms per dry run, and
// the replica's.
func writeReadPool(w io.Writer, format string, rep Report) error {
	if !rep.ReadPool || !rep.ServerCPU || len(rep.DryRuns) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, ReadPoolTable)
	rows := [][]string{{"rtt", "clients", "dry-run clients", "primary PG core-ms per coupon alone", "beside",
		"beside / alone", "primary PG core-ms per dry run", "replica core-ms per dry run"}}
	for _, r := range rep.DryRuns {
		ratio := ""
		if a := median(r.PGAlone); a > 0 {
			ratio = fmtFloat(median(r.PGBeside)/a, 2)
		}
		rows = append(rows, []string{rttLabel(r.RTT), fmt.Sprint(r.Clients), fmt.Sprint(r.Herd), coreMsList(r.PGAlone),
			coreMsList(r.PGBeside), ratio, fmtFloat(r.PGPerDryRun, 3), fmtFloat(r.ReplicaPerDryRun, 3)})
	}
	return writeRows(w, format, rows, "|---|---:|---:|---:|---:|---:|---:|---:|")
}

// coreMsList is core-ms figures with three decimals in brackets, "[0.312 0.298 0.305]": a
// cell's turns.
func coreMsList(ms []float64) string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = fmtFloat(m, 3)
	}
	return fmt.Sprint(out)
}
