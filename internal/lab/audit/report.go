package audit

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/mops/coupon-api/internal/lab/answerlog"
	"github.com/mops/coupon-api/internal/ops/reconcile"
)

// Report is the audit's outcome.
type Report struct {
	// Answers is the log's length; From and To the first and last send times.
	Answers  int
	From, To time.Time
	// Codes are the answers by [Label], most frequent first.
	Codes []CodeRow
	// Indeterminate are the indeterminate answers by [Label], with whether their pair holds a
	// coupon now.
	Indeterminate []IndeterminateRow
	// Checks are the answer checks, in the package comment's order.
	Checks []Check
	// Invariants is the rules' report from the tables.
	Invariants reconcile.Report
}

// CodeRow is one answer label's count and latency.
type CodeRow struct {
	Label         string
	Count         int
	P50, P99, Max time.Duration
	// Late is how many came after the answer bound.
	Late int
}

// IndeterminateRow is one indeterminate label's count, and how many of those answers' (campaign,
// member) pairs hold a live coupon now.
type IndeterminateRow struct {
	Label               string
	Count, CouponExists int
}

// Check is one check's outcome: how many things it checked, how many failed, and the lines that
// say which (at most [maxExamples]; Omitted counts the others).
type Check struct {
	Name     string
	Unit     string // what Checked and Failed count: answers, refusals, coupons
	Checked  int
	Failed   int
	Examples []string
	Omitted  int
	// Note says what the check accepted without an answer, such as the coupons a grant wrote.
	Note string `json:",omitempty"`
}

// fail counts one failure and its line.
func (c *Check) fail(format string, args ...any) {
	c.Failed++
	c.line(format, args...)
}

// line adds a line about failures already counted.
func (c *Check) line(format string, args ...any) {
	if len(c.Examples) == maxExamples {
		c.Omitted++
		return
	}
	c.Examples = append(c.Examples, fmt.Sprintf(format, args...))
}

// Violations lists every failed check with its lines, then the rules the tables break; empty
// means the log and the tables agree.
func (r Report) Violations() []string {
	var v []string
	for _, c := range r.Checks {
		if c.Failed == 0 {
			continue
		}
		v = append(v, fmt.Sprintf("%s: %d of %d %s failed", c.Name, c.Failed, c.Checked, c.Unit))
		for _, e := range c.Examples {
			v = append(v, "  "+e)
		}
		if c.Omitted > 0 {
			v = append(v, fmt.Sprintf("  ... and %d more lines", c.Omitted))
		}
	}
	return append(v, r.Invariants.Violations()...)
}

// Write prints the answers by code, the indeterminate ones, each check and the invariant report;
// the verdict is the caller's ([Report.Violations]).
func (r Report) Write(w io.Writer) {
	fmt.Fprintf(w, "Answers: %d, sent %s .. %s\n", r.Answers, r.From.Format("15:04:05.000"), r.To.Format("15:04:05.000"))
	fmt.Fprintf(w, "  %-26s %8s %9s %9s %9s %8s\n", "answer", "count", "p50 ms", "p99 ms", "max ms", "late")
	for _, c := range r.Codes {
		fmt.Fprintf(w, "  %-26s %8d %9.1f %9.1f %9.1f %8d\n", c.Label, c.Count, msOf(c.P50), msOf(c.P99), msOf(c.Max), c.Late)
	}
	if len(r.Indeterminate) > 0 {
		fmt.Fprintln(w, "Indeterminate answers (the caller cannot know whether a coupon was written), by what the tables hold now:")
		fmt.Fprintf(w, "  %-26s %8s %14s %10s\n", "answer", "count", "pair's coupon", "no coupon")
		for _, c := range r.Indeterminate {
			fmt.Fprintf(w, "  %-26s %8d %14d %10d\n", c.Label, c.Count, c.CouponExists, c.Count-c.CouponExists)
		}
	}
	fmt.Fprintln(w, "Checks:")
	for _, c := range r.Checks {
		verdict := "ok  "
		if c.Failed > 0 {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "  %s %-86s %7d %s, %d failed\n", verdict, c.Name, c.Checked, c.Unit, c.Failed)
		if c.Note != "" {
			fmt.Fprintf(w, "       %s\n", c.Note)
		}
	}
	fmt.Fprintln(w, "Invariants (SQL on the tables):")
	r.Invariants.Write(w)
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// codeRows counts the answers by label, with latency percentiles (nearest rank) and how many
// came after bound; most frequent first.
func codeRows(answers []answerlog.Answer, bound time.Duration) []CodeRow {
	lat := map[string][]time.Duration{}
	for _, a := range answers {
		lat[Label(a)] = append(lat[Label(a)], a.Latency())
	}
	rows := make([]CodeRow, 0, len(lat))
	for label, l := range lat {
		slices.Sort(l)
		row := CodeRow{Label: label, Count: len(l), P50: rank(l, 50), P99: rank(l, 99), Max: l[len(l)-1]}
		for _, d := range l {
			if d > bound {
				row.Late++
			}
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b CodeRow) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Label, b.Label))
	})
	return rows
}

// rank is the p-th percentile of sorted, nearest rank.
func rank(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

// indeterminateRows counts the indeterminate answers by label and whether their pair holds a
// live coupon in t.
func indeterminateRows(answers []answerlog.Answer, t tables) []IndeterminateRow {
	byLabel := map[string]*IndeterminateRow{}
	var rows []IndeterminateRow
	for _, a := range answers {
		if Classify(a.Status, a.Result) != Indeterminate {
			continue
		}
		row := byLabel[Label(a)]
		if row == nil {
			row = &IndeterminateRow{Label: Label(a)}
			byLabel[Label(a)] = row
		}
		row.Count++
		if len(t.byPair[pairOf(a)]) > 0 {
			row.CouponExists++
		}
	}
	for _, row := range byLabel {
		rows = append(rows, *row)
	}
	slices.SortFunc(rows, func(a, b IndeterminateRow) int { return cmp.Compare(a.Label, b.Label) })
	return rows
}
